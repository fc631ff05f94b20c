"""compare()'s pass on a two-node QDQ pair, fast enough to run for every mutant of it.

The pair: ``h = x @ w`` then ``y = h + b`` in fp32; in QDQ form, int8 Q/DQ pairs (zero point 0) on
``x``, ``w``, ``h`` and ``y``. Every expected value is numpy's fake quantization of the same
arithmetic (ONNX rounds half to even, as ``np.rint``), or onnxruntime running the models on their own.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from pytest_qaccuracy.analysis import compare as compare_module
from pytest_qaccuracy.analysis.compare import compare
from pytest_qaccuracy.analysis.outputs import OutputMeasure
from pytest_qaccuracy.analysis.reference_cache import ReferenceCache
from pytest_qaccuracy.analysis.slices import SliceSpec
from pytest_qaccuracy.data import load_dataset
from pytest_qaccuracy.data.progress import reporting
from pytest_qaccuracy.errors import DataError, InputError
from pytest_qaccuracy.metrics import Metric
from pytest_qaccuracy.metrics.base import register_metric, unregister_metric
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.model.quant_params import QuantParams
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.progress_recorders import TaskRecorder, record_closes

W = np.array([[0.55, -1.05], [1.45, 2.1]], np.float32)
B = np.array([0.3, -0.2], np.float32)
SX, SW, SH, SY = 0.02, 0.05, 0.04, 0.05
WQ = np.rint(W / np.float32(SW)).astype(np.int8)
X = np.array([[1.31, -0.77], [0.23, 0.91], [-1.13, 0.47], [0.61, 0.29], [-0.33, -1.21]], np.float32)
MERGED = "onnxruntime: the sums of 3 of 3 layers computed in the merged graph"


def _models() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The fp32 model and its QDQ model (records on a dynamic first axis)."""
    tensor = numpy_helper.from_array
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 2])
    opset = [helper.make_opsetid("", 13)]
    fp32 = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
            helper.make_node("Add", ["h", "b"], ["y"], name="add"),
        ],
        "f",
        [x],
        [y],
        [tensor(W, "w"), tensor(B, "b")],
    )
    scales = [tensor(np.float32(s), n) for s, n in ((SX, "sx"), (SW, "sw"), (SH, "sh"), (SY, "sy"))]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "z"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "z"], ["xd"], name="dqx"),
        helper.make_node("DequantizeLinear", ["wq", "sw", "z"], ["wd"], name="dqw"),
        helper.make_node("MatMul", ["xd", "wd"], ["h"], name="mm"),
        helper.make_node("QuantizeLinear", ["h", "sh", "z"], ["hq"], name="qh"),
        helper.make_node("DequantizeLinear", ["hq", "sh", "z"], ["hd"], name="dqh"),
        helper.make_node("Add", ["hd", "b"], ["ya"], name="add"),
        helper.make_node("QuantizeLinear", ["ya", "sy", "z"], ["yq"], name="qy"),
        helper.make_node("DequantizeLinear", ["yq", "sy", "z"], ["y"], name="dqy"),
    ]
    quantized = helper.make_graph(
        nodes, "q", [x], [y], [*scales, tensor(np.int8(0), "z"), tensor(WQ, "wq"), tensor(B, "b")]
    )
    return helper.make_model(fp32, opset_imports=opset), helper.make_model(quantized, opset_imports=opset)


def _fq(value: np.ndarray, scale: float) -> np.ndarray:
    """QuantizeLinear then DequantizeLinear, int8 with zero point 0."""
    return (np.clip(np.rint(value / np.float32(scale)), -128, 127) * np.float32(scale)).astype(np.float32)


