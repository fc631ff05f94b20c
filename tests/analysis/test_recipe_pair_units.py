"""The pytest analysis' entry to the recipe search (``analysis/recipe/pair.py``), piece by piece: the
cost estimates that decide whether a ranking or a search runs at all, the split of the pair's own data
(a head calibrates, the rest is held out), the budget left for the search and for the measurement on
all the pair's records, and that measurement itself against onnxruntime run by hand."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.analysis.recipe import pair as recipe_pair
from pytest_qaccuracy.analysis.recipe.checks import parse_checks
from pytest_qaccuracy.analysis.recipe.space import Recipe
from tests.progress_recorders import record_closes

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
    """x -> QuantizeLinear -> DequantizeLinear -> Relu, and Add(that DQ, a Constant); a Sigmoid of the
    Relu and a Sigmoid of the graph input: two nodes read a DequantizeLinear, four do not count."""
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
    ]
    graph = helper.make_graph(
        nodes,
        "dq_readers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("y1", "y2", "y3")],
        [scale, zero],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(("check", "share"), [(3.0, 0.25), (8.0, 1.0)])
def test_ranking_seconds_counts_the_nodes_that_read_a_dequantized_tensor(check, share):
    # two experiment nodes (Relu, Add) plus 14, each half a forward pass of the quantized model (a
    # check is one pass of each model) on ``share`` of the records
    assert recipe_pair.ranking_seconds(_dq_readers_model(), check, share) == pytest.approx(
        (2 + 14) * 0.5 * (check / 2) * share
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


class _Clock:
    """``time.monotonic``'s stand-in, moved on by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _Search:
    """``search_recipe``'s stand-in: writes down what it is given (the records of both halves, as
    arrays), writes ``model_out`` and returns a result whose best step is ``best``."""

    def __init__(
        self, best: object = "step", stopped: str = "budget", write: bool = True, clock: _Clock | None = None
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
    clock = _Clock()
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
