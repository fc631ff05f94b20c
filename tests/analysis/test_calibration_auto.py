"""``auto`` calibration: candidates, the consumer probe, the parameterized QDQ model, the choice, the
CLI and the cache; expected values computed here independently (numpy, onnxruntime's own calibrators
and quantizer), not by the code under test."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
from onnxruntime.quantization.quant_utils import compute_scale_zp

from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges, quantize_with_ranges
from pytest_qaccuracy.analysis.calibration.auto import Evaluator, choice_runs, majority, verified_choice
from pytest_qaccuracy.analysis.calibration.cache import calibrated_model, content_key
from pytest_qaccuracy.analysis.calibration.candidates import ort_percentile_range
from pytest_qaccuracy.analysis.calibration.options import CalibrationResult
from pytest_qaccuracy.analysis.calibration.probe import ProbeScores, build_probe, output_names
from pytest_qaccuracy.analysis.calibration.qdq_params import (
    ParamModel,
    Weight,
    _biases,
    raises_weight_scales,
    same_model,
    symmetric_scale,
)
from pytest_qaccuracy.analysis.calibration.reader import DatasetReader
from pytest_qaccuracy.cli import main
from pytest_qaccuracy.data import bind_dataset, load_dataset
from pytest_qaccuracy.model.loading import graph_inputs, load_model
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.modelzoo import conv_net, mlp, random_inputs, small_weights_net


@pytest.fixture(scope="module")
def signal(tmp_path_factory):
    """Inputs whose feature 3 is always large (it carries the signal to the output) and a spike of 80
    in one record's feature 5: KL clips feature 3 away, min/max keeps both."""
    logging.getLogger().setLevel(logging.ERROR)
    root = tmp_path_factory.mktemp("signal")
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((16, 16)) / 4).astype(np.float32)
    w1[3] = 0.0
    w1[3, 0] = 1.0  # feature 3 drives hidden unit 0 alone
    w2 = (rng.standard_normal((16, 4)) / 4).astype(np.float32)
    w2[0] = 2.0 * np.sign(w2[0])  # ... which dominates every output

    def records(count: int, seed: int) -> np.ndarray:
        r = np.random.default_rng(seed).standard_normal((count, 1, 16)).astype(np.float32)
        r[:, 0, 3] = 40.0 + 2.0 * r[:, 0, 3]
        return r

    calib = records(24, 1)
    calib[7, 0, 5] = 80.0
    np.savez(root / "calib.npz", x=calib)
    np.savez(root / "eval.npz", x=records(24, 2))
    return {
        "root": root,
        "fp32": mlp(root / "mlp.onnx", w1, w2),
        "calib": root / "calib.npz",
        "eval": root / "eval.npz",
    }


def _records(path: Path, model: Path) -> list[dict[str, np.ndarray]]:
    return list(bind_dataset(load_dataset(path), graph_inputs(load_model(model))).iter_records())


def _output_error(
    fp32: Path, quantized: Path, data: Path, optimization=ort.GraphOptimizationLevel.ORT_ENABLE_ALL
) -> float:
    """sum (q - y)^2 / sum y^2 over every record, by plain onnxruntime sessions."""
    options = ort.SessionOptions()
    options.graph_optimization_level = optimization
    a = ort.InferenceSession(str(fp32), providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(quantized), options, providers=["CPUExecutionProvider"])
    err = energy = 0.0
    for record in _records(data, fp32):
        y = a.run(None, record)[0].astype(np.float64)
        q = b.run(None, record)[0].astype(np.float64)
        err, energy = err + np.sum((q - y) ** 2), energy + np.sum(y * y)
    return err / energy


