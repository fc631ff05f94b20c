"""Layer-wise comparison against independently computed values, batching, capture modes, memory."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from modelzoo import conv_net, random_inputs, write_h5

from pytest_qaccuracy.analysis.compare import compare, first_jump, worst_layers
from pytest_qaccuracy.analysis.results import ComparisonResult
from pytest_qaccuracy.data import bind_dataset, load_dataset
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.runtime import OrtRunner, RuntimeOptions
from pytest_qaccuracy.runtime.ort_runner import _with_outputs


def _run_with_outputs(path, names, records, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
    model = onnx.load(str(path))
    for name in names:
        model.graph.output.append(onnx.ValueInfoProto(name=name))
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    runs = [session.run(names, {"x": r}) for r in records]
    return {name: np.concatenate([r[i] for r in runs]).astype(np.float64) for i, name in enumerate(names)}


def test_reference_capture_equals_an_independent_computation(zoo):
    records = random_inputs(12, seed=4)  # the records of zoo["data"]
    result = compare(ModelPair(zoo["fp32"], zoo["qdq_u8"]), zoo["data"], capture="reference", metrics="mse,cosine,sqnr")
    fp32 = _run_with_outputs(zoo["fp32"], ["conv2", "add1", "logits"], records)
    quant = _run_with_outputs(
        zoo["qdq_u8"], ["conv2_DequantizeLinear_Output", "add1_DequantizeLinear_Output", "logits"], records
    )
    layers = {layer.tensor: layer for layer in result.layers}
    for f_name, q_name in [("conv2", "conv2_DequantizeLinear_Output"), ("add1", "add1_DequantizeLinear_Output")]:
        f, q = fp32[f_name], quant[q_name]
        expected_mse = np.mean([np.mean((f[i] - q[i]) ** 2) for i in range(12)])
        expected_sqnr = 20 * math.log10(np.linalg.norm(f) / np.linalg.norm(f - q))
        expected_cos = float(np.sum(f * q) / (np.linalg.norm(f) * np.linalg.norm(q)))
        assert layers[f_name].metrics["mse"] == pytest.approx(expected_mse, rel=1e-6)
        assert layers[f_name].metrics["sqnr"] == pytest.approx(expected_sqnr, rel=1e-6)
        assert layers[f_name].metrics["cosine"] == pytest.approx(expected_cos, rel=1e-9)
    f, q = fp32["logits"], quant["logits"]
    assert result.output("logits").metrics["sqnr"] == pytest.approx(
        20 * math.log10(np.linalg.norm(f) / np.linalg.norm(f - q)), rel=1e-6
    )
    assert result.records == 12


def _fused_ops(model: onnx.ModelProto, path) -> list[str]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sorted(n.op_type for n in onnx.load(str(path)).graph.node if n.op_type.startswith("QLinear"))


def test_deployed_capture_keeps_onnxruntime_fusion(zoo, tmp_path):
    """Exposing the integer tensors leaves every QLinear fusion of the deployed model in place."""
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    captures = [m.capture for m in pair.matching.matches]
    plain = _fused_ops(pair.quantized, tmp_path / "plain.onnx")
    exposed = _fused_ops(_with_outputs(pair.quantized, captures, False), tmp_path / "exposed.onnx")
    assert plain and exposed == plain
    # and the deployed result's outputs are both plain deployed sessions' outputs: exposing tensors
    # keeps onnxruntime from fusing Add/Sigmoid into the NCHWc Conv before them (the fp32 logits move
    # by ~1 ulp) and, on CPUs without VNNI, from rewriting int8 QDQ groups to uint8 (analysis/compare's
    # _DeployedOutputs), so the outputs come from the models run alone
    result = compare(pair, zoo["data"], metrics="max_abs", capture="deployed")
    fp32 = _run_with_outputs(
        zoo["fp32"], ["logits"], random_inputs(12, seed=4), ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    quant = _run_with_outputs(
        zoo["qdq_u8"], ["logits"], random_inputs(12, seed=4), ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    assert result.output("logits").metrics["max_abs"] == pytest.approx(
        np.abs(fp32["logits"] - quant["logits"]).max(), rel=1e-6
    )


@pytest.mark.parametrize("variant", ["qdq_u8", "qdq_s8_pc", "qop_u8", "qop_s8_pc"])
def test_batch_size_does_not_change_results(zoo, variant):
    pair = ModelPair(zoo["fp32"], zoo[variant])
    one = compare(pair, zoo["data"], options=RuntimeOptions(batch_size=1))
    five = compare(pair, zoo["data"], options=RuntimeOptions(batch_size=5))
    for a, b in zip(one.layers + one.outputs, five.layers + five.outputs, strict=True):
        for name, value in a.metrics.items():
            assert b.metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-9), (name, a)
    assert [x.tensor for x in one.layers] == [x.tensor for x in five.layers]


def test_fixed_batch_models_are_batched_and_unbatchable_ones_fall_back(tmp_path, zoo):
    fixed = conv_net(tmp_path / "fixed.onnx", batch=1)
    pair = ModelPair(fixed, fixed)
    result = compare(pair, zoo["data"], metrics="max_abs", options=RuntimeOptions(batch_size=4))
    assert result.output("logits").metrics["max_abs"] == 0.0
    # a model that reshapes to a constant shape cannot batch: records then run one at a time
    w = onnx.numpy_helper.from_array(np.ones((3 * 16 * 16, 2), np.float32), "w")
    shape = onnx.numpy_helper.from_array(np.array([1, 3 * 16 * 16], np.int64), "shape")
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Reshape", ["x", "shape"], ["flat"]),
            onnx.helper.make_node("MatMul", ["flat", "w"], ["y"]),
        ],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 2])],
        [w, shape],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "reshape.onnx"))
    result = compare(ModelPair(tmp_path / "reshape.onnx", tmp_path / "reshape.onnx"), zoo["data"], metrics="mse")
    assert result.records == 12 and result.output("y").metrics["mse"] == 0.0
    batch = next(bind_dataset(load_dataset(zoo["data"]), pair.inputs).iter_batches(4))
    batched = OrtRunner(onnx.load(str(fixed)), ["logits"], RuntimeOptions(), "fixed")
    assert batched.run(batch)["logits"].shape == (4, 10) and batched.batching
    unbatched = OrtRunner(model, ["y"], RuntimeOptions(), "reshape")
    assert unbatched.run(batch)["y"].shape == (4, 2) and not unbatched.batching


def test_results_round_trip_the_comparison_json(zoo):
    result = compare(ModelPair(zoo["fp32"], zoo["qop_s8_pc"]), zoo["data"])
    data = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert ComparisonResult.from_dict(data).to_dict() == data
    assert set(data) >= {
        "schema_version",
        "fp32_model",
        "quantized_model",
        "data",
        "records",
        "backend",
        "scheme",
        "metric_definitions",
        "outputs",
        "layers",
        "unmatched",
    }
    layer = data["layers"][0]
    assert set(layer) >= {"tensor", "quantized_tensor", "node", "op_type", "order", "metrics"}
    assert data["unmatched"] == {"fp32": ["conv1"], "quantized": []}
    assert list(data["metric_definitions"]) == [
        "mse",
        "mpeir",
        "tae",
        "srmse",
        "mre",
        "max_abs",
        "lsb",
        "clipped",
        "cosine",
        "sqnr",
    ]
    assert [x["order"] for x in data["layers"]] == sorted(x["order"] for x in data["layers"])


def test_worst_records_and_layers(zoo):
    result = compare(ModelPair(zoo["fp32"], zoo["qdq_u8"]), zoo["data"], metrics="mse,sqnr")
    worst = result.output("logits").worst_records
    assert len(worst["mse"]) == 5 and worst["mse"] == sorted(worst["mse"], key=lambda rv: -rv[1])
    assert worst["sqnr"] == sorted(worst["sqnr"], key=lambda rv: rv[1])  # lowest SQNR first
    ranked = worst_layers(result, "sqnr", 3)
    assert [x.metrics["sqnr"] for x in ranked] == sorted(x.metrics["sqnr"] for x in result.layers)[:3]
    assert first_jump(result, "sqnr") in result.layers


def test_datasets_in_every_format_give_the_same_result(zoo, tmp_path):
    records = random_inputs(12, seed=4)
    np.savez(tmp_path / "d.npz", x=records)
    pair = ModelPair(zoo["fp32"], zoo["qop_u8"])
    a = compare(pair, zoo["data"], metrics="sqnr")
    b = compare(pair, load_dataset(tmp_path / "d.npz"), metrics="sqnr")
    assert a.output("logits").metrics == b.output("logits").metrics


def test_peak_memory_does_not_grow_with_records(zoo, tmp_path):
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    options = RuntimeOptions(batch_size=4, threads=1)  # one worker: which thread holds which buffer is fixed
    peaks = []
    for count in (8, 64):
        path = write_h5(tmp_path / f"d{count}.h5", random_inputs(count, seed=5))
        compare(pair, path, options=options)  # warm-up: sessions and caches
        tracemalloc.start()
        compare(pair, path, options=options)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < peaks[0] * 1.3, peaks


def test_the_core_never_imports_pytest():
    code = (
        "import sys\n"
        "import pytest_qaccuracy.data, pytest_qaccuracy.model, pytest_qaccuracy.runtime, pytest_qaccuracy.metrics\n"
        "import pytest_qaccuracy.analysis.compare, pytest_qaccuracy.report.artifacts, pytest_qaccuracy.cli\n"
        "assert 'pytest' not in sys.modules and '_pytest' not in sys.modules, 'pytest was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _layers_result(metric: str, values: list[float], higher: bool) -> ComparisonResult:
    from pytest_qaccuracy.analysis.results import LayerResult

    layers = [LayerResult(f"t{i}", f"q{i}", None, "Conv", i, {metric: v}) for i, v in enumerate(values)]
    return ComparisonResult("f.onnx", "q.onnx", "d.h5", 1, {metric: "-"}, [], layers, higher_is_better={metric: higher})


def test_first_jump_finds_the_sharp_step():
    assert first_jump(_layers_result("sqnr", [40.0, 38.0, 30.0, 20.0], True)).tensor == "t2"  # -8 dB
    assert first_jump(_layers_result("mse", [1.0, 1.5, 3.2, 9.0], False), "mse").tensor == "t2"  # x2.13
    assert first_jump(_layers_result("cosine", [0.999, 0.997, 0.990], True), "cosine").tensor == "t1"  # 1-cos triples
    assert first_jump(_layers_result("sqnr", [40.0, 38.0, 35.0], True)).tensor == "t2"  # largest step, none >= 6
    assert first_jump(_layers_result("sqnr", [30.0, 31.0], True)) is None  # nothing worsens


@pytest.mark.parametrize("gain", [1.0, 4.0])
def test_clipped_counts_the_fp32_values_outside_each_layers_range(zoo, tmp_path, gain):
    """The quantizer calibrated on other records: at gain 4 the inputs leave the calibrated ranges.
    Golden: the fp32 tensor from onnxruntime, quantized by ONNX's own formula in float64 with the
    scale and zero point of the QuantizeLinear that reads it."""
    records = random_inputs(6, seed=9) * np.float32(gain)
    data = write_h5(tmp_path / "data.h5", records)
    result = compare(ModelPair(zoo["fp32"], zoo["qdq_u8"]), data, "clipped", capture="reference")
    quantized = onnx.load(str(zoo["qdq_u8"]))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in quantized.graph.initializer}
    reads = {n.input[0]: n for n in quantized.graph.node if n.op_type == "QuantizeLinear"}
    layers = {layer.tensor: layer for layer in result.layers}
    checked = 0
    for tensor in ("add1", "pool1", "conv3", "sig1"):
        q = reads[tensor]
        scale, zp = inits[q.input[1]].astype(np.float64), inits[q.input[2]]
        f = _run_with_outputs(zoo["fp32"], [tensor], records)[tensor]
        t = np.rint(f / scale) + zp.astype(np.int64)
        golden = np.count_nonzero((t < 0) | (t > 255)) / f.size
        assert layers[tensor].metrics["clipped"] == pytest.approx(golden, abs=1e-12), tensor
        checked += golden > 0
    if gain > 1:  # 4x the calibration data's spread saturates every unbounded layer (not the sigmoid)
        assert checked >= 3 and all(layers[t].metrics["clipped"] > 0 for t in ("add1", "pool1", "conv3"))


@pytest.mark.parametrize("variant", ["qdq_u8", "qop_s8_pc"])
def test_the_quantized_graph_input_is_compared(zoo, variant):
    """x -> QuantizeLinear is a quantization point like any other: its error is the
    rounding of the records to x's grid, recomputed here in numpy from the model's scale and zero point."""
    records = random_inputs(12, seed=4)[:, 0].astype(np.float64)  # the records of zoo["data"]
    result = compare(ModelPair(zoo["fp32"], zoo[variant]), zoo["data"], metrics="sqnr,max_abs")
    (layer,) = [x for x in result.layers if x.tensor == "x"]
    assert (layer.node, layer.op_type, layer.order) == (None, "input", -1)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(str(zoo[variant])).graph.initializer}
    scale, zero = float(inits["x_scale"]), int(inits["x_zero_point"])
    info = np.iinfo(inits["x_zero_point"].dtype)
    q = (np.clip(np.round(records / scale) + zero, info.min, info.max) - zero) * scale
    sqnr = 20 * math.log10(np.linalg.norm(records) / np.linalg.norm(records - q))
    assert layer.metrics["sqnr"] == pytest.approx(sqnr, rel=1e-4)
    assert layer.metrics["max_abs"] == pytest.approx(np.abs(records - q).max(), rel=1e-4)


def _scalar_input_pair(tmp_path):
    """A pair reading a 0-d input (a speech model's sample rate) whose Cast is a 0-d layer of both."""
    from onnx import TensorProto, helper, numpy_helper

    def model(quantized: bool):
        nodes = [
            helper.make_node("Cast", ["sr"], ["rate"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["x", "rate"], ["y"]),
        ]
        inits = []
        if quantized:
            inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(np.uint8(128), "z")]
            nodes[1].output[0] = "y_f"
            nodes += [helper.make_node("QuantizeLinear", ["y_f", "s", "z"], ["y_q"]),
                      helper.make_node("DequantizeLinear", ["y_q", "s", "z"], ["y"])]  # fmt: skip
        graph = helper.make_graph(
            nodes,
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8]),
                helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
            inits,
        )
        path = tmp_path / ("q.onnx" if quantized else "f.onnx")
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
        return path

    return ModelPair(model(False), model(True))


@pytest.mark.parametrize("records", [1, 3])
def test_a_0d_layer_is_one_value_per_record(tmp_path, records):
    """A 0-d tensor made from a 0-d input is compared as each record's value, whether the batch holds
    one record or several (one record used to reach the metrics without a record axis)."""
    pair = _scalar_input_pair(tmp_path)
    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.uniform(-1, 1, (records, 8)).astype(np.float32), sr=np.full(records, 3, np.int64))
    result = compare(pair, data, ["mse", "sqnr"])
    assert result.records == records
    rate = [layer for layer in result.layers if layer.tensor == "rate"]
    assert rate and rate[0].metrics["mse"] == 0.0, [layer.tensor for layer in result.layers]
    assert result.outputs[0].metrics["mse"] > 0.0
