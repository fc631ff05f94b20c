"""The pytest analysis' entry to the recipe search (``analysis/recipe/pair.py``), piece by piece: the
cost estimates that decide whether a ranking or a search runs at all, the split of the pair's own data
(a head calibrates, the rest is held out), the budget left for the search and for the measurement on
all the pair's records, and that measurement itself against onnxruntime run by hand."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.analysis.recipe import pair as recipe_pair
from pytest_qaccuracy.analysis.recipe.checks import parse_checks
from pytest_qaccuracy.analysis.recipe.space import Recipe
from tests.progress_recorders import Clock, record_closes

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
QDQ = SUITE / "models" / "digits_cnn.qdq.onnx"
TEST = SUITE / "data" / "digits_test.npz"


def _records(tmp_path: Path, count: int) -> Path:
    """The first ``count`` test digits as a dataset of their own."""
    with np.load(TEST) as found:
        x = found["x"][:count]
    path = tmp_path / f"digits_{count}.npz"
    np.savez(path, x=x)
    return path


def _dq_readers_model() -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> Relu, Mul(DQ, DQ) and Add(DQ, a Constant); a Sigmoid
    of the Relu, a Sigmoid of the graph input, and a QuantizeLinear of the DequantizeLinear (a
    requantization): three nodes read a DequantizeLinear, the five others do not count."""
    scale = helper.make_tensor("s", TensorProto.FLOAT, [], [0.1])
    zero = helper.make_tensor("z", TensorProto.UINT8, [], [128])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("cv", TensorProto.FLOAT, [4], [1, 2, 3, 4])),
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("Relu", ["xd"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["y1"]),
        helper.make_node("Add", ["xd", "c"], ["y2"]),
        helper.make_node("Sigmoid", ["x"], ["y3"]),
        helper.make_node("Mul", ["xd", "xd"], ["y4"]),
        helper.make_node("QuantizeLinear", ["xd", "s", "z"], ["y5"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dq_readers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("y1", "y2", "y3", "y4", "y5")],
        [scale, zero],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(("check", "share"), [(3.0, 0.25), (8.0, 1.0)])
def test_ranking_seconds_counts_the_nodes_that_read_a_dequantized_tensor(check, share):
    # three experiment nodes (Relu, Add, Mul) plus 14, each half a forward pass of the quantized model (a
    # check is one pass of each model) on ``share`` of the records
    assert recipe_pair.ranking_seconds(_dq_readers_model(), check, share) == pytest.approx(
        (3 + 14) * 0.5 * (check / 2) * share
    )


def test_first_experiment_is_a_check_and_a_quarter_plus_the_quantizer_per_node():
    nodes = len(onnx.load(str(FP32)).graph.node)
    assert nodes > 1
    assert recipe_pair.first_experiment_seconds(FP32, 4.0) == pytest.approx(1.25 * 4.0 + 0.01 * nodes)
    assert recipe_pair.first_experiment_seconds(str(FP32), 0.0) == pytest.approx(0.01 * nodes)


def test_a_budget_that_cannot_hold_one_experiment_searches_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(recipe_pair, "search_recipe", _no_search)
    first = recipe_pair.first_experiment_seconds(FP32, 2.0)
    found = recipe_pair.pair_recipe(
        FP32, QDQ, _records(tmp_path, 4), "cosine>=0.99", ["onnxruntime"], first - 0.05, 2.0
    )
    assert found.result is None and found.pair_data is None and found.calibration_records == 0
    assert found.note == (
        f"recipe not searched: budget ({first - 0.05:.1f}s left, one experiment takes about {first:.1f}s)"
    )


def test_exactly_one_experiment_of_budget_is_enough_to_search(monkeypatch, tmp_path):
    seen = _Search()
    monkeypatch.setattr(recipe_pair, "search_recipe", seen)
    first = recipe_pair.first_experiment_seconds(FP32, 2.0)
    found = recipe_pair.pair_recipe(FP32, QDQ, _records(tmp_path, 4), "cosine>=0.99", ["onnxruntime"], first, 2.0)
    assert found.note is None and seen.calls == 1


def test_one_record_cannot_be_split(monkeypatch, tmp_path):
    monkeypatch.setattr(recipe_pair, "search_recipe", _no_search)
    found = recipe_pair.pair_recipe(FP32, QDQ, _records(tmp_path, 1), "cosine>=0.99", ["onnxruntime"], 100.0, 1.0)
    assert found.result is None and found.calibration_records == 0
    assert found.note == "recipe not searched: 1 record(s) in the data; it needs one to calibrate and one held out"


def _no_search(*args, **kwargs):
    raise AssertionError("the search must not run")


class _Search:
    """``search_recipe``'s stand-in: writes down what it is given (the records of both halves, as
    arrays), writes ``model_out`` and returns a result whose best step is ``best``."""

    def __init__(
        self, best: object = "step", stopped: str = "budget", write: bool = True, clock: Clock | None = None
    ) -> None:
        self.best, self.stopped, self.write, self.clock = best, stopped, write, clock
        self.calls, self.kwargs, self.args = 0, {}, ()

    def __call__(self, fp32, calibration, evaluation, checks, targets, **kwargs):
        self.calls += 1
        if self.clock is not None:  # the search takes the budget it was given
            self.clock.now += kwargs["budget"].seconds
        self.args = (fp32, checks, targets)
        self.kwargs = kwargs
        self.calibration = [r["x"] for r in calibration.iter_records()]
        self.evaluation = [r["x"] for r in evaluation.iter_records()]
        if self.write:
            shutil.copy(QDQ, kwargs["model_out"])
        return SimpleNamespace(best_step=self.best, stopped=self.stopped)


class _Whole:
    """``on_pair_data``'s stand-in: writes down its arguments."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        return {"records": args[8], "stand-in": True}


@pytest.mark.parametrize("count", [5, 6])
def test_the_head_calibrates_and_the_rest_is_held_out(monkeypatch, tmp_path, count):
    data = _records(tmp_path, count)
    search, whole = _Search(), _Whole()
    monkeypatch.setattr(recipe_pair, "search_recipe", search)
    monkeypatch.setattr(recipe_pair, "on_pair_data", whole)
    closed = record_closes(monkeypatch, recipe_pair)
    labels = [{"boxes": i} for i in range(count)]
    found = recipe_pair.pair_recipe(
        FP32, QDQ, data, ["cosine>=0.99", "sqnr>=20"], ["onnxruntime"], 100.0, 2.0, task_targets=labels
    )
    head = math.ceil(count / 2)
    assert found.calibration_records == head and found.note is None
    with np.load(data) as original:
        x = original["x"]
    assert len(search.calibration) == head and len(search.evaluation) == count - head
    for i, record in enumerate(search.calibration + search.evaluation):
        np.testing.assert_array_equal(record.reshape(x[i].shape), x[i])
    assert search.kwargs["task_targets"] == labels[head:]
    assert search.kwargs["start"] == Recipe(activation_type="uint8", weight_type="int8", per_channel=False)
    assert search.kwargs["budget"].seconds == pytest.approx(98.0)  # one check kept for the whole data
    assert [str(c) for c in search.args[1]] == [str(c) for c in parse_checks(["cosine>=0.99", "sqnr>=20"])]
    # the probe, both halves: every dataset the call opened is closed
    assert closed == [data, data, data]
    (args,) = whole.calls
    assert args[0] == FP32 and args[1] == data and args[8] == count and args[9] is True
    assert args[7] == labels  # every record's targets: the whole data is measured
    assert found.pair_data == {"records": count, "stand-in": True}


@pytest.mark.parametrize(("extra", "fits"), [(1.0, False), (2.0, True), (2.5, True)])
def test_the_search_keeps_one_check_for_the_whole_data_when_it_can(monkeypatch, tmp_path, extra, fits):
    """The search gets the budget less one check when what is left still holds the first experiment,
    else all of it; the whole data is measured when the search leaves at least a check's time."""
    clock = Clock()
    search, whole = _Search(clock=clock), _Whole()
    monkeypatch.setattr(recipe_pair, "search_recipe", search)
    monkeypatch.setattr(recipe_pair, "on_pair_data", whole)
    monkeypatch.setattr(recipe_pair, "time", SimpleNamespace(monotonic=clock.monotonic))
    first = recipe_pair.first_experiment_seconds(FP32, 2.0)
    seconds = first + extra
    recipe_pair.pair_recipe(FP32, QDQ, _records(tmp_path, 4), "cosine>=0.99", ["onnxruntime"], seconds, 2.0)
    assert search.kwargs["budget"].seconds == pytest.approx(seconds - 2.0 if fits else seconds)
    assert search.kwargs["task_targets"] is None
    (args,) = whole.calls
    assert args[9] is fits


def test_a_single_check_text_is_a_list_of_one(monkeypatch, tmp_path):
    search = _Search(best=None)
    monkeypatch.setattr(recipe_pair, "search_recipe", search)
    (check,) = parse_checks(["sqnr>=20"])
    recipe_pair.pair_recipe(FP32, QDQ, _records(tmp_path, 4), check, ["onnxruntime"], 100.0, 2.0)
    assert [str(c) for c in search.args[1]] == ["sqnr >= 20"]


@pytest.mark.parametrize(
    ("best", "stopped", "write"),
    [(None, "budget", True), ("step", "interrupted", True), ("step", "budget", False)],
    ids=["no best recipe", "interrupted", "no model written"],
)
def test_the_whole_data_is_measured_only_for_a_best_model_that_exists(monkeypatch, tmp_path, best, stopped, write):
    whole = _Whole()
    monkeypatch.setattr(recipe_pair, "search_recipe", _Search(best, stopped, write))
    monkeypatch.setattr(recipe_pair, "on_pair_data", whole)
    found = recipe_pair.pair_recipe(FP32, QDQ, _records(tmp_path, 4), "cosine>=0.99", ["onnxruntime"], 100.0, 2.0)
    assert whole.calls == [] and found.pair_data is None and found.calibration_records == 2


def test_a_search_that_fails_still_closes_both_halves(monkeypatch, tmp_path):
    def failing(*args, **kwargs):
        raise RuntimeError("search failed")

    monkeypatch.setattr(recipe_pair, "search_recipe", failing)
    closed = record_closes(monkeypatch, recipe_pair)
    data = _records(tmp_path, 4)
    with pytest.raises(RuntimeError, match="search failed"):
        recipe_pair.pair_recipe(FP32, QDQ, data, "cosine>=0.99", ["onnxruntime"], 100.0, 2.0)
    assert closed == [data, data, data]


def test_the_whole_data_not_measured_says_why():
    found = recipe_pair.on_pair_data(FP32, TEST, QDQ, parse_checks(["cosine>=0.99"]), [], None, (), None, 7, False)
    assert found == {"records": 7, "note": "not measured on all the pair's records: budget"}


def _cosine_by_hand(fp32: Path, quantized: Path, data: Path) -> float:
    """The output's cosine over every record, onnxruntime run on each model record by record."""
    options = ort.SessionOptions()
    runs = [ort.InferenceSession(str(m), options, providers=["CPUExecutionProvider"]) for m in (fp32, quantized)]
    name = runs[0].get_inputs()[0].name
    with np.load(data) as found:
        x = found["x"]
    a, b = ([s.run(None, {name: x[i : i + 1]})[0].astype(np.float64).ravel() for i in range(len(x))] for s in runs)
    a, b = np.concatenate(a), np.concatenate(b)
    return float(a @ b / np.sqrt((a @ a) * (b @ b)))


@pytest.mark.parametrize(("bound", "met"), [(0.5, True), (0.999999, False)])
def test_the_whole_data_measured_is_the_pairs_own_check(tmp_path, bound, met):
    data = _records(tmp_path, 6)
    checks = parse_checks([f"cosine>={bound}"])
    found = recipe_pair.on_pair_data(FP32, data, QDQ, checks, ["onnxruntime"], None, (), None, 6, True)
    assert found["records"] == 6 and found["met"] is met
    ((target, per_output),) = found["measured"].items()
    ((output, metrics),) = per_output.items()
    assert target == "onnxruntime" and output == onnx.load(str(FP32)).graph.output[0].name
    cosine = _cosine_by_hand(FP32, QDQ, data)
    assert metrics["cosine"] == pytest.approx(cosine, abs=1e-6)
    assert (found["margin"] >= 0) is met


def _write(tmp_path: Path, name: str, nodes, inits, inputs=("x",), input_types=None) -> Path:
    """A hand-made QDQ graph (only read, never run): ``inits`` maps names to numpy arrays."""
    types = input_types or {}
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(i, types.get(i, TensorProto.FLOAT), None) for i in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _q(op, inputs, output, **attrs):
    return helper.make_node(op, inputs, [output], **attrs)


_F = np.float32
_SCALES = {"s": _F(0.1), "zi": np.int8(0), "zu": np.uint8(128)}


def test_a_graph_without_quantization_starts_from_the_defaults(tmp_path):
    path = _write(tmp_path, "plain", [helper.make_node("Relu", ["x"], ["y"])], {})
    assert recipe_pair.starting_recipe(path) == Recipe(activation_type="uint8", weight_type="int8", per_channel=False)


def test_nodes_without_a_constant_zero_point_are_passed_over(tmp_path):
    """A DequantizeLinear whose zero point is a graph input and a Relu (fewer than three inputs) come
    first; the int8 activations and uint8 weights after them are still read."""
    nodes = [
        _q("DequantizeLinear", ["xq", "s", "zin"], "xd0"),
        helper.make_node("Relu", ["x"], ["r"]),
        _q("QuantizeLinear", ["r", "s", "zi"], "rq"),
        _q("DequantizeLinear", ["rq", "s", "zi"], "rd"),
        _q("DequantizeLinear", ["w", "s", "zu"], "wd"),
        helper.make_node("MatMul", ["rd", "wd"], ["y"]),
    ]
    inits = {**_SCALES, "w": np.full((4, 2), 130, np.uint8)}
    path = _write(tmp_path, "passed_over", nodes, inits, inputs=("x", "xq", "zin"))
    assert recipe_pair.starting_recipe(path) == Recipe(activation_type="int8", weight_type="uint8", per_channel=False)


def test_the_activation_type_is_a_quantized_activations_not_a_weights_or_a_constants(tmp_path):
    """The weights' DequantizeLinear (uint8) and a quantized constant (uint8) come before the input's
    QuantizeLinear (int8), another quantized constant after it: the activations are int8."""
    nodes = [
        _q("DequantizeLinear", ["w", "s", "zu"], "wd"),
        _q("QuantizeLinear", ["c", "s", "zu"], "cq"),
        _q("DequantizeLinear", ["cq", "s", "zu"], "cd"),
        _q("QuantizeLinear", ["x", "s", "zi"], "xq"),
        _q("DequantizeLinear", ["xq", "s", "zi"], "xd"),
        helper.make_node("Add", ["xd", "cd"], ["a"]),
        _q("QuantizeLinear", ["c2", "s", "zu"], "c2q"),  # and one more after them
        _q("DequantizeLinear", ["c2q", "s", "zu"], "c2d"),
        helper.make_node("Mul", ["a", "c2d"], ["m"]),
        helper.make_node("MatMul", ["m", "wd"], ["y"]),
    ]
    inits = {**_SCALES, "w": np.full((4, 2), 130, np.uint8), "c": np.ones(4, _F), "c2": np.ones(4, _F)}
    path = _write(tmp_path, "constants_first", nodes, inits)
    assert recipe_pair.starting_recipe(path) == Recipe(activation_type="int8", weight_type="uint8", per_channel=False)


def test_an_already_quantized_input_is_not_the_activation_type(tmp_path):
    """A uint8 graph input dequantized first (an image fed as bytes) says nothing of the activations
    the quantizer made (int8)."""
    nodes = [
        _q("DequantizeLinear", ["image", "s", "zu"], "xd0"),
        _q("QuantizeLinear", ["xd0", "s", "zi"], "xq"),
        _q("DequantizeLinear", ["xq", "s", "zi"], "y"),
    ]
    path = _write(
        tmp_path, "bytes_in", nodes, dict(_SCALES), inputs=("image",), input_types={"image": TensorProto.UINT8}
    )
    assert recipe_pair.starting_recipe(path).activation_type == "int8"


def test_an_activation_read_as_a_matmuls_second_input_is_not_a_weight(tmp_path):
    """Attention's MatMul reads two activations (uint8): the weights' type is the int8 of the weight
    read later, not the activation's."""
    nodes = [
        _q("QuantizeLinear", ["x", "s", "zu"], "xq"),
        _q("DequantizeLinear", ["xq", "s", "zu"], "xd"),
        helper.make_node("MatMul", ["xd", "xd"], ["m"]),
        _q("QuantizeLinear", ["m", "s", "zu"], "mq"),
        _q("DequantizeLinear", ["mq", "s", "zu"], "md"),
        _q("DequantizeLinear", ["w", "s", "zi"], "wd"),
        helper.make_node("MatMul", ["md", "wd"], ["y"]),
    ]
    inits = {**_SCALES, "w": np.ones((4, 4), np.int8)}
    path = _write(tmp_path, "attention", nodes, inits)
    assert recipe_pair.starting_recipe(path) == Recipe(activation_type="uint8", weight_type="int8", per_channel=False)


@pytest.mark.parametrize(("channels", "per_channel"), [(1, False), (2, True), (3, True)])
def test_per_channel_weights_are_those_with_more_than_one_scale(tmp_path, channels, per_channel):
    """A weight dequantized with one scale per output channel (two are enough); a weight nothing reads
    (a dangling DequantizeLinear) is passed over."""
    nodes = [
        _q("DequantizeLinear", ["unused", "s", "zi"], "ud"),
        _q("QuantizeLinear", ["x", "s", "zu"], "xq"),
        _q("DequantizeLinear", ["xq", "s", "zu"], "xd"),
        _q("DequantizeLinear", ["w", "ws", "wz"], "wd", axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
    ]
    inits = {
        **_SCALES,
        "unused": np.ones(3, np.int8),
        "w": np.ones((4, channels), np.int8),
        "ws": np.full(channels, 0.5, _F).reshape(-1) if channels > 1 else _F(0.5),
        "wz": np.zeros(channels, np.int8) if channels > 1 else np.int8(0),
    }
    path = _write(tmp_path, f"channels_{channels}", nodes, inits)
    assert recipe_pair.starting_recipe(path) == Recipe(
        activation_type="uint8", weight_type="int8", per_channel=per_channel
    )


def test_two_records_are_enough_to_search(monkeypatch, tmp_path):
    search, whole = _Search(), _Whole()
    monkeypatch.setattr(recipe_pair, "search_recipe", search)
    monkeypatch.setattr(recipe_pair, "on_pair_data", whole)
    found = recipe_pair.pair_recipe(FP32, QDQ, _records(tmp_path, 2), "cosine>=0.99", ["onnxruntime"], 100.0, 2.0)
    assert found.note is None and found.calibration_records == 1
    assert len(search.calibration) == 1 and len(search.evaluation) == 1


def test_the_options_and_progress_reach_the_search_and_the_whole_data(monkeypatch, tmp_path):
    from pytest_qaccuracy.runtime import RuntimeOptions

    search, whole = _Search(), _Whole()
    monkeypatch.setattr(recipe_pair, "search_recipe", search)
    monkeypatch.setattr(recipe_pair, "on_pair_data", whole)
    options = RuntimeOptions(batch_size=3)

    def on_step(step, best):
        return None

    def on_note(text):
        return None

    recipe_pair.pair_recipe(
        FP32, QDQ, _records(tmp_path, 4), "cosine>=0.99", ["onnxruntime"], 100.0, 2.0, options=options,
        tasks=("ctc",), on_step=on_step, on_note=on_note,
    )  # fmt: skip
    assert search.kwargs["options"] is options and search.kwargs["tasks"] == ("ctc",)
    assert search.kwargs["on_step"] is on_step and search.kwargs["on_note"] is on_note
    (args,) = whole.calls
    assert args[5] is options and args[6] == ("ctc",)


class _Evaluator:
    """``measure.Evaluator``'s stand-in: keeps its arguments; every model passes with margin 0.5."""

    made: ClassVar[list] = []

    def __init__(self, fp32, data, checks, targets, options, tasks=(), task_targets=None):
        _Evaluator.made.append(dict(fp32=fp32, data=data, options=options, tasks=tasks, task_targets=task_targets))

    def measure(self, model):
        return SimpleNamespace(measured={"onnxruntime": {}}, passed=True, margin=0.5)


@pytest.mark.parametrize("targets", [None, ({"text": "ab"}, {"text": "c"})])
def test_the_whole_data_measurement_gets_every_records_targets_and_parsed_tasks(monkeypatch, targets):
    from pytest_qaccuracy.analysis.recipe import measure as measure_module
    from pytest_qaccuracy.metrics.task import parse_task_specs
    from pytest_qaccuracy.runtime import RuntimeOptions

    _Evaluator.made = []
    monkeypatch.setattr(measure_module, "Evaluator", _Evaluator)
    tasks = ["ctc"]
    found = recipe_pair.on_pair_data(FP32, TEST, QDQ, [], ["onnxruntime"], None, tasks, targets, 2, True)
    assert found == {"records": 2, "measured": {"onnxruntime": {}}, "met": True, "margin": 0.5}
    (made,) = _Evaluator.made
    assert made["task_targets"] == (None if targets is None else list(targets))
    assert isinstance(made["task_targets"], (list, type(None)))
    assert made["tasks"] == parse_task_specs(tasks) and made["options"] == RuntimeOptions()