def _expected(x: np.ndarray = X) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per compared tensor, its fp32 and its quantized values."""
    h = x @ W
    hq = _fq(_fq(x, SX) @ (WQ.astype(np.float32) * np.float32(SW)), SH)
    return {"x": (x, _fq(x, SX)), "h": (h, hq), "y": (h + B, _fq(hq + B, SY))}


def _mse(f: np.ndarray, q: np.ndarray) -> float:
    return float(np.mean((f.astype(np.float64) - q) ** 2))


@pytest.fixture
def pair() -> ModelPair:
    fp32, quantized = _models()
    return ModelPair(fp32, quantized)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.npz"
    np.savez(path, x=X)
    return path


class Measure(OutputMeasure):
    """An output measure that also records what the pass hands it."""

    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.calls: list[tuple] = []

    def begin(self, dataset, outputs) -> None:
        self.calls.append(("begin", type(dataset).__name__, list(outputs)))
        super().begin(dataset, outputs)

    def update(self, ref, test, start: int, count: int) -> None:
        self.calls.append(("update", start, count, sorted(ref), sorted(test)))
        np.testing.assert_array_equal(ref["y"], _expected()["y"][0][start : start + count])
        np.testing.assert_allclose(test["y"], _expected()["y"][1][start : start + count], rtol=1e-6)
        super().update(ref, test, start, count)


def _whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the pass run on whole tensors, as it does when the merged graph cannot serve."""
    monkeypatch.setattr(compare_module, "start_reduced", lambda *args: (None, "numpy: made so"))


@pytest.mark.parametrize("path", ["merged", "whole"])
def test_every_tensor_is_compared_against_numpy_on_both_paths(pair, data, monkeypatch, path: str) -> None:
    if path == "whole":
        _whole(monkeypatch)
    result = compare(pair, data, "mse,max_abs", RuntimeOptions(batch_size=2), capture="reference")
    expected = _expected()
    assert result.records == 5 and result.data == "data.npz"
    assert (result.fp32_model, result.quantized_model) == ("fp32.onnx", "quantized.onnx")
    assert result.reduction == (MERGED if path == "merged" else "numpy: made so")
    assert (result.backend, result.scheme, result.capture) == ("onnxruntime", None, "reference")
    assert [layer.tensor for layer in result.layers] == ["x", "h", "y"]
    for layer in result.layers:
        f, q = expected[layer.tensor]
        assert layer.metrics["mse"] == pytest.approx(_mse(f, q), rel=1e-5)
        assert layer.metrics["max_abs"] == pytest.approx(float(np.abs(f - q).max()), rel=1e-5)
    (output,) = result.outputs
    f, q = expected["y"]
    assert output.name == "y" and output.quantized_tensor == "y"
    assert output.metrics["mse"] == pytest.approx(_mse(f, q), rel=1e-5)
    # the five records, worst first, with their own errors
    per_record = [float(np.mean((f[r].astype(np.float64) - q[r]) ** 2)) for r in range(5)]
    worst = sorted(range(5), key=lambda r: -per_record[r])
    assert [r for r, _ in output.worst_records["mse"]] == worst
    assert [v for _, v in output.worst_records["mse"]] == pytest.approx([per_record[r] for r in worst], rel=1e-5)
    assert result.metric_definitions.keys() == {"mse", "max_abs"}
    assert result.higher_is_better == {"mse": False, "max_abs": False}


@pytest.mark.parametrize("path", ["merged", "whole"])
def test_the_pass_reports_one_compare_task_over_the_records_and_uses_the_threads_asked(
    pair, data, monkeypatch, path: str
) -> None:
    if path == "whole":
        _whole(monkeypatch)
    pools: list[int] = []
    real = compare_module.ThreadPoolExecutor

    def pool(max_workers: int):
        pools.append(max_workers)
        return real(max_workers)

    monkeypatch.setattr(compare_module, "ThreadPoolExecutor", pool)
    progress = TaskRecorder()
    with reporting(progress):
        compare(pair, data, "mse", RuntimeOptions(batch_size=2, threads=3))
    assert progress.tasks == [["compare", 5, 5]]
    assert pools == [3]


@pytest.mark.parametrize("path", ["merged", "whole"])
def test_a_measure_begins_once_with_the_outputs_and_gets_every_batch(pair, data, monkeypatch, path: str) -> None:
    if path == "whole":
        _whole(monkeypatch)
    measure = Measure(atol=0.01)
    compare(pair, data, "mse", RuntimeOptions(batch_size=2), capture="reference", measure=measure)
    assert measure.calls == [
        ("begin", "NpzDataset", ["y"]),
        ("update", 0, 2, ["y"], ["y"]),
        ("update", 2, 2, ["y"], ["y"]),
        ("update", 4, 1, ["y"], ["y"]),
    ]
    f, q = _expected()["y"]
    assert measure.result().relative["y"].violations == np.count_nonzero(np.abs(f - q) > 0.01)


