"""Layer sums computed inside onnxruntime (one merged graph) against the whole-tensor path in numpy.

Tolerance, stated once: every sum over a record agrees to a relative 1e-5 (float32 partial sums
of at most 1024 and 4096 elements, in a different order, added in float64), so the metrics
built on sums agree to a relative 1e-5, SQNR to 1e-4 dB and cosine's distance from 1 to a relative
1e-3 or 1e-8 absolute (float32 rounding of the products: about 1e-7 of ||f - q||^2 / ||f||^2);
maxima, step counts, saturation counts and channel ranges are exact.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from modelzoo import write_h5
from onnx import TensorProto, helper, numpy_helper

import pytest_qaccuracy.analysis.compare as compare_module
from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.metrics import available_metrics, register_metric, unregister_metric
from pytest_qaccuracy.metrics.error import MSE
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import RuntimeOptions
from pytest_qaccuracy.runtime.reduction_graph import ReductionUnavailable, float32_at_least, merged_opsets

SUM_RTOL = 1e-5
EXACT = ("max_abs", "lsb", "mpeir", "clipped")


def _plain(monkeypatch, *args, **kwargs):
    """The comparison on the whole-tensor path (the merged graph never built)."""
    with monkeypatch.context() as m:
        m.setattr(compare_module, "start_reduced", lambda *a: (None, "numpy: forced"))
        return compare(*args, **kwargs)


def _assert_same(reduced, plain) -> None:
    assert reduced.reduction.startswith("onnxruntime:")
    assert [x.tensor for x in reduced.layers] == [x.tensor for x in plain.layers]
    assert [o.to_dict() for o in reduced.outputs] == [o.to_dict() for o in plain.outputs]
    checked = set()
    for a, b in zip(reduced.layers, plain.layers, strict=True):
        assert a.undefined == b.undefined, a.tensor
        assert (a.channels and a.channels.to_dict()) == (b.channels and b.channels.to_dict()), a.tensor
        for name, expected in b.metrics.items():
            value = a.metrics[name]
            assert (value is None) == (expected is None), (a.tensor, name)
            if expected is None:
                continue
            checked.add(name)
            if name in EXACT:
                assert value == expected, (a.tensor, name)
            elif name == "sqnr":
                assert value == pytest.approx(expected, abs=1e-4), a.tensor
            elif name == "cosine":
                assert 1 - value == pytest.approx(1 - expected, rel=1e-3, abs=1e-8), a.tensor
            else:
                assert value == pytest.approx(expected, rel=SUM_RTOL), (a.tensor, name)
    assert checked in (set(plain.metric_names), set(plain.metric_names) - {"srmse"})  # srmse: None per channel


@pytest.mark.parametrize("variant", ["qdq_u8", "qdq_s8_pc", "qop_u8", "qop_s8_pc"])
@pytest.mark.parametrize("capture", ["deployed", "reference"])
def test_every_metric_matches_the_whole_tensor_path(zoo, monkeypatch, variant, capture):
    pair = ModelPair(zoo["fp32"], zoo[variant])
    options = RuntimeOptions(batch_size=5)  # 12 records: batches of 5, 5 and 2
    reduced = compare(pair, zoo["data"], options=options, capture=capture)
    plain = _plain(monkeypatch, pair, zoo["data"], options=options, capture=capture)
    assert plain.reduction == "numpy: forced" and plain.metric_names == available_metrics()
    assert f"{len(reduced.layers)} of {len(reduced.layers)} layers" in reduced.reduction
    _assert_same(reduced, plain)


def _per_channel_pair(folder, opset: int = 13, per_channel: bool = True):
    """fp32: y = Relu(x * w); quantized: the product quantized per channel (axis 1, uint8, scales
    narrow enough that some values saturate), then Relu. The product is matched with per-channel
    parameters, so ``lsb`` needs per-channel steps and ``clipped`` per-channel bounds."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.uniform(0.5, 2.0, (1, 4, 1, 1)).astype(np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4, 6, 70])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 6, 70])
    f_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])], "f", [x], [y], [w]
    )
    scales, zero_points = np.array([0.01, 0.02, 0.015, 0.03], np.float32), np.array([128, 120, 135, 128], np.uint8)
    if not per_channel:
        scales, zero_points = np.array(0.02, np.float32), np.array(128, np.uint8)
    scale, zp = numpy_helper.from_array(scales, "s"), numpy_helper.from_array(zero_points, "z")
    q_graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "w"], ["t"]),
            helper.make_node("QuantizeLinear", ["t", "s", "z"], ["t_q"], axis=1),  # axis: ignored when scalar
            helper.make_node("DequantizeLinear", ["t_q", "s", "z"], ["t_dq"], axis=1),
            helper.make_node("Relu", ["t_dq"], ["y"]),
        ],
        "q",
        [x],
        [y],
        [w, scale, zp],
    )
    paths = []
    for name, graph in (("f.onnx", f_graph), ("q.onnx", q_graph)):
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        onnx.save(model, folder / name)
        paths.append(folder / name)
    data = write_h5(folder / "data.h5", rng.normal(0, 1.5, (9, 1, 4, 6, 70)).astype(np.float32))
    return paths[0], paths[1], data