def test_ort_percentile_rule_is_onnxruntimes_calibrator_to_the_bit(tmp_path):
    """onnxruntime's own PercentileCalibrater (2048 bins over |x|, 99.999 %, symmetric) against the
    streamed rule, records folded in uneven chunks: the same float32 range for a mixed-sign tensor, a
    non-negative one (min |x| = 0) and a positive one (min |x| > 0)."""
    from onnxruntime.quantization.calibrate import create_calibrator

    from pytest_qaccuracy.analysis.calibration.observers import MagnitudeHistogramObserver, magnitude_minimum

    rng = np.random.default_rng(5)
    x = rng.standard_normal((40, 1, 4096)).astype(np.float32)
    x[3, 0, 7] = 60.0  # one value in 163,840: beyond the 99.999th percentile of |x|
    model = tmp_path / "id.onnx"
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["z"])]
    nodes.append(helper.make_node("Exp", ["x"], ["e"]))
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4096]) for n in ("y", "z", "e")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4096])], outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    np.savez(tmp_path / "d.npz", x=x)
    calibrator = create_calibrator(
        str(model),
        ["Neg", "Relu", "Exp"],
        str(tmp_path / "augmented.onnx"),
        calibrate_method=CalibrationMethod.Percentile,
    )
    calibrator.collect_data(DatasetReader(tmp_path / "d.npz", model))
    theirs = calibrator.compute_data()
    values = {"y": np.maximum(x, 0), "z": -x, "e": np.exp(x)}
    for name, tensor in values.items():
        lo, hi = float(tensor.min()), float(tensor.max())
        chunks = np.split(tensor, [1, 8, 9, 30])
        smallest = min(magnitude_minimum(c, c.min(axis=(1, 2)), c.max(axis=(1, 2))) for c in chunks)
        observer = MagnitudeHistogramObserver(smallest, max(abs(lo), abs(hi)))
        for chunk in chunks:
            observer.update(chunk)
        ours = ort_percentile_range(observer.counts, observer.edges, lo, hi)
        assert ours == tuple(float(np.ravel(v)[0]) for v in theirs[name].range_value), name
    assert theirs["z"].range_value[1] < 0.5 * 60.0  # the rule cut the tail: min/max would not


def test_auto_candidates_are_the_methods_themselves(signal):
    """Every candidate ``auto`` reports is what the method of that name gives on its own (observing the
    fp32 model as auto does: graph optimizations off, one record per run), and its min/max is
    onnxruntime's own MinMaxCalibrater's range to the bit, its ort-percentile PercentileCalibrater's."""
    from onnxruntime.quantization.calibrate import create_calibrator

    result = compute_ranges(signal["fp32"], signal["calib"], CalibrationOptions(method="auto"))
    tensors = result.selection["tensors"]
    assert set(tensors) >= {"x", "r"}
    as_ort = RuntimeOptions(optimization="disable", batch_size=1)
    for method in ("minmax", "percentile", "moving-average", "kl", "mse"):
        alone = compute_ranges(signal["fp32"], signal["calib"], CalibrationOptions(method=method), as_ort).ranges
        for name, entry in tensors.items():
            assert entry["candidates"][method]["range"] == list(alone[name]), (method, name)
    calibrator = create_calibrator(str(signal["fp32"]), None, augmented_model_path=str(signal["root"] / "aug.onnx"))
    calibrator.collect_data(DatasetReader(signal["calib"], signal["fp32"]))
    for name, data in calibrator.compute_data().data.items():
        if name in tensors:
            theirs = [float(np.ravel(v)[0]) for v in data.range_value]
            assert tensors[name]["candidates"]["minmax"]["range"] == theirs, name
    calibrator = create_calibrator(
        str(signal["fp32"]),
        None,
        augmented_model_path=str(signal["root"] / "aug_percentile.onnx"),
        calibrate_method=CalibrationMethod.Percentile,
    )
    calibrator.collect_data(DatasetReader(signal["calib"], signal["fp32"]))
    for name, data in calibrator.compute_data().data.items():
        if name in tensors:
            theirs = [float(np.ravel(v)[0]) for v in data.range_value]
            assert tensors[name]["candidates"]["ort-percentile"]["range"] == theirs, name


def test_the_parameterized_model_computes_what_onnxruntime_writes(signal, tmp_path):
    """The minmax model with its activation parameters as inputs, fed another method's ranges, gives
    the outputs of onnxruntime's own model written with those ranges (both run as float Q/DQ)."""
    fp32 = load_model(signal["fp32"])
    observed = compute_ranges(signal["fp32"], signal["calib"]).ranges
    other = compute_ranges(signal["fp32"], signal["calib"], CalibrationOptions(method="percentile")).ranges
    base = quantize_with_ranges(signal["fp32"], tmp_path / "mm.onnx", CalibrationResult("minmax", 24, observed))
    target = quantize_with_ranges(signal["fp32"], tmp_path / "pc.onnx", CalibrationResult("percentile", 24, other))
    params = ParamModel(load_model(base), fp32, observed, "uint8")
    assert set(params.tensors) == {"x", "r", "y"}  # every activation ORT quantized (Relu's input shares r's)
    feeds = params.feeds(other)
    written = {t.name: numpy_helper.to_array(t) for t in load_model(target).graph.initializer}
    for name, value in feeds.items():  # the values fed are the ones onnxruntime wrote
        assert value.dtype == written[name].dtype and np.array_equal(value, written[name]), name
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    a = ort.InferenceSession(params.model.SerializeToString(), plain, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(target), plain, providers=["CPUExecutionProvider"])
    for record in _records(signal["eval"], signal["fp32"])[:4]:
        assert np.array_equal(a.run(None, {**record, **feeds})[0], b.run(None, record)[0])