def test_nonfinite_inputs_are_refused_unless_allowed(pair, tmp_path) -> None:
    x = X.copy()
    x[1, 0] = np.nan
    np.savez(tmp_path / "nan.npz", x=x)
    with pytest.raises(DataError, match=r"record 1, input 'x': contains NaN"):
        compare(pair, tmp_path / "nan.npz", "max_abs", layers=False)
    result = compare(pair, tmp_path / "nan.npz", "max_abs", layers=False, allow_nonfinite=True)
    assert result.records == 5


def test_a_view_of_an_unknown_output_or_named_as_an_output_is_an_input_error(pair, data) -> None:
    with pytest.raises(InputError) as err:
        compare(pair, data, "mse", slices=[SliceSpec("first", "z[:, 0]")])
    assert str(err.value) == "slice 'first': no output 'z' (outputs: y)"
    with pytest.raises(InputError) as err:
        compare(pair, data, "mse", slices=[SliceSpec("y", "y[:, 0]")])
    assert str(err.value) == "slice 'y': an output has this name; name the view differently"
    # a view compares its part of the output as an output of its own
    result = compare(pair, data, "max_abs", slices=[SliceSpec("second", "y[:, 1]")], capture="reference")
    f, q = _expected()["y"]
    second = result.output("second")
    assert second.quantized_tensor == "y[:, 1]"
    assert second.metrics["max_abs"] == pytest.approx(float(np.abs(f[:, 1] - q[:, 1]).max()), rel=1e-5)