def test_per_channel_steps_and_bounds_match(tmp_path, monkeypatch):
    f, q, data = _per_channel_pair(tmp_path)
    pair = ModelPair(f, q)
    reduced = compare(pair, data, options=RuntimeOptions(batch_size=4))
    plain = _plain(monkeypatch, pair, data, options=RuntimeOptions(batch_size=4))
    layer = next(x for x in reduced.layers if x.tensor == "t")
    assert layer.metrics["clipped"] > 0  # the bounds are exercised
    assert layer.metrics["lsb"] > 1  # saturated values are many steps off
    _assert_same(reduced, plain)


def test_saturation_counts_only_in_batches_that_leave_the_range(tmp_path, monkeypatch):
    # one scale for the tensor: the count runs in an If branch taken by batches whose extremes leave
    # [-2.56, 2.54]; records 4..7 stay inside, the others do not
    f, q, _ = _per_channel_pair(tmp_path, per_channel=False)
    records = np.random.default_rng(3).normal(0, 1.5, (10, 1, 4, 6, 70)).astype(np.float32)
    records[4:8] = np.clip(records[4:8], -1.0, 1.0)
    data = write_h5(tmp_path / "mixed.h5", records)
    pair = ModelPair(f, q)
    reduced = compare(pair, data, metrics="clipped,mse", options=RuntimeOptions(batch_size=4))
    plain = _plain(monkeypatch, pair, data, metrics="clipped,mse", options=RuntimeOptions(batch_size=4))
    layer = next(x for x in reduced.layers if x.tensor == "t")
    product = records * numpy_helper.to_array(onnx.load(str(f)).graph.initializer[0])
    low, high = (0 - 128 - 0.5) * 0.02, (255 - 128 + 0.5) * 0.02
    expected = np.count_nonzero((product < np.float32(low)) | (product >= np.float32(high))) / product.size
    assert layer.metrics["clipped"] == pytest.approx(expected, rel=1e-12)
    assert layer.metrics["clipped"] > 0
    _assert_same(reduced, plain)


def test_float32_at_least_gives_the_same_comparisons():
    rng = np.random.default_rng(0)
    bounds = np.concatenate([rng.normal(0, 3, 200), [0.1, -0.5, 1e-30, 3.5e38, -3.5e38]])
    with np.errstate(over="ignore"):
        edges = np.nextafter(bounds.astype(np.float32), np.float32(np.inf))
    f = np.concatenate([rng.normal(0, 3, 2000), edges])
    f = f.astype(np.float32)
    for bound in bounds:
        assert np.array_equal(f < bound, f < float32_at_least(bound))
        assert np.array_equal(f >= bound, f >= float32_at_least(bound))


def _with_opset(src, dst, version: int):
    model = onnx.load(str(src))
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    onnx.save(model, str(dst))
    return dst


def test_differing_opsets_merge_when_no_op_changes(zoo, tmp_path, monkeypatch):
    # the conv net's ops (Conv, Relu, Add, MaxPool, Concat, GlobalAveragePool, Flatten, Gemm, MatMul,
    # Sigmoid) have the same definitions at opsets 15 and 17
    fp32 = _with_opset(zoo["fp32"], tmp_path / "net15.onnx", 15)
    assert {o.version for o in onnx.load(str(zoo["qdq_u8"])).opset_import if o.domain in ("", "ai.onnx")} == {17}
    pair = ModelPair(fp32, zoo["qdq_u8"])
    reduced = compare(pair, zoo["data"])
    _assert_same(reduced, _plain(monkeypatch, pair, zoo["data"]))