RECIPES = {
    "qdq u8s8": CalibrationOptions(),
    "qdq s8s8 per-channel": CalibrationOptions(activation_type="int8", per_channel=True),
    "qoperator u8s8": CalibrationOptions(quant_format="qoperator"),
}


def clip_softmax_net(path: Path) -> Path:
    """Conv-Clip (the Conv output takes the Clip's range), Conv-Relu, Gemm with beta 0.5, Softmax
    (its output range fixed to [0, 1]): the range rules and the bias scale's beta."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w1"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "b1"),
        numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.3, "w2"),
        numpy_helper.from_array(rng.standard_normal(4).astype(np.float32) * 0.1, "b2"),
        numpy_helper.from_array(rng.standard_normal((5, 4 * 16 * 16)).astype(np.float32) * 0.05, "wg"),
        numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "bg"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(2.0, np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["k1"], name="clip1"),
        helper.make_node("Conv", ["k1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Flatten", ["r2"], ["f"], axis=1, name="flat"),
        helper.make_node("Gemm", ["f", "wg", "bg"], ["g"], transB=1, beta=0.5, name="gemm"),
        helper.make_node("Softmax", ["g"], ["y"], axis=1, name="softmax"),
    ]
    graph = helper.make_graph(
        nodes,
        "clip_softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


#: each net and the int32 biases a choice of percentile ranges changes
NETS = {
    "conv net": (conv_net, {"b1_quantized", "b2_quantized", "b3_quantized"}),
    "clip and softmax": (clip_softmax_net, {"b1_quantized", "bg_quantized"}),
}


def _minmax_written(fp32: Path, form: CalibrationOptions) -> tuple:
    """``fp32`` calibrated on 8 random records: (fp32, min/max ranges, percentile ranges, the
    ParamModel of onnxruntime's min/max QDQ model, onnxruntime's min/max model in ``form``)."""
    tmp = fp32.parent
    np.savez(tmp / "calib.npz", x=random_inputs(8))
    observed = compute_ranges(fp32, tmp / "calib.npz").ranges
    other = compute_ranges(fp32, tmp / "calib.npz", CalibrationOptions(method="percentile")).ranges
    minmax = CalibrationResult("minmax", 8, observed)
    qdq = quantize_with_ranges(fp32, tmp / "qdq.onnx", minmax, replace(form, quant_format="qdq"))
    params = ParamModel(load_model(qdq), load_model(fp32), observed, form.activation_type)
    return fp32, observed, other, params, load_model(quantize_with_ranges(fp32, tmp / "base.onnx", minmax, form))


@pytest.mark.parametrize("net", NETS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_patched_model_is_the_model_onnxruntime_writes(tmp_path, recipe, net):
    """The min/max model with another choice's parameters set (activations, and the int32 biases of
    Conv and Gemm after them) is, node for node and value for value, the model onnxruntime's quantizer
    writes from that choice."""
    form = RECIPES[recipe]
    make, biases = NETS[net]
    fp32, observed, other, params, base = _minmax_written(make(tmp_path / "net.onnx"), form)
    choice = {t: other[t] for t in params.tensors}
    written = CalibrationResult("percentile", 8, {**observed, **choice})
    target = load_model(quantize_with_ranges(fp32, tmp_path / "target.onnx", written, form))
    assert not same_model(base, target)  # the choice changes the model ...
    before = {t.name: t for t in base.graph.initializer}
    changed = {t.name for t in target.graph.initializer if before.get(t.name) != t}
    assert biases <= changed, changed  # ... its biases too
    patched = params.patched(base, choice)
    assert same_model(patched, target)
    if net == "clip and softmax" and form.quant_format == "qdq":
        assert "y" in params.tensors  # the Softmax output's range is onnxruntime's [0, 1]
    patched.graph.node[0].name += " renamed"
    assert not same_model(patched, target)  # nodes count too


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_patched_model_raises_weight_scales_as_onnxruntime_does(tmp_path, recipe):
    """Where onnxruntime raises a weight's scale for its int32 bias, the patched model of a choice is
    still onnxruntime's: raised again for a narrower range (percentile), back to the weight's own
    scale for a wider one (ten times min/max), the weight's channels quantized again with it."""
    form = RECIPES[recipe]
    fp32, observed, other, params, base = _minmax_written(small_weights_net(tmp_path / "net.onnx"), form)
    choices = {
        "percentile": {t: other[t] for t in params.tensors},
        "wider": {t: (10 * observed[t][0], 10 * observed[t][1]) for t in params.tensors},
    }
    targets = {}
    for name, choice in choices.items():
        written = CalibrationResult(name, 8, {**observed, **choice})
        targets[name] = load_model(quantize_with_ranges(fp32, tmp_path / f"{name}.onnx", written, form))
        assert not same_model(base, targets[name])
        patched = params.patched(base, choice)
        if raises_weight_scales(form.quant_format == "qoperator"):
            assert same_model(patched, targets[name]), name
        else:  # onnxruntime 1.18 (and 1.20's QOperator writer) raises no scale; 1.18 divides a bias in
            # float32 and casts one past int32 to INT_MIN, which the patch does not copy (the chosen
            # model is written and compared)
            mine, theirs = (
                {t.name: numpy_helper.to_array(t) for t in m.graph.initializer} for m in (patched, targets[name])
            )
            differ = {k for k in mine if not np.array_equal(mine[k], theirs[k])}
            assert differ <= {"b1_quantized", "b2_quantized"}, name
    # not vacuous: conv2's weight scale is raised in the min/max model and not at ten times its input scale
    (w2_scale,) = [w_scale for _, _, w_scale, _, node, _ in _biases(base) if node.startswith("conv2")]
    scales = {name: numpy_helper.to_array(_init(m, w2_scale)) for name, m in {"minmax": base, **targets}.items()}
    plain = symmetric_scale(numpy_helper.to_array(_init(load_model(fp32), "w2")), 0 if form.per_channel else None, 3)
    if raises_weight_scales(form.quant_format == "qoperator"):
        assert np.all(scales["minmax"] > plain) and np.all(scales["percentile"] > scales["minmax"])
        assert np.array_equal(scales["wider"], plain)
    else:  # no raise (onnxruntime 1.18; 1.20's QOperator writer)
        assert all(np.array_equal(s, plain) for s in scales.values())