class _Runners:
    """Records the labels and fetched tensors of the runners compare() builds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.made: list[tuple[str, list[str]]] = []
        real = compare_module.OrtRunner

        def runner(model, names, options, label):
            self.made.append((label, list(names)))
            return real(model, names, options, label)

        monkeypatch.setattr(compare_module, "OrtRunner", runner)


def test_deployed_outputs_come_from_each_model_run_alone_when_layers_are_fetched(pair, data, monkeypatch) -> None:
    _whole(monkeypatch)
    runners = _Runners(monkeypatch)
    result = compare(pair, data, "max_abs", RuntimeOptions(batch_size=5), capture="deployed")
    assert runners.made == [
        ("fp32.onnx (outputs)", ["y"]),
        ("quantized.onnx (outputs)", ["y"]),
        ("fp32.onnx", ["y", "x", "h", "y"]),
    ]
    # the output is the quantized model's own float output
    _, quantized = _models()
    session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    deployed = session.run(["y"], {"x": X})[0]
    assert result.output("y").metrics["max_abs"] == pytest.approx(float(np.abs(X @ W + B - deployed).max()), rel=1e-6)
    # only the outputs compared, or the reference capture: the pass's own runs give them
    runners.made.clear()
    compare(pair, data, "max_abs", capture="deployed", layers=False)
    compare(pair, data, "max_abs", capture="reference")
    assert runners.made == [("fp32.onnx", ["y"]), ("fp32.onnx", ["y", "x", "h", "y"])]


def test_a_deployed_output_is_taken_as_the_model_gives_it_with_its_parameters() -> None:
    fp32, quantized = _models()
    pair = ModelPair(fp32, quantized)
    (plain,) = compare_module._output_trackers(pair, ["mse"])
    assert (plain.capture, plain.dequantized, float(plain.params.scale)) == ("yq", False, np.float32(SY))
    (deployed,) = compare_module._output_trackers(pair, ["mse"], as_deployed=True)
    assert (deployed.capture, deployed.dequantized, float(deployed.params.scale)) == ("y", True, np.float32(SY))
    # a view follows its output's capture
    view = SliceSpec("first", "y[:, 0]")
    _, taken = compare_module._output_trackers(pair, ["mse"], [view], as_deployed=True)
    assert (taken.fp32, taken.capture, taken.dequantized, taken.view) == ("y", "y", True, view)
    assert taken.worst == {} and taken.target == "output 'first'"
    _, plain_view = compare_module._output_trackers(pair, ["mse"], [view])
    assert (plain_view.capture, plain_view.dequantized) == ("yq", False)


def test_deployed_outputs_only_with_inner_tensors_on_onnxruntimes_deployed_capture(pair) -> None:
    options = RuntimeOptions()
    made = compare_module._deployed_outputs
    assert made(pair, options, options, "deployed", "onnxruntime", False) is None
    assert made(pair, options, options, "reference", "onnxruntime", True) is None
    assert made(pair, options, options, "deployed", "integer", True) is None
    runs = made(pair, options, options, "deployed", "onnxruntime", True)
    assert isinstance(runs, compare_module._DeployedOutputs)
    assert (runs.fp32.tensors, runs.fp32.label) == (["y"], "fp32.onnx (outputs)")
    assert (runs.quantized.tensors, runs.quantized.label) == (["y"], "quantized.onnx (outputs)")


def test_a_reference_cache_gets_the_fp32_values_and_can_recompute_them(pair, data, monkeypatch) -> None:
    cache = ReferenceCache(["y", "h"])
    compare(pair, data, "mse", RuntimeOptions(batch_size=2), capture="reference", reference=cache)
    runners = _Runners(monkeypatch)
    assert cache.covers(["y", "h"]) and not cache.covers(["x"])
    from pytest_qaccuracy.data import bind_dataset

    with load_dataset(data) as dataset:
        batches = list(bind_dataset(dataset, pair.inputs).iter_batches(2))
        # the merged graph reduces the layer h, so its batches are computed on request, as the pass does
        values = cache.values(batches[1])
        np.testing.assert_allclose(values["h"], X[2:4] @ W, rtol=1e-6)
        np.testing.assert_allclose(values["y"], X[2:4] @ W + B, rtol=1e-6)
    assert cache.held_batches == 0 and cache.recomputed == 1
    # its runner fetches what the pass's fp32 side fetched, under a name of its own
    assert runners.made == [("fp32.onnx (fp32 reference)", ["y", "x", "h"])]
    # on whole tensors every batch is kept
    whole = ReferenceCache(["y", "h"])
    compare(pair, data, "mse", RuntimeOptions(batch_size=2), capture="reference", layers=False, reference=whole)
    assert whole.covers(["y"]) and not whole.covers(["h"])


def test_a_reference_cache_keeps_the_merged_graphs_values_only_at_one_opset(pair, data) -> None:
    kept = ReferenceCache(["y"])
    compare(pair, data, "mse", RuntimeOptions(batch_size=2), capture="reference", reference=kept)
    assert kept.held_batches == 3
    fp32, quantized = _models()
    fp32.opset_import[0].version = 17
    other = ReferenceCache(["y"])
    compare(ModelPair(fp32, quantized), data, "mse", RuntimeOptions(batch_size=2), reference=other)
    assert other.held_batches == 0 and other.covers(["y"])


def test_an_output_whose_shapes_differ_is_an_input_error_and_a_layer_unmatched(tmp_path, data) -> None:
    fp32, quantized = _models()
    # the quantized model's h and y get a third column from a wider weight
    wide = np.concatenate([WQ, WQ[:, :1]], axis=1)
    for init in quantized.graph.initializer:
        if init.name == "wq":
            init.CopyFrom(numpy_helper.from_array(wide, "wq"))
        if init.name == "b":
            init.CopyFrom(numpy_helper.from_array(np.array([0.3, -0.2, 0.1], np.float32), "b"))
    quantized.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 3
    pair = ModelPair(fp32, quantized)
    with pytest.raises(InputError) as err:
        compare(pair, data, "mse", capture="reference", layers=False)
    assert str(err.value) == "output 'y': shape (2,) in the fp32 model but (3,) in the quantized model"
    # a layer whose shapes differ is reported unmatched, not dropped; the layers after it stay
    trackers = [compare_module._tracker(name, name, None, ["mse", "srmse"]) for name in ("x", "h", "y")]
    for tracker in trackers:
        tracker.update(*_expected()[tracker.fp32], 0)
    trackers[1].problem = "shape"
    (output,) = compare_module._output_trackers(pair, ["mse", "srmse"])
    with load_dataset(data) as dataset:
        result = compare_module._result(
            pair, dataset, ["mse", "srmse"], 5, [output], pair.matching.matches, trackers, "reference", None
        )
    # without parameters a layer has no step: no SRMSE (it says why) and no channel ranges
    assert result.layers[0].undefined == {"srmse": "the quantized tensor has no scale"}
    assert result.layers[0].channels is None and result.layers[0].scale == pytest.approx(SX)  # the match's
    assert [layer.tensor for layer in result.layers] == ["x", "y"]
    assert result.unmatched_fp32 == ["h"] and result.unmatched_quantized == ["hd"]
    assert result.layers[1].metrics["mse"] == pytest.approx(_mse(*_expected()["y"]))


def test_a_result_takes_the_runners_backend_scheme_and_capture_and_the_layers_scale(pair, data) -> None:
    class Runner:
        backend, scheme_name, capture = "integer", "tflite", "emulated"

    matches = pair.matching.matches
    trackers = [compare_module._tracker(m.fp32, m.capture, m.params, ["sqnr"]) for m in matches]
    for tracker, match in zip(trackers, matches, strict=True):  # each capture is the int8 codes
        f, q = _expected()[match.fp32]
        tracker.update(f, np.rint(q / np.float32(match.params.scale)).astype(np.int8), 0)
    outputs = [compare_module._tracker("y", "y", None, ["sqnr"], worst=True)]
    outputs[0].update(*_expected()["y"], 0)
    with load_dataset(data) as dataset:
        result = compare_module._result(pair, dataset, ["sqnr"], 5, outputs, matches, trackers, "deployed", Runner())
        plain = compare_module._result(pair, dataset, ["sqnr"], 5, outputs, matches, trackers, "deployed", None)
    assert (result.backend, result.scheme, result.capture) == ("integer", "tflite", "emulated")
    assert (plain.backend, plain.scheme, plain.capture) == ("onnxruntime", None, "deployed")
    assert result.higher_is_better == {"sqnr": True} and list(result.metric_definitions) == ["sqnr"]
    layer = result.layers[1]
    assert (layer.tensor, layer.quantized_tensor, layer.node, layer.op_type, layer.order) == (
        "h",
        "hd",
        "mm",
        "MatMul",
        0,
    )
    assert layer.matched_by == "name" and layer.scale == pytest.approx(SH)
    f, q = _expected()["h"]
    assert layer.metrics["sqnr"] == pytest.approx(
        20 * math.log10(np.linalg.norm(f) / np.linalg.norm(f.astype(np.float64) - q)), rel=1e-6
    )
    assert result.records == 5 and result.data == "data.npz"


def test_outputs_are_read_from_the_models_run_alone_and_layers_from_the_pass(pair, data, monkeypatch) -> None:
    """With layers fetched in deployed capture, the outputs' trackers read the deployed runs' float
    outputs (here shifted by 0.5, to tell them apart), the layers the pass's own tensors."""
    _whole(monkeypatch)

    class Shifted(compare_module._DeployedOutputs):
        def outputs(self, batch, ref, test):
            ref, test = super().outputs(batch, ref, test)
            return ref, {**test, "y": test["y"] + np.float32(0.5)}

    monkeypatch.setattr(compare_module, "_DeployedOutputs", Shifted)
    result = compare(pair, data, "max_abs", RuntimeOptions(batch_size=2), capture="deployed")
    f, q = _expected()["y"]
    assert result.output("y").metrics["max_abs"] == pytest.approx(float(np.abs(f - q - 0.5).max()), rel=1e-5)
    layer = next(layer for layer in result.layers if layer.tensor == "y")
    assert layer.metrics["max_abs"] == pytest.approx(float(np.abs(f - q).max()), rel=1e-5)