def test_an_op_that_changes_between_opsets_is_converted(zoo, tmp_path, monkeypatch):
    fp32 = _with_opset(zoo["fp32"], tmp_path / "net13.onnx", 13)  # Relu and Add change at 14
    pair = ModelPair(fp32, zoo["qdq_u8"])
    reduced = compare(pair, zoo["data"])
    _assert_same(reduced, _plain(monkeypatch, pair, zoo["data"]))


def _unconvertible(monkeypatch) -> None:
    from onnx import version_converter

    def refuse(model, version):
        raise RuntimeError("no adapter (injected)")

    monkeypatch.setattr(version_converter, "convert_version", refuse)


def test_opsets_that_cannot_be_merged_fall_back_and_say_so(zoo, tmp_path, monkeypatch):
    fp32 = _with_opset(zoo["fp32"], tmp_path / "net13.onnx", 13)
    pair = ModelPair(fp32, zoo["qdq_u8"])
    plain = _plain(monkeypatch, pair, zoo["data"])
    _unconvertible(monkeypatch)
    result = compare(pair, zoo["data"])
    assert result.reduction.startswith("numpy (fallback): the models import different versions of 'ai.onnx'")
    assert "changes between opset 13 and 17, and onnx cannot convert it (no adapter (injected))" in result.reduction
    assert result.to_dict()["reduction"] == result.reduction
    assert [x.to_dict() for x in result.layers] == [x.to_dict() for x in plain.layers]  # the same path: identical
    assert [o.to_dict() for o in result.outputs] == [o.to_dict() for o in plain.outputs]


def _tiny(domain_versions: dict[str, int], ops: list[tuple[str, str]]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    nodes = [helper.make_node(op, ["x"], [f"y{i}"], domain=domain) for i, (domain, op) in enumerate(ops)]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1]) for i in range(len(ops))]
    graph = helper.make_graph(nodes, "g", [x], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in domain_versions.items()])


def test_custom_domains_merge_only_when_their_versions_agree_or_go_unused():
    same = merged_opsets(
        _tiny({"": 17, "com.microsoft": 1}, [("com.microsoft", "FusedConv")]),
        _tiny({"": 17, "com.microsoft": 1, "com.microsoft.nchwc": 1}, [("com.microsoft.nchwc", "ReorderInput")]),
    )
    assert same == {"": 17, "com.microsoft": 1, "com.microsoft.nchwc": 1}
    unused = merged_opsets(_tiny({"": 17, "com.example": 1}, []), _tiny({"": 17, "com.example": 2}, []))
    assert unused == {"": 17, "com.example": 2}
    with pytest.raises(ReductionUnavailable, match=r"Custom of domain 'com\.example' is unknown"):
        merged_opsets(
            _tiny({"": 17, "com.example": 1}, [("com.example", "Custom")]), _tiny({"": 17, "com.example": 2}, [])
        )


def test_a_first_batch_the_merged_graph_cannot_run_falls_back(zoo, monkeypatch):
    from pytest_qaccuracy.errors import ModelError
    from pytest_qaccuracy.runtime import reduction_graph

    def broken(self, feeds):
        raise ModelError("merged graph: onnxruntime failed to run (injected)")

    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    plain = _plain(monkeypatch, pair, zoo["data"])
    monkeypatch.setattr(reduction_graph.ReducedRunner, "_run", broken)
    result = compare(pair, zoo["data"])
    assert result.reduction == "numpy (fallback): merged graph: onnxruntime failed to run (injected)"
    assert [x.to_dict() for x in result.layers] == [x.to_dict() for x in plain.layers]
    assert [o.to_dict() for o in result.outputs] == [o.to_dict() for o in plain.outputs]


class _Doubled(MSE):
    name = "doubled_mse"
    formula = "2 * mse (a test metric the merged graph does not know)"

    def record_values(self, pair):
        return 2 * np.mean((pair.ref.astype(np.float64) - pair.test) ** 2, axis=tuple(range(1, pair.ref.ndim)))


def test_custom_metrics_run_on_whole_tensors(zoo, monkeypatch):
    register_metric(_Doubled)
    try:
        pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
        result = compare(pair, zoo["data"], metrics="mse,doubled_mse,sqnr")
        assert result.reduction == "numpy: no layer has only built-in metrics on float32/integer tensors"
        only_builtin = compare(pair, zoo["data"], metrics="mse,sqnr")
        assert only_builtin.reduction.startswith("onnxruntime:")
    finally:
        unregister_metric("doubled_mse")
    for layer, other in zip(result.layers, only_builtin.layers, strict=True):
        assert layer.metrics["doubled_mse"] == pytest.approx(2 * layer.metrics["mse"], rel=1e-6)
        assert other.metrics["mse"] == pytest.approx(layer.metrics["mse"], rel=SUM_RTOL)


