"""How ranges reach onnxruntime's quantizer (``analysis/calibration/quantize.py``): the arguments
``quantize_static`` is given (seen by a spy that then runs the real one), the power-of-two weight
overrides worked out by hand, the opset conversion and every refusal."""

from __future__ import annotations

import inspect
import json
import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime.quantization as oq
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

from pytest_qaccuracy.analysis.calibration import quantize as Q
from pytest_qaccuracy.analysis.calibration.options import CalibrationOptions, CalibrationResult
from pytest_qaccuracy.errors import InputError

HAS_CACHE = "calibration_cache_path" in inspect.signature(oq.quantize_static).parameters


def _mlp(path: Path, opset: int = 17, width: int = 3) -> Path:
    """x[N, 4] -> MatMul (w1) -> h -> Relu -> r -> Gemm (w2, b2) -> y[N, 2]; ``width`` hidden units."""
    rng = np.random.default_rng(2)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="gemm"),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
        [
            numpy_helper.from_array(rng.standard_normal((4, width)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.standard_normal((width, 2)).astype(np.float32), "w2"),
            numpy_helper.from_array(np.array([0.5, -0.25], np.float32), "b2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


RANGES = {"x": (-2.0, 3.0), "h": (-4.0, 5.0), "r": (0.0, 5.0), "y": (-6.0, 6.0)}


@pytest.fixture
def spy(monkeypatch):
    """quantize_static replaced by a spy that records its arguments (and what it can only see during
    the call: the root logger's level, the private copy, the cache file), then runs the real one."""
    calls: list[dict] = []
    real = oq.quantize_static

    def quantize_static(model_input, model_output, calibration_data_reader=None, **kwargs):
        seen = {"model_input": Path(model_input), "reader": calibration_data_reader, **kwargs}
        seen["level"] = logging.getLogger().level
        seen["private"] = onnx.load(str(model_input), load_external_data=False)
        cache = kwargs.get("calibration_cache_path")
        seen["cache"] = json.loads(Path(cache).read_text()) if cache else None
        calls.append(seen)
        return real(model_input, model_output, calibration_data_reader, **kwargs)

    quantize_static.__signature__ = inspect.signature(real)  # the real one's parameters
    monkeypatch.setattr(oq, "quantize_static", quantize_static)
    return calls


def _inits(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


@pytest.mark.skipif(not HAS_CACHE, reason="onnxruntime < 1.19's quantize_static takes no calibration cache")
def test_the_ranges_go_as_a_min_max_calibration_cache(tmp_path, spy):
    model = _mlp(tmp_path / "mlp.onnx")
    options = CalibrationOptions(activation_type="int8", weight_type="int8", per_channel=True)
    out = Q.quantize_with_ranges(model, tmp_path / "q.onnx", CalibrationResult("minmax", 4, RANGES), options, ["gemm"])
    assert out == tmp_path / "q.onnx" and out.is_file()
    (call,) = spy
    assert call["reader"] is None
    assert call["quant_format"] == QuantFormat.QDQ and call["per_channel"] is True and call["reduce_range"] is False
    assert call["activation_type"] == QuantType.QInt8 and call["weight_type"] == QuantType.QInt8
    assert call["nodes_to_exclude"] == ["gemm"] and call["calibrate_method"] == CalibrationMethod.MinMax
    assert call["extra_options"] == {"TensorQuantOverrides": {}}
    assert call["model_input"].parent != model.parent and call["model_input"].name == "mlp.onnx"
    cache = call["cache"]
    # onnxruntime's TensorsData as JSON: each tensor's lowest and highest, as float32
    data = {name: (d["lowest"], d["highest"]) for name, d in cache["data"].items()}
    assert data == RANGES and "MinMax" in json.dumps(cache["calibration_method"])
    inits = _inits(out)
    # x's range (-2, 3) in int8: scale 5 / 255, zero point -128 + 2 / (5 / 255) = -26
    assert inits["x_scale"] == np.float32(5.0 / 255) and inits["x_zero_point"] == np.int8(-26)
    assert inits["w1_scale"].shape == (3,)  # per channel
    assert "gemm" in {n.name for n in onnx.load(str(out)).graph.node}  # excluded: left in float


def test_the_overrides_carry_the_ranges_after_onnxruntimes_rules(tmp_path, spy):
    model = _mlp(tmp_path / "mlp.onnx")
    result = CalibrationResult("minmax", 4, {**RANGES, "w1": (-9.0, 9.0)})
    out = Q.quantize_with_ranges(model, tmp_path / "q.onnx", result, CalibrationOptions(), via="overrides")
    (call,) = spy
    assert isinstance(call["reader"], Q._ZeroRecord) and "calibration_cache_path" not in call
    overrides = call["extra_options"]["TensorQuantOverrides"]
    # the Relu's single-consumer input takes the output's range; the weight is no activation
    assert overrides == {
        "x": [{"rmin": np.float32(-2.0), "rmax": np.float32(3.0)}],
        "h": [{"rmin": np.float32(0.0), "rmax": np.float32(5.0)}],
        "r": [{"rmin": np.float32(0.0), "rmax": np.float32(5.0)}],
        "y": [{"rmin": np.float32(-6.0), "rmax": np.float32(6.0)}],
    }
    assert all(type(e[0]["rmin"]) is np.float32 for e in overrides.values())
    assert call["activation_type"] == QuantType.QUInt8 and call["weight_type"] == QuantType.QInt8
    assert call["per_channel"] is False and call["nodes_to_exclude"] == []
    assert _inits(out)["x_scale"] == np.float32(5.0 / 255)


def test_extra_overrides_are_merged_entry_by_entry(tmp_path, monkeypatch):
    """Seen by a stand-in quantizer (two entries for a three-channel weight are for the merge only)."""
    model = _mlp(tmp_path / "mlp.onnx")
    calls = []

    def stand_in(model_input, model_output, calibration_data_reader=None, **kwargs):
        calls.append(kwargs)
        Path(model_output).write_bytes(b"written")

    stand_in.__signature__ = inspect.signature(oq.quantize_static)
    monkeypatch.setattr(oq, "quantize_static", stand_in)
    extra = {
        "h": [{"quant_type": QuantType.QUInt16}],
        "w1": [{"quant_type": QuantType.QInt8, "axis": 1}, {"scale": np.float32(0.5)}],
    }
    out = Q.quantize_with_ranges(
        model,
        tmp_path / "q.onnx",
        CalibrationResult("minmax", 4, RANGES),
        CalibrationOptions(),
        via="overrides",
        overrides=extra,
    )
    assert out.read_bytes() == b"written"
    overrides = calls[0]["extra_options"]["TensorQuantOverrides"]
    assert overrides["h"] == [{"rmin": np.float32(0.0), "rmax": np.float32(5.0), "quant_type": QuantType.QUInt16}]
    assert overrides["w1"] == [{"quant_type": QuantType.QInt8, "axis": 1}, {"scale": np.float32(0.5)}]
    assert overrides["x"] == [{"rmin": np.float32(-2.0), "rmax": np.float32(3.0)}]
    assert extra["h"] == [{"quant_type": QuantType.QUInt16}]  # the caller's overrides are not changed


def test_power2_adds_the_weight_scales_and_keeps_them(tmp_path, spy):
    model = _mlp(tmp_path / "mlp.onnx")
    options = CalibrationOptions(power2=True)
    out = Q.quantize_with_ranges(model, tmp_path / "q.onnx", CalibrationResult("minmax", 4, RANGES), options)
    extra = spy[0]["extra_options"]
    assert extra["QDQDisableWeightAdjustForInt32Bias"] is True
    assert set(extra["TensorQuantOverrides"]) >= {"w1", "w2"}
    inits = _inits(out)
    for weight in ("w1", "w2"):
        scale = float(inits[f"{weight}_scale"])
        assert scale == 2.0 ** np.round(np.log2(scale))  # a power of two
        assert extra["TensorQuantOverrides"][weight][0]["scale"] == np.float32(scale)


def test_reduce_range_and_formats_reach_the_quantizer(tmp_path, spy):
    model = _mlp(tmp_path / "mlp.onnx")
    result = CalibrationResult("minmax", 4, RANGES)
    Q.quantize_with_ranges(
        model,
        tmp_path / "q.onnx",
        result,
        CalibrationOptions(quant_format="qoperator", weight_type="uint8"),
        reduce_range=True,
    )
    call = spy[0]
    assert call["quant_format"] == QuantFormat.QOperator and call["reduce_range"] is True
    assert call["weight_type"] == QuantType.QUInt8
    assert "QLinearMatMul" in {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}


def test_a_model_written_while_choosing_is_reused_only_for_the_same_plain_arguments(tmp_path, spy):
    """``result.model`` is copied when it was written from this model with these options and
    exclusions; reduce_range, extra overrides or other exclusions quantize again."""
    from pytest_qaccuracy.analysis.calibration.options import written_key

    model = _mlp(tmp_path / "mlp.onnx")
    options = CalibrationOptions()
    payload = b"the model auto wrote"
    result = CalibrationResult("auto", 4, RANGES, model=payload, model_key=written_key(model, options, None))
    out = Q.quantize_with_ranges(model, tmp_path / "a.onnx", result, options)
    assert out.read_bytes() == payload and spy == []
    Q.quantize_with_ranges(model, tmp_path / "b.onnx", result, options, reduce_range=True)
    assert len(spy) == 1
    Q.quantize_with_ranges(model, tmp_path / "c.onnx", result, options, overrides={"h": [{}]})
    assert len(spy) == 2
    Q.quantize_with_ranges(model, tmp_path / "d.onnx", result, options, ["mm"])
    assert len(spy) == 3
    assert Q.quantize_with_ranges(model, tmp_path / "e.onnx", result).read_bytes() == payload  # default options


def test_the_root_logger_is_quiet_during_the_call_and_restored(tmp_path, spy):
    model = _mlp(tmp_path / "mlp.onnx")
    root = logging.getLogger()
    before = root.level
    try:
        for level, during in ((logging.DEBUG, logging.ERROR), (logging.CRITICAL, logging.CRITICAL)):
            root.setLevel(level)
            Q.quantize_with_ranges(model, tmp_path / "q.onnx", CalibrationResult("minmax", 4, RANGES))
            assert spy[-1]["level"] == during and root.level == level
    finally:
        root.setLevel(before)


@pytest.mark.parametrize("error", [ValueError, KeyError, RuntimeError])
def test_a_quantizer_failure_is_one_input_error_and_the_level_is_restored(tmp_path, monkeypatch, error):
    model = _mlp(tmp_path / "mlp.onnx")

    def fail(*args, **kwargs):
        raise error("no can do")

    if not HAS_CACHE:
        fail.__signature__ = inspect.signature(oq.quantize_static)
    monkeypatch.setattr(oq, "quantize_static", fail)
    root = logging.getLogger()
    before = root.level
    root.setLevel(logging.INFO)
    try:
        with pytest.raises(InputError) as info:
            Q.quantize_with_ranges(model, tmp_path / "q.onnx", CalibrationResult("minmax", 4, RANGES))
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)
    assert str(info.value) == f"{model}: onnxruntime could not quantize the model ({error('no can do')})"
    assert not (tmp_path / "q.onnx").exists()


def test_other_quantizer_errors_are_not_hidden(tmp_path, monkeypatch):
    model = _mlp(tmp_path / "mlp.onnx")

    def fail(*args, **kwargs):
        raise TypeError("a bug")

    if not HAS_CACHE:
        fail.__signature__ = inspect.signature(oq.quantize_static)
    monkeypatch.setattr(oq, "quantize_static", fail)
    with pytest.raises(TypeError, match="a bug"):
        Q.quantize_with_ranges(model, tmp_path / "q.onnx", CalibrationResult("minmax", 4, RANGES))


def test_the_way_of_handing_ranges_is_checked(tmp_path, monkeypatch):
    model = _mlp(tmp_path / "mlp.onnx")
    result = CalibrationResult("minmax", 4, RANGES)
    with pytest.raises(InputError) as info:
        Q.quantize_with_ranges(model, tmp_path / "q.onnx", result, via="Cache")
    assert str(info.value) == "unknown way to hand ranges to onnxruntime 'Cache'; expected auto, cache or overrides"
    calls = []

    def old(model_input, model_output, calibration_data_reader, **kwargs):  # no calibration_cache_path
        calls.append((calibration_data_reader, kwargs))

    monkeypatch.setattr(oq, "quantize_static", old)
    with pytest.raises(InputError) as info:
        Q.quantize_with_ranges(model, tmp_path / "q.onnx", result, via="cache")
    assert str(info.value) == "this onnxruntime's quantize_static takes no calibration_cache_path; use via='overrides'"
    assert calls == []
    with pytest.raises(FileNotFoundError):  # the stand-in writes nothing: reading its output fails after the call
        Q.quantize_with_ranges(model, tmp_path / "q.onnx", result)
    ((reader, kwargs),) = calls
    assert isinstance(reader, Q._ZeroRecord) and "calibration_cache_path" not in kwargs
    assert kwargs["extra_options"]["TensorQuantOverrides"]["x"] == [{"rmin": np.float32(-2.0), "rmax": np.float32(3.0)}]


def test_a_large_model_is_handed_over_with_its_tensors_in_a_side_file(tmp_path, spy, monkeypatch):
    model = _mlp(tmp_path / "mlp.onnx", width=300)  # w1 and w2 above onnx's 1 KiB external-data threshold
    Q.quantize_with_ranges(model, tmp_path / "small.onnx", CalibrationResult("minmax", 4, RANGES))
    assert not any(t.data_location == TensorProto.EXTERNAL for t in spy[0]["private"].graph.initializer)
    monkeypatch.setattr(Q, "LARGE_MODEL_BYTES", onnx.load(str(model)).ByteSize())  # not above: inline
    Q.quantize_with_ranges(model, tmp_path / "edge.onnx", CalibrationResult("minmax", 4, RANGES))
    assert not any(t.data_location == TensorProto.EXTERNAL for t in spy[1]["private"].graph.initializer)
    spy.clear()
    monkeypatch.setattr(Q, "LARGE_MODEL_BYTES", 16)
    out = Q.quantize_with_ranges(model, tmp_path / "large.onnx", CalibrationResult("minmax", 4, RANGES))
    assert any(t.data_location == TensorProto.EXTERNAL for t in spy[0]["private"].graph.initializer)
    assert _inits(out).keys() == _inits(tmp_path / "small.onnx").keys()


# --- the opset -------------------------------------------------------------------------------------


def test_opset_note_only_for_per_channel_below_13(tmp_path):
    old = onnx.load(str(_mlp(tmp_path / "m11.onnx", opset=11)))
    new = onnx.load(str(_mlp(tmp_path / "m13.onnx", opset=13)))
    per_channel = CalibrationOptions(per_channel=True)
    assert Q.opset_note(old, per_channel) == (
        "per-channel weights need DequantizeLinear's axis (opset 13): "
        "the model is converted from opset 11 to 13 before quantization"
    )
    assert Q.opset_note(old, CalibrationOptions()) is None
    assert Q.opset_note(new, per_channel) is None
    twelve = onnx.load(str(_mlp(tmp_path / "m12.onnx", opset=12)))
    assert "from opset 12 to 13" in Q.opset_note(twelve, per_channel)


def test_with_opset_for_converts_only_when_needed(tmp_path, caplog):
    old = onnx.load(str(_mlp(tmp_path / "m11.onnx", opset=11)))
    same, converted = Q.with_opset_for(old, CalibrationOptions())
    assert same is old and converted is False
    with caplog.at_level(logging.INFO, logger=Q.__name__):
        upgraded, converted = Q.with_opset_for(old, CalibrationOptions(per_channel=True))
    assert converted is True and [o.version for o in upgraded.opset_import if o.domain in ("", "ai.onnx")] == [13]
    assert caplog.messages == [Q.opset_note(old, CalibrationOptions(per_channel=True))]


def test_with_opset_for_refuses_a_model_the_checker_rejects_after_conversion(tmp_path, monkeypatch):
    from onnx import version_converter

    old = onnx.load(str(_mlp(tmp_path / "m11.onnx", opset=11)))

    def broken(model, version):
        out = onnx.ModelProto()
        out.CopyFrom(model)
        out.graph.node[0].input[1] = "nowhere"
        return out

    monkeypatch.setattr(version_converter, "convert_version", broken)
    with pytest.raises(InputError) as info:
        Q.with_opset_for(old, CalibrationOptions(per_channel=True), "my.onnx")
    message = str(info.value)
    assert message.startswith(
        "my.onnx: per-channel weights need opset 13 (DequantizeLinear axis), and onnx cannot convert this "
        "opset 11 model ("
    )
    assert message.endswith("); convert it, or quantize per tensor") and "\n" not in message

    def empty(model, version):
        raise RuntimeError("")

    monkeypatch.setattr(version_converter, "convert_version", empty)
    with pytest.raises(InputError, match=r"^model: per-channel .* opset 11 model \(RuntimeError\); convert it"):
        Q.with_opset_for(old, CalibrationOptions(per_channel=True))


def test_a_converted_model_is_handed_over_under_its_own_name(tmp_path, spy):
    model = _mlp(tmp_path / "m11.onnx", opset=11)
    out = Q.quantize_with_ranges(
        model, tmp_path / "q.onnx", CalibrationResult("minmax", 4, RANGES), CalibrationOptions(per_channel=True)
    )
    assert spy[0]["model_input"].name == "opset13.m11.onnx"
    assert [o.version for o in spy[0]["private"].opset_import if o.domain in ("", "ai.onnx")] == [13]
    assert [o.version for o in onnx.load(str(out)).opset_import if o.domain in ("", "ai.onnx")] == [13]


# --- power-of-two weights, worked out by hand ------------------------------------------------------


def _weights_model(weights: dict[str, np.ndarray], nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "w", [], [], [numpy_helper.from_array(w, name) for name, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


WEIGHTS = {
    # Conv: per channel along axis 0. max |w| 0.25 -> 2^-8 (0.25 / 127 = 2^-8.99); 63.5 = 127 * 2^-1
    # exactly -> 2^-1; all zero -> 1
    "wc": np.array([0.25, -0.125, -63.5, 1.0, 0.0, 0.0], np.float32).reshape(3, 1, 1, 2),
    # ConvTranspose: per channel along axis 1: [1, -3] -> 3 / 127 -> 2^-5; [0.5, 0.25] -> 2^-7
    "wt": np.array([[[[1.0, -3.0]], [[0.5, 0.25]]]], np.float32),
    "wm": np.array([[0.5, -3.0], [1.0, 2.0]], np.float32),  # 3 / 127 -> 2^-5
    "wg": np.array([[100.0, 1.0]], np.float32),  # 100 / 127 -> 2^0
    "wi": np.array([[1, 2]], np.int32),
}
NODES = [
    helper.make_node("Conv", ["x", "wc"], ["c"]),
    helper.make_node("ConvTranspose", ["x", "wt"], ["t"]),
    helper.make_node("MatMul", ["x", "wm"], ["m"]),
    helper.make_node("MatMul", ["z", "wm"], ["m2"]),  # the same weight again: one entry
    helper.make_node("Gemm", ["x", "wg"], ["g"]),
    helper.make_node("MatMul", ["x", "m"], ["mm"]),  # a computed second input: no weight
    helper.make_node("MatMul", ["x", "wi"], ["mi"]),  # an integer constant: no float weight
    helper.make_node("MatMul", ["x"], ["broken"]),
    helper.make_node("Mul", ["x", "wg"], ["not a weight slot"]),
]


def test_power2_weight_overrides_int8_per_channel():
    model = _weights_model(WEIGHTS, NODES)
    got = Q._power2_weight_overrides(model, CalibrationOptions(power2=True, per_channel=True), "QT")
    assert list(got) == ["wc", "wt", "wm", "wg"]

    def entries(*scales, axis=None):
        out = [{"scale": np.float32(s), "zero_point": np.int8(0)} for s in scales]
        out[0]["quant_type"] = "QT"
        if axis is not None:
            out[0]["axis"] = axis
        return out

    assert got["wc"] == entries(2.0**-8, 2.0**-1, 1.0, axis=0)
    assert got["wt"] == entries(2.0**-5, 2.0**-7, axis=1)
    assert got["wm"] == entries(2.0**-5)
    assert got["wg"] == entries(1.0)
    for values in got.values():
        assert all(type(e["scale"]) is np.float32 and type(e["zero_point"]) is np.int8 for e in values)


def test_power2_weight_overrides_per_tensor_take_the_whole_weight():
    model = _weights_model(WEIGHTS, NODES[:1])
    got = Q._power2_weight_overrides(model, CalibrationOptions(power2=True), QuantType.QInt8)
    assert got == {"wc": [{"scale": np.float32(0.5), "zero_point": np.int8(0), "quant_type": QuantType.QInt8}]}
    one = _weights_model({"wc": WEIGHTS["wc"][:1]}, NODES[:1])  # one channel: no axis
    got = Q._power2_weight_overrides(one, CalibrationOptions(power2=True, per_channel=True), "QT")
    assert got == {"wc": [{"scale": np.float32(2.0**-8), "zero_point": np.int8(0), "quant_type": "QT"}]}


def test_power2_weight_overrides_uint8_are_asymmetric_power_of_two_grids():
    """[-1, 3]: 4 / 255 -> k = -5, z = ceil(1 / 2^-5) = 32 steps below zero, (255 - 32) / 32 >= 3: the
    range (-1, 6.96875), scale 2^-5, zero point 32. [0.5, 1]: the range holds 0: 1 / 255 -> 2^-7, z = 0.
    All zero: scale 1, zero point 0."""
    weights = {
        "a": np.array([[-1.0, 3.0]], np.float32),
        "b": np.array([[0.5, 1.0]], np.float32),
        "z": np.zeros((1, 2), np.float32),
        "n": np.array([[-2.0, -0.5]], np.float32),
    }
    nodes = [helper.make_node("MatMul", ["x", name], [f"o{name}"]) for name in weights]
    got = Q._power2_weight_overrides(_weights_model(weights, nodes), CalibrationOptions(weight_type="uint8"), "U")

    def entry(scale, zero):
        return [{"scale": np.float32(scale), "zero_point": np.uint8(zero), "quant_type": "U"}]

    # [-2, -0.5]: the range holds 0: 2 / 255 -> k = -6, z = ceil(2 / 2^-6) = 128, (255 - 128) * 2^-6 >= 0
    assert got == {"a": entry(2.0**-5, 32), "b": entry(2.0**-7, 0), "z": entry(1.0, 0), "n": entry(2.0**-6, 128)}
    assert all(type(e[0]["zero_point"]) is np.uint8 for e in got.values())


# --- the one all-zero record ---------------------------------------------------------------------------


def test_zero_record_is_one_all_zero_record_of_every_input():
    graph = helper.make_graph(
        [],
        "inputs",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 0]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [2, 5]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [4]),
        ],
        [],
        [numpy_helper.from_array(np.ones(4, np.float32), "w")],
    )
    reader = Q._ZeroRecord(helper.make_model(graph))
    record = reader.get_next()
    assert list(record) == ["x", "i"]
    assert record["x"].shape == (1, 3, 1) and record["x"].dtype == np.float32 and not record["x"].any()
    assert record["i"].shape == (2, 5) and record["i"].dtype == np.int64 and not record["i"].any()
    assert reader.get_next() is None and reader.get_next() is None


def test_power2_weight_overrides_of_an_empty_weight_take_scale_one():
    model = _weights_model({"e": np.zeros((0, 2), np.float32)}, [helper.make_node("MatMul", ["x", "e"], ["o"])])
    got = Q._power2_weight_overrides(model, CalibrationOptions(power2=True), "QT")
    assert got == {"e": [{"scale": np.float32(1.0), "zero_point": np.int8(0), "quant_type": "QT"}]}


@pytest.mark.skipif(not HAS_CACHE, reason="onnxruntime < 1.19's quantize_static takes no calibration cache")
def test_via_cache_hands_the_ranges_as_the_cache(tmp_path, spy):
    model = _mlp(tmp_path / "mlp.onnx")
    Q.quantize_with_ranges(model, tmp_path / "q.onnx", CalibrationResult("minmax", 4, RANGES), via="cache")
    assert spy[0]["reader"] is None and spy[0]["cache"]["data"]["x"]["highest"] == 3.0
    assert spy[0]["extra_options"] == {"TensorQuantOverrides": {}}