class _Starts(Metric):
    """A registered metric that keeps where each batch it folds starts (its records, in order)."""

    name = "batch_starts"
    formula = "the first record of each batch (a test metric)"
    seen: ClassVar[list[tuple[int, int]]] = []

    def update(self, pair) -> None:
        self.seen.append((pair.first_record, pair.records))

    def merge(self, other) -> None:
        pass

    def result(self):
        return 1.0, None


@pytest.fixture
def starts():
    register_metric(_Starts)
    _Starts.seen.clear()
    yield _Starts.seen
    unregister_metric("batch_starts")


def test_a_registered_metric_sees_where_each_batch_starts_in_layers_and_outputs(pair, data, starts) -> None:
    result = compare(pair, data, "batch_starts", RuntimeOptions(batch_size=2, threads=1), capture="reference")
    assert result.reduction == "numpy: no layer has only built-in metrics on float32/integer tensors"
    # the output y, then the layers x, h and y, batch after batch
    assert starts == [(start, count) for start, count in ((0, 2), (2, 2), (4, 1)) for _ in range(4)]


def test_the_quantized_runner_is_named_after_its_file_and_the_result_after_its_backend(pair, data, monkeypatch) -> None:
    labels = []
    real = compare_module.make_runner

    def runner(model, names, options, label, backend, scheme):
        labels.append((label, backend, scheme))
        return real(model, names, options, label, backend, scheme)

    monkeypatch.setattr(compare_module, "make_runner", runner)
    result = compare(pair, data, "max_abs", backend="integer", scheme="onnxruntime-vnni", capture="reference")
    assert labels == [("quantized.onnx", "integer", "onnxruntime-vnni")]
    assert (result.backend, result.scheme, result.capture) == ("integer", "onnxruntime-vnni", "emulated")
    assert result.reduction == "numpy: the integer backend"
    # the integer backend's int8 MatMul and requantization give the fake-quantized values here
    f, q = _expected()["h"]
    assert result.layers[1].metrics["max_abs"] == pytest.approx(float(np.abs(f - q).max()), rel=1e-5)