def test_nonfinite_values_give_the_same_undefined_metrics(tmp_path, monkeypatch):
    f, q, _ = _per_channel_pair(tmp_path)
    records = np.random.default_rng(2).normal(0, 1, (4, 1, 4, 6, 70)).astype(np.float32)
    records[1, 0, 2, 3, 5] = np.nan
    data = write_h5(tmp_path / "nan.h5", records)
    pair = ModelPair(f, q)
    reduced = compare(pair, data, allow_nonfinite=True, options=RuntimeOptions(batch_size=2))
    plain = _plain(monkeypatch, pair, data, allow_nonfinite=True, options=RuntimeOptions(batch_size=2))
    for a, b in zip(reduced.layers, plain.layers, strict=True):
        assert a.undefined == b.undefined
        for name, value in b.metrics.items():
            if value is not None and not math.isnan(value):
                assert a.metrics[name] == pytest.approx(value, rel=SUM_RTOL, abs=1e-4), (a.tensor, name)
    layer = next(x for x in reduced.layers if x.tensor == "t")
    assert layer.metrics["max_abs"] is None and layer.metrics["mpeir"] is None  # NaN propagates as in numpy


def test_the_cli_says_when_the_sums_fall_back(zoo, tmp_path, capsys, monkeypatch):
    from pytest_qaccuracy.cli import main

    _unconvertible(monkeypatch)
    fp32 = _with_opset(zoo["fp32"], tmp_path / "net13.onnx", 13)
    assert main(["compare", str(fp32), str(zoo["qdq_u8"]), "--data", str(zoo["data"])]) == 0
    out = capsys.readouterr().out
    assert "note: layer sums computed in numpy (fallback): the models import different versions of 'ai.onnx'" in out
    assert main(["compare", str(zoo["fp32"]), str(zoo["qdq_u8"]), "--data", str(zoo["data"])]) == 0
    assert "note: layer sums" not in capsys.readouterr().out


def test_the_merged_graph_reduces_each_layer_before_the_models_run_on(zoo):
    from pytest_qaccuracy.analysis.reduced_compare import _value_types, reduction_spec
    from pytest_qaccuracy.runtime.reduction_graph import build_reduction_model

    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    trackers = [compare_module._tracker(m.fp32, m.capture, m.params, ["sqnr"]) for m in pair.matching.matches]
    f_types, q_types = _value_types(pair.matcher.f.model), _value_types(pair.matcher.q.model)
    specs = [reduction_spec(t, f_types, q_types) for t in trackers]
    model = build_reduction_model(pair.fp32, pair.quantized, ["x"], specs, [])
    position = {out: i for i, node in enumerate(model.graph.node) for out in node.output}
    f_last = max(i for i, node in enumerate(model.graph.node) if node.name.startswith("f/") or not node.name)
    first = specs[0]  # the first layer's statistics are computed before the fp32 model's last node runs
    assert max(position[name] for name in first.outputs.values()) < f_last
    for spec in specs:  # and every statistic after both tensors it reads
        reads = position.get("f/" + spec.fp32, -1), position.get("q/" + spec.capture, -1)
        assert min(position[name] for name in spec.outputs.values()) > max(reads)


@pytest.mark.parametrize(
    ("dims", "block"),
    [((64, 32, 48), 1024), ((6625,), 265), ((40, 6625), 1000), ((3, 97, 101), 303), ((7,), 7), ((9973,), 9973)],
)
def test_partial_sums_take_short_blocks_that_divide_the_record(dims, block):
    from pytest_qaccuracy.runtime.reduction_graph import BLOCK, _block

    count = math.prod(dims)
    assert _block(dims) == block and count % block == 0
    assert block <= BLOCK or block == dims[-1]  # a prime record longer than BLOCK: one sum per row