def _init(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(t for t in model.graph.initializer if t.name == name)


def test_only_biases_quantized_from_quantized_inputs_are_patched():
    """An int32 bias is found after a dequantized input and weight (QDQ) or at a QLinearConv's or
    QGemm's bias input; a bias beside a float weight, and a QLinearConv without bias, give none. The
    weight is found with its zero point and axis (DequantizeLinear's default 1; a QLinearConv's 0, a
    QGemm's unknown) where it has a zero point."""
    ints = [numpy_helper.from_array(np.zeros(2, np.int32), n) for n in ("b_quantized", "c_quantized")]
    floats = [numpy_helper.from_array(np.ones(1, np.float32), n) for n in ("s", "w", "wf", "wq", "vq")]
    dq = [
        helper.make_node("DequantizeLinear", [q, "s"], [f"{q}_dq"]) for q in ("xq", "wq", "b_quantized", "c_quantized")
    ]
    nodes = [
        *dq,
        helper.make_node("DequantizeLinear", ["vq", "s", "vz"], ["vq_dq"], axis=0),
        helper.make_node("DequantizeLinear", ["wq", "s", "wz"], ["wz_dq"]),
        helper.make_node("Conv", ["xq_dq", "wq_dq", "b_quantized_dq"], ["y"], name="quantized"),
        helper.make_node("Conv", ["xq_dq", "vq_dq", "b_quantized_dq"], ["y2"], name="with zero point"),
        helper.make_node("Conv", ["xq_dq", "wz_dq", "b_quantized_dq"], ["y3"], name="default axis"),
        helper.make_node("Conv", ["xq_dq", "wf", "c_quantized_dq"], ["z"], name="float weight"),
        helper.make_node("QLinearConv", ["a", "s", "zp", "w", "ws", "wz", "ys", "yz"], ["q"], name="no bias"),
        helper.make_node("QLinearConv", ["a", "as", "zp", "w", "ws", "wz", "ys", "yz", "b_quantized"], ["r"]),
        helper.make_node("QLinearConv", ["a", "as", "zp", "dyn", "ws", "wz", "ys", "yz", "b_quantized"], ["r2"]),
        helper.make_node("QGemm", ["a", "as", "zp", "w", "ws", "wz", "b_quantized", "ys", "yz"], ["g"], name="gemm"),
    ]
    graph = helper.make_graph(nodes, "g", [], [], [*ints, *floats])
    assert _biases(helper.make_model(graph)) == [
        ("b_quantized", "s", "s", "s", "quantized", None),
        ("b_quantized", "s", "s", "s", "with zero point", Weight("vq", "vz", 0)),
        ("b_quantized", "s", "s", "s", "default axis", Weight("wq", "wz", 1)),
        ("b_quantized", "as", "ws", None, "", Weight("w", "wz", 0)),
        ("b_quantized", "as", "ws", None, "", Weight("dyn", "wz", 0)),  # not an initializer: the patch skips it
        ("b_quantized", "as", "ws", None, "gemm", Weight("w", "wz", None)),
    ]


def test_the_chosen_model_is_compared_with_onnxruntimes_and_measured_again_if_it_differs(signal):
    """On the held-out records, min/max ranges of those very records ("fitted": the calibration
    records' spike of 80 is not among them) beat the calibration records' min/max model: chosen, and
    kept when onnxruntime's write of it is the same model. When onnxruntime's write differs (here: KL's
    model), that model is run, and min/max is kept as it is better."""
    fp32 = load_model(signal["fp32"])
    observed = compute_ranges(signal["fp32"], signal["calib"]).ranges
    made = {
        "minmax": observed,
        "fitted": compute_ranges(signal["fp32"], signal["eval"]).ranges,
        "kl": compute_ranges(signal["fp32"], signal["calib"], CalibrationOptions(method="kl")).ranges,
    }
    paths = {
        name: quantize_with_ranges(signal["fp32"], signal["root"] / f"{name}.onnx", CalibrationResult(name, 24, r))
        for name, r in made.items()
    }
    models = {name: load_model(path) for name, path in paths.items()}
    errors = {name: _output_error(signal["fp32"], path, signal["eval"]) for name, path in paths.items()}
    assert errors["fitted"] < errors["minmax"] < errors["kl"]
    evaluator = Evaluator(fp32, bind_dataset(load_dataset(signal["eval"]), graph_inputs(fp32)), RuntimeOptions())
    final = ["minmax", "fitted"]
    report = {"steps": [], "passes": 0}
    got = verified_choice(evaluator, final, dict(models), lambda name: load_model(paths[name]), report)
    assert got.name == "fitted" and got.error == pytest.approx(errors["fitted"], rel=1e-9)
    assert report["passes"] == 0 and not any(s.get("measured_again") for s in report["steps"])
    report = {"steps": [], "passes": 0}
    got = verified_choice(evaluator, final, dict(models), lambda _: models["kl"], report)
    assert got.name == "minmax" and got.error == pytest.approx(errors["minmax"], rel=1e-9)
    again = next(s for s in report["steps"] if s["choice"].startswith("fitted,"))
    assert again["measured_again"] and again["output_error"] == pytest.approx(errors["kl"], rel=1e-9)
    assert report["passes"] == 1


def test_probe_scores_are_the_consumers_relative_error(signal):
    """The probe's score of a range of ``x`` is sum ||fq(x) W1 - x W1||^2 / sum ||x W1||^2 over the
    records, with onnxruntime's scale and zero point: computed here in numpy."""
    fp32 = load_model(signal["fp32"])
    w1 = numpy_helper.to_array(fp32.graph.initializer[0])
    bound = bind_dataset(load_dataset(signal["calib"]), graph_inputs(fp32))
    ranges = {"minmax": (-3.5, 80.0), "kl": (-3.5, 6.0)}
    model, entries = build_probe(fp32, {"x": list(ranges.values())}, "uint8")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sums, names = ProbeScores(entries), output_names(entries)
    for record in bound.iter_records():
        sums.add(dict(zip(names, session.run(names, record), strict=True)))
    measured = dict(sums.by_tensor()["x"])
    scores = {"x": {rule: measured[r] for rule, r in ranges.items()}}

    def expected(lo: float, hi: float) -> float:
        zero, scale = compute_scale_zp(np.float32(lo), np.float32(hi), np.uint8(0), np.uint8(255))
        scale, zero = np.float32(scale), float(zero)
        err = energy = 0.0
        for record in bound.iter_records():
            x = record["x"]
            q = np.clip(np.round(x / scale) + zero, 0, 255)  # round half to even, as QuantizeLinear
            fq = ((q - zero) * scale).astype(np.float32)
            h, hq = (x @ w1).astype(np.float64), (fq @ w1).astype(np.float64)
            err, energy = err + np.sum((hq - h) ** 2), energy + np.sum(h * h)
        return err / energy

    for rule, (lo, hi) in ranges.items():
        assert scores["x"][rule] == pytest.approx(expected(lo, hi), rel=1e-4)
    assert scores["x"]["kl"] > 10 * scores["x"]["minmax"]  # clipping feature 3 ruins the consumer


def test_auto_is_never_worse_than_onnxruntimes_calibrators_where_kl_hurts(signal, tmp_path):
    """On the calibration records, as onnxruntime runs the models: auto's model against onnxruntime's
    own MinMax and Percentile calibrators (Entropy with its defaults is MinMax); KL, which clips the
    signal feature, is far worse; the choice is reported per tensor."""
    options = CalibrationOptions(method="auto")
    result = compute_ranges(signal["fp32"], signal["calib"], options)
    auto = quantize_with_ranges(signal["fp32"], tmp_path / "auto.onnx", result, options)
    theirs = {}
    for kind in ("MinMax", "Percentile"):
        out = tmp_path / f"ort-{kind}.onnx"
        quantize_static(
            str(signal["fp32"]),
            str(out),
            DatasetReader(signal["calib"], signal["fp32"]),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=getattr(CalibrationMethod, kind),
        )
        theirs[kind] = _output_error(signal["fp32"], out, signal["calib"])
    mine = _output_error(signal["fp32"], auto, signal["calib"])
    assert mine <= min(theirs.values()) * (1 + 1e-9)
    kl_options = CalibrationOptions(method="kl")
    kl = quantize_with_ranges(
        signal["fp32"], tmp_path / "kl.onnx", compute_ranges(signal["fp32"], signal["calib"], kl_options), kl_options
    )
    assert _output_error(signal["fp32"], kl, signal["calib"]) > 10 * mine
    selection = result.selection
    verified = [s for s in selection["steps"] if s.get("verified")]
    assert selection["chosen"] in {s["choice"].split(",")[0] for s in verified}
    assert selection["output_sqnr_db"] == pytest.approx(-10 * np.log10(mine), abs=0.05)
    assert selection["tensors"]["x"]["winner"] != "kl"


def test_cli_auto_json_and_the_minmax_warning(signal, tmp_path, capsys):
    base = ["calibrate", str(signal["fp32"]), "--data", str(signal["calib"])]
    assert main([*base, "--method", "auto", "--out", str(tmp_path / "a.onnx"), "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "auto chose" in out and "as onnxruntime runs it" in out
    report = json.loads((tmp_path / "a.json").read_text())["selection"]
    entry = report["tensors"]["x"]
    assert set(entry["candidates"]) == {"minmax", "percentile", "moving-average", "kl", "mse", "ort-percentile"}
    assert entry["winner"] in entry["candidates"] and all("score" in c for c in entry["candidates"].values())
    assert main([*base, "--method", "kl", "--out", str(tmp_path / "k.onnx")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: kl ranges give an output SQNR of")
    assert main([*base, "--method", "kl", "--no-check", "--out", str(tmp_path / "k2.onnx")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*base, "--method", "minmax", "--out", str(tmp_path / "m.onnx")]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("threads", [0, 2])
def test_evaluator_errors_match_an_independent_computation(signal, tmp_path, threads):
    """Several models measured in one pass (side by side in single-threaded sessions when onnxruntime
    chooses the threads, one after the other otherwise), each as plain onnxruntime sessions give it."""
    fp32 = load_model(signal["fp32"])
    observed = compute_ranges(signal["fp32"], signal["calib"]).ranges
    other = compute_ranges(signal["fp32"], signal["calib"], CalibrationOptions(method="percentile")).ranges
    base = quantize_with_ranges(signal["fp32"], tmp_path / "mm.onnx", CalibrationResult("minmax", 24, observed))
    second = quantize_with_ranges(signal["fp32"], tmp_path / "pc.onnx", CalibrationResult("percentile", 24, other))
    bound = bind_dataset(load_dataset(signal["calib"]), graph_inputs(fp32))
    evaluator = Evaluator(fp32, bound, RuntimeOptions(threads=threads))
    models = {"m": base, "p": second}
    loaded = {name: load_model(path) for name, path in models.items()}
    made = evaluator.sessions({**loaded, "m again": loaded["m"]})  # built side by side, once per model
    assert made["m again"] is made["m"] is evaluator.session(loaded["m"]) and made["p"] is not made["m"]
    real = evaluator.errors({name: (made[name], {}) for name in models})
    for name, path in models.items():
        assert real[name] == pytest.approx(_output_error(signal["fp32"], path, signal["calib"]), rel=1e-9)
    assert real["m"] != real["p"]
    params = ParamModel(load_model(base), fp32, observed, "uint8")
    session = evaluator.session(params.model)
    simulated = evaluator.errors(choice_runs(session, params, {"m": observed, "p": other}))
    plain = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    for name, path in models.items():
        assert simulated[name] == pytest.approx(_output_error(signal["fp32"], path, signal["calib"], plain), rel=1e-9)


def test_wins_count_the_records_where_a_model_beats_min_max(signal, tmp_path):
    """``against``: per record, each model's error (squared error over energy) compared with min/max's,
    counted as plain onnxruntime sessions give it; ties count for neither."""
    fp32 = load_model(signal["fp32"])
    observed = compute_ranges(signal["fp32"], signal["calib"]).ranges
    paths = {
        "minmax": quantize_with_ranges(signal["fp32"], tmp_path / "mm.onnx", CalibrationResult("minmax", 24, observed))
    }
    # the input's range without record 7's spike of 80: finer steps for the other records, a clipped spike
    clipped = {**observed, "x": (observed["x"][0], 50.0)}
    paths["no-spike"] = quantize_with_ranges(
        signal["fp32"], tmp_path / "no-spike.onnx", CalibrationResult("x", 24, clipped)
    )
    bound = bind_dataset(load_dataset(signal["calib"]), graph_inputs(fp32))
    evaluator = Evaluator(fp32, bound, RuntimeOptions())
    evaluator.errors({n: (evaluator.session(load_model(p)), {}) for n, p in paths.items()}, against="minmax")
    reference = ort.InferenceSession(str(signal["fp32"]), providers=["CPUExecutionProvider"])
    sessions = {n: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for n, p in paths.items()}
    per_record = {n: [] for n in paths}
    for record in _records(signal["calib"], signal["fp32"]):
        y = reference.run(None, record)[0].astype(np.float64)
        for n, session in sessions.items():
            per_record[n].append(np.sum((session.run(None, record)[0] - y) ** 2) / np.sum(y * y))
    expected = int(np.sum(np.array(per_record["no-spike"]) < np.array(per_record["minmax"])))
    assert evaluator.wins == {"minmax": 0, "no-spike": expected}
    assert 0 < expected < 24  # the count is neither trivial nor all, so a wrong comparison shows


def test_only_a_majority_of_records_lets_a_choice_replace_min_max():
    """A choice better than min/max on the pooled error but on half the records or fewer is not
    trusted: min/max stays among the candidates whatever its count."""
    final = ["minmax", "ort-percentile", "per-tensor"]
    assert majority(final, {"minmax": 0, "ort-percentile": 4, "per-tensor": 5}, 8) == ["minmax", "per-tensor"]
    assert majority(final, {"minmax": 0, "ort-percentile": 8, "per-tensor": 3}, 8) == ["minmax", "ort-percentile"]
    assert majority(final, {}, 8) == ["minmax"]
    assert majority(final, {"ort-percentile": 9, "per-tensor": 9}, 17) == final


def test_the_cache_reuses_a_model_until_an_input_changes(signal, tmp_path):
    options = CalibrationOptions(method="minmax")
    first, made = calibrated_model(signal["fp32"], signal["calib"], tmp_path / "cache", options)
    assert made and first.is_file() and first.with_suffix(".json").is_file()
    stamp = first.stat().st_mtime_ns
    again, made = calibrated_model(signal["fp32"], signal["calib"], tmp_path / "cache", options)
    assert (again, made) == (first, False) and again.stat().st_mtime_ns == stamp
    key = content_key(signal["fp32"], signal["calib"], options)
    assert key != content_key(signal["fp32"], signal["calib"], CalibrationOptions(method="percentile"))
    assert key != content_key(signal["fp32"], signal["calib"], options, ["mm1"])
    changed = tmp_path / "calib2.npz"
    x = np.load(signal["calib"])["x"].copy()
    x[0, 0, 0] += 1
    np.savez(changed, x=x)
    assert key != content_key(signal["fp32"], changed, options)


def test_the_cache_key_changes_with_the_algorithm_revision(signal, monkeypatch):
    """A cache written before a method's answer changed is not taken for the new one's."""
    from pytest_qaccuracy.analysis.calibration import cache

    key = content_key(signal["fp32"], signal["calib"], CalibrationOptions(method="auto"))
    monkeypatch.setattr(cache, "ALGORITHM", cache.ALGORITHM + 1)
    assert content_key(signal["fp32"], signal["calib"], CalibrationOptions(method="auto")) != key


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--method", "entropy"], "invalid choice: 'entropy'"),
        (["--data", "EMPTY"], "no records"),
        (["--data", "NAN"], "contains NaN"),
        (["--activation-type", "int8", "--weight-type", "uint8"], "onnxruntime could not quantize the model"),
        (["--model", "NEVER_FINITE"], "held no finite value on any record"),
    ],
)
def test_cli_calibrate_bad_input_is_one_line_and_writes_nothing(signal, tmp_path, capsys, args, fragment):
    empty, nan = tmp_path / "empty.npz", tmp_path / "nan.npz"
    np.savez(empty, x=np.zeros((0, 1, 16), np.float32))
    np.savez(nan, x=np.full((3, 1, 16), np.nan, np.float32))
    args = [{"EMPTY": str(empty), "NAN": str(nan)}.get(a, a) for a in args]
    model = signal["fp32"]
    if args[0] == "--model":  # y = sqrt(-1 - x^2): NaN for every record
        graph = helper.make_graph(
            [
                helper.make_node("Mul", ["x", "x"], ["sq"]),
                helper.make_node("Sub", ["minus_one", "sq"], ["neg"]),
                helper.make_node("Sqrt", ["neg"], ["y"]),
            ],
            "nan",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
            [numpy_helper.from_array(np.array(-1.0, np.float32), "minus_one")],
        )
        model = tmp_path / "nan.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
        args = []
    if "--data" not in args:
        args = ["--data", str(signal["calib"]), *args]
    out = tmp_path / "q.onnx"
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["calibrate", str(model), "--method", "auto", *args, "--out", str(out)]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert fragment in err and err.strip().count("\n") == 0 and err.startswith("error:")
    assert not out.exists()


def test_the_chosen_model_is_written_once_unless_the_arguments_change(signal, tmp_path, monkeypatch):
    """auto keeps the model onnxruntime wrote for its choice: writing it with the same arguments copies
    it (byte for byte what onnxruntime writes from those ranges), other arguments quantize again."""
    options = CalibrationOptions(method="auto")
    result = compute_ranges(signal["fp32"], signal["calib"], options)
    assert result.model is not None
    fresh = quantize_with_ranges(signal["fp32"], tmp_path / "fresh.onnx", replace(result, model=None), options)
    calls = []
    import onnxruntime.quantization as oq

    original = oq.quantize_static
    monkeypatch.setattr(oq, "quantize_static", lambda *a, **k: calls.append(a) or original(*a, **k))
    copied = quantize_with_ranges(signal["fp32"], tmp_path / "copied.onnx", result, options)
    assert calls == [] and copied.read_bytes() == fresh.read_bytes()
    other = quantize_with_ranges(signal["fp32"], tmp_path / "other.onnx", result, options, ["mm2"])
    assert len(calls) == 1 and other.read_bytes() != fresh.read_bytes()


def test_auto_writes_qoperator_models_measured_as_qoperator(signal, tmp_path, capsys):
    """The choices are measured on the QDQ form, the finalists written and run as QOperator models."""
    out = tmp_path / "q.onnx"
    base = ["calibrate", str(signal["fp32"]), "--data", str(signal["calib"]), "--format", "qoperator"]
    assert main([*base, "--method", "auto", "--out", str(out), "--json", str(tmp_path / "q.json")]) == 0
    ops = {node.op_type for node in load_model(out).graph.node}
    assert "QLinearMatMul" in ops and "DequantizeLinear" in ops and "MatMul" not in ops
    report = json.loads((tmp_path / "q.json").read_text())["selection"]
    chosen = next(s for s in report["steps"] if s.get("verified") and s["choice"].startswith(report["chosen"] + ","))
    error = _output_error(signal["fp32"], out, signal["calib"])  # the written QOperator model, run here
    assert chosen["output_error"] == pytest.approx(error, rel=1e-9)