def test_a_dataset_passed_in_stays_open_and_one_opened_from_a_path_is_closed(pair, data, monkeypatch) -> None:
    with load_dataset(data) as dataset:
        first = compare(pair, dataset, "mse", layers=False)
        again = compare(pair, dataset, "mse", layers=False)
        assert again.output("y").metrics == first.output("y").metrics
        assert dataset.labels() is None  # still readable
    closed = record_closes(monkeypatch, compare_module)
    compare(pair, data, "mse", layers=False)
    compare(pair, data, "mse")
    assert closed == [data, data]


def test_a_reference_cache_keeps_every_batch_of_the_whole_tensor_pass(pair, data, monkeypatch) -> None:
    _whole(monkeypatch)
    cache = ReferenceCache(["y"])
    compare(pair, data, "mse", RuntimeOptions(batch_size=2), capture="reference", reference=cache)
    assert cache.held_batches == 3
    from pytest_qaccuracy.data import bind_dataset

    with load_dataset(data) as dataset:
        batches = list(bind_dataset(dataset, pair.inputs).iter_batches(2))
        np.testing.assert_allclose(cache.values(batches[2])["y"], X[4:] @ W + B, rtol=1e-6)
    assert cache.recomputed == 0


def test_a_0d_output_is_the_value_of_every_record(data) -> None:
    fp32, quantized = _models()
    for model in (fp32, quantized):  # s = sum(x): one value for the whole batch
        model.graph.node.append(helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0))
        model.graph.output.append(helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, []))
    quantized.graph.node[-1].input[0] = "xd"
    result = compare(ModelPair(fp32, quantized), data, "max_abs", RuntimeOptions(batch_size=5), layers=False)
    difference = abs(float(np.sum(X)) - float(np.sum(_fq(X, SX))))
    assert result.output("s").metrics["max_abs"] == pytest.approx(difference, rel=1e-4)
    assert sorted(r for r, _ in result.output("s").worst_records["max_abs"]) == [0, 1, 2, 3, 4]


def test_a_float_output_that_a_quantizelinear_reads_is_compared_as_the_model_gives_it(data) -> None:
    """The quantized model's output y is its float Add, before the Q/DQ pair that feeds r = Relu."""
    fp32, quantized = _models()
    add, quantize, dequantize = quantized.graph.node[6:9]
    add.output[0], quantize.input[0], dequantize.output[0] = "y", "y", "yd"
    quantized.graph.node.append(helper.make_node("Relu", ["yd"], ["r"]))
    fp32.graph.node.append(helper.make_node("Relu", ["y"], ["r"]))
    for model in (fp32, quantized):
        model.graph.output.append(helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, ["n", 2]))
    result = compare(ModelPair(fp32, quantized), data, "max_abs,srmse", layers=False, capture="reference")
    # a float output has no step: SRMSE is undefined, and the output says why
    assert result.output("y").metrics["srmse"] is None
    assert result.output("y").undefined == {"srmse": "the quantized tensor has no scale"}
    assert result.output("y").channels is None and result.output("r").channels is None
    h, hq = _expected()["h"]
    assert result.output("y").metrics["max_abs"] == pytest.approx(float(np.abs(h - hq).max()), rel=1e-5)
    relu = np.maximum(_fq(hq + B, SY), 0)
    assert result.output("r").metrics["max_abs"] == pytest.approx(
        float(np.abs(np.maximum(h + B, 0) - relu).max()), rel=1e-5
    )