def _fixed_batch_pair(folder, mixes: bool):
    """A pair with the batch fixed at 1: fp32 t = x * w; the quantized t through Q/DQ (uint8, scale
    0.02); both y = t + t (or, with ``mixes``, y = t + t[0]: stacked records then get the first
    record's t in every record's y, which a run of one record never shows)."""
    rng = np.random.default_rng(8)
    w = numpy_helper.from_array(rng.uniform(0.5, 2.0, (1, 4, 1, 1)).astype(np.float32), "w")
    first = numpy_helper.from_array(np.array([0], np.int64), "first")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 70])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 70])
    tail = [helper.make_node("Gather", ["t_in", "first"], ["t0"], axis=0)] if mixes else []
    tail.append(helper.make_node("Add", ["t_in", "t0" if mixes else "t_in"], ["y"]))
    scale, zp = numpy_helper.from_array(np.array(0.02, np.float32), "s"), numpy_helper.from_array(np.uint8(128), "z")
    paths = []
    for name, body, inits in (
        ("f.onnx", [helper.make_node("Mul", ["x", "w"], ["t_in"])], [w, first]),
        (
            "q.onnx",
            [
                helper.make_node("Mul", ["x", "w"], ["t"]),
                helper.make_node("QuantizeLinear", ["t", "s", "z"], ["t_q"]),
                helper.make_node("DequantizeLinear", ["t_q", "s", "z"], ["t_in"]),
            ],
            [w, first, scale, zp],
        ),
    ):
        graph = helper.make_graph(body + tail, name, [x], [y], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        onnx.save(model, folder / name)
        paths.append(folder / name)
    return ModelPair(*paths)


@pytest.mark.parametrize("mixes", [False, True])
def test_a_fixed_batch_is_stacked_only_where_the_last_record_matches_its_own_run(tmp_path, monkeypatch, mixes):
    from pytest_qaccuracy.runtime import reduction_graph

    pair = _fixed_batch_pair(tmp_path, mixes)
    data = write_h5(tmp_path / "data.h5", np.random.default_rng(1).normal(0, 1, (12, 1, 4, 6, 70)).astype(np.float32))
    plain = _plain(monkeypatch, pair, data, options=RuntimeOptions(batch_size=5))
    runs = []
    run = reduction_graph.ReducedRunner._run

    def counted(self, feeds):
        runs.append(len(feeds["x"]))
        return run(self, feeds)

    monkeypatch.setattr(reduction_graph.ReducedRunner, "_run", counted)
    reduced = compare(pair, data, options=RuntimeOptions(batch_size=5))
    # batches of 5, 5 and 2 records; the first one's stacked run is kept unless its last record
    # differs from the run of that record alone
    assert runs == ([5, 1] + [1] * 12 if mixes else [5, 1, 5, 2])
    _assert_same(reduced, plain)
    y = next(o for o in plain.outputs if o.name == "y")
    assert y.metrics["mse"] == pytest.approx(4 * next(x for x in plain.layers if x.tensor == "t_in").metrics["mse"])


def test_the_merged_session_spins_briefly_during_a_run_unless_told_and_has_no_memory_pattern(zoo, monkeypatch):
    import onnxruntime as ort

    from pytest_qaccuracy.ort_session import BOUNDED_SPIN_SINCE, version_tuple
    from pytest_qaccuracy.runtime import reduction_graph

    runners = []
    init = reduction_graph.ReducedRunner.__init__

    def kept(self, *args, **kwargs):
        init(self, *args, **kwargs)
        runners.append(self)

    monkeypatch.setattr(reduction_graph.ReducedRunner, "__init__", kept)
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    compare(pair, zoo["data"], metrics="mse")
    no_spinning = RuntimeOptions(session_config={"session.intra_op.allow_spinning": "0"})
    compare(pair, zoo["data"], metrics="mse", options=no_spinning)

    def entry(runner, key):
        try:
            return runner._session.get_session_options().get_session_config_entry(key)
        except RuntimeError:  # not set
            return None

    keys = ("session.intra_op.allow_spinning", "session.intra_op.spin_duration_us", "session.force_spinning_stop")
    settings = [tuple(entry(r, k) for k in keys) for r in runners]
    # and no memory pattern: tensors come from the arena as they are made and freed
    assert [r._session.get_session_options().enable_mem_pattern for r in runners] == [False, False]
    if version_tuple(ort.__version__) >= BOUNDED_SPIN_SINCE:
        assert settings == [("1", "50", "1"), ("0", "50", "1")]
    else:  # no bounded spin: the threads sleep, as in every other session
        assert settings == [("0", None, None), ("0", None, None)]