def test_workers_are_the_threads_asked_else_the_cores_else_one(monkeypatch) -> None:
    assert compare_module._workers(RuntimeOptions(threads=1)) == 1
    monkeypatch.setattr(compare_module.os, "cpu_count", lambda: None)
    assert compare_module._workers(RuntimeOptions(threads=0)) == 1
    monkeypatch.setattr(compare_module.os, "cpu_count", lambda: 6)
    assert compare_module._workers(RuntimeOptions(threads=0)) == 6


def test_an_outputs_channel_ranges_are_in_its_result(pair, data) -> None:
    result = compare(pair, data, "mse,sqnr", capture="reference")
    f = _expected()["y"][0]
    steps = (f.max(axis=0) - f.min(axis=0)) / np.float32(SY)  # each channel's fp32 range in steps
    channels = result.output("y").channels
    assert (channels.axis, channels.scale) == (1, pytest.approx(SY))
    assert (channels.min_steps, channels.max_steps) == (
        pytest.approx(steps.min(), rel=1e-5),
        pytest.approx(steps.max(), rel=1e-5),
    )
    assert result.output("y").undefined == {}
    # and a layer's, in its own steps
    f = _expected()["h"][0]
    steps = (f.max(axis=0) - f.min(axis=0)) / np.float32(SH)
    channels = result.layers[1].channels
    assert (channels.axis, channels.scale) == (1, pytest.approx(SH))
    assert (channels.min_steps, channels.max_steps) == (
        pytest.approx(steps.min(), rel=1e-5),
        pytest.approx(steps.max(), rel=1e-5),
    )


def test_per_channel_steps_and_saturation_follow_the_scales_axis() -> None:
    """A rank-3 tensor quantized per channel on its last axis (3 channels; axis 1 has 3 too)."""
    rng = np.random.default_rng(7)
    scale = np.array([0.5, 0.05, 0.005], np.float32)
    ref = (rng.standard_normal((4, 3, 3)) * np.array([60.0, 6.0, 0.6])).astype(np.float32)
    codes = np.clip(np.rint(ref / scale + rng.integers(-3, 4, ref.shape)), -128, 127).astype(np.int8)
    params = QuantParams(scale, np.zeros(3, np.int8), axis=-1)
    tracker = compare_module._tracker("t", "tq", params, ["lsb", "clipped"])
    tracker.update(ref, codes, 0)
    test = codes.astype(np.float32) * scale  # channels on the last axis
    steps = np.abs(ref.astype(np.float64) - test) / scale
    outside = (ref < (-128.5 * scale)) | (ref >= 127.5 * scale)
    values, _ = tracker.results()
    assert values["lsb"] == pytest.approx(float(steps.max()), rel=1e-5)
    assert values["clipped"] == pytest.approx(np.count_nonzero(outside) / ref.size)
    assert 0 < np.count_nonzero(outside) < ref.size


def test_worst_records_skip_a_metric_without_record_values_and_an_undefined_reason_is_given() -> None:
    tracker = compare_module._tracker("y", "y", None, ["srmse", "mse"], worst=True)
    tracker.update(np.zeros((2, 2), np.float32), np.array([[1, 1], [2, 2]], np.float32), 0)
    assert tracker.worst_records() == {"mse": [(1, 4.0), (0, 1.0)]}

    class NoValue:
        def result(self):
            return None, None

    tracker.metrics = {"nothing": NoValue(), "empty": SimpleNamespace(result=lambda: (None, ""))}
    assert tracker.results() == ({"nothing": None, "empty": None}, {"nothing": "undefined", "empty": "undefined"})
