"""Unit tests of the sensitivity analyses' parts: rankings, experiments, chunks before a deadline,
the experiment runner's plumbing, and the saturation report's arithmetic and weight rewrites.

Expected values are worked by hand from the docstrings (docs/sensitivity.md, docs/saturation.md),
or computed by numpy and onnxruntime; none is read back from the code under test.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from pytest_qaccuracy.analysis import experiments as experiments_module
from pytest_qaccuracy.analysis import saturation
from pytest_qaccuracy.analysis.deadline import DeadlineReached
from pytest_qaccuracy.analysis.experiments import Experiment, ExperimentRunner, metric_mean
from pytest_qaccuracy.analysis.partial import QuantizedNode
from pytest_qaccuracy.analysis.sensitivity import (
    NodeSensitivity,
    SensitivityResult,
    Session,
    checked,
    measure_until,
    node_experiments,
    node_sensitivity,
    outputs_dict,
    rank,
    sensitivity_cache,
    sensitivity_in,
)
from pytest_qaccuracy.errors import InputError, ModelError
from pytest_qaccuracy.runtime import RuntimeOptions

# -- sensitivity.py: rankings and results ---------------------------------------------------------


def _node(name: str, order: int, **metrics: float | None) -> NodeSensitivity:
    return NodeSensitivity(name, "Conv", order, metrics)


NODES = [_node("a", 0, cosine=0.9, mse=1.0), _node("b", 1, cosine=0.5, mse=3.0), _node("c", 2, cosine=None, mse=2.0)]
NODES.append(_node("d", 3, cosine=0.5, mse=None))


def _names(nodes) -> list[str]:
    return [n.node for n in nodes]


def test_rank_puts_the_worst_first_in_single_mode_and_flips_for_leave_one_out() -> None:
    better = {"cosine": True, "mse": False}
    # single: the lowest cosine first (ties in topological order), undefined last
    assert _names(rank(NODES, "cosine", better)) == ["b", "d", "a", "c"]
    assert _names(rank(NODES, "cosine", better, "single")) == ["b", "d", "a", "c"]
    # leave-one-out: the node whose float copy gives the best cosine first
    assert _names(rank(NODES, "cosine", better, "leave-one-out")) == ["a", "b", "d", "c"]
    assert _names(rank(NODES, "mse", better)) == ["b", "c", "a", "d"]
    assert _names(rank(NODES, "mse", better, "leave-one-out")) == ["a", "c", "b", "d"]
    # a metric higher_is_better does not name is an error: the largest first
    assert _names(rank(NODES, "mse", {})) == ["b", "c", "a", "d"]
    # ties on an undefined value keep topological order too
    assert _names(rank([_node("y", 5), _node("x", 4)], "mse", {})) == ["x", "y"]


def _result(**fields) -> SensitivityResult:
    base = dict(
        fp32_model="f.onnx",
        quantized_model="q.onnx",
        data="d.npz",
        records=3,
        mode="single",
        granularity="node",
        metric_definitions={"mse": "mean((f-q)^2)", "cosine": "cos"},
        higher_is_better={"mse": False, "cosine": True},
        nodes=NODES,
    )
    return SensitivityResult(**{**base, **fields})


def test_a_result_ranks_by_its_first_metric_and_says_when_a_deadline_stopped_it() -> None:
    result = _result()
    assert result.metric_names == ["mse", "cosine"]
    assert _names(result.ranked()) == ["b", "c", "a", "d"]
    assert _names(result.ranked("cosine")) == ["b", "d", "a", "c"]
    assert _names(_result(mode="leave-one-out").ranked()) == ["a", "c", "b", "d"]
    assert result.stopped is None
    stopped = _result(unmeasured=["e", "f", "g"])
    assert stopped.stopped == "ranking stopped at the budget after 4 of 7 nodes"
    assert "unmeasured" not in result.to_dict() and stopped.to_dict()["unmeasured"] == ["e", "f", "g"]


def test_a_result_reads_back_only_from_its_own_kind_and_version() -> None:
    data = _result(baseline={"mse": 0.5, "cosine": float("nan")}).to_dict()
    assert data["schema_version"] == 1 and data["kind"] == "sensitivity"
    assert data["baseline"] == {"mse": 0.5, "cosine": None}
    again = SensitivityResult.from_dict(data)
    assert _names(again.nodes) == ["a", "b", "c", "d"] and again.baseline == {"mse": 0.5, "cosine": None}
    assert checked(data, "sensitivity") is data
    message = "not a sensitivity result (schema_version 1, kind 'sensitivity')"
    for bad in ({**data, "schema_version": 2}, {**data, "kind": "sweep"}, {"kind": "sensitivity"}):
        with pytest.raises(ValueError) as err:
            SensitivityResult.from_dict(bad)
        assert str(err.value) == message
    with pytest.raises(ValueError, match=r"^not a sweep result \(schema_version 1, kind 'sweep'\)$"):
        checked(data, "sweep")


def test_outputs_are_written_per_output_with_undefined_values_as_null() -> None:
    assert outputs_dict({"y": {"mse": 1, "cosine": float("inf")}, "z": {}}) == {
        "y": {"mse": 1.0, "cosine": None},
        "z": {},
    }
    node = NodeSensitivity("n", "Add", 2, {"mse": float("nan")}, {"y": {"mse": float("nan")}})
    assert node.to_dict() == {
        "node": "n",
        "op_type": "Add",
        "order": 2,
        "metrics": {"mse": None},
        "outputs": {"y": {"mse": None}},
    }


def test_unknown_modes_and_granularities_are_refused_before_anything_runs() -> None:
    with pytest.raises(InputError) as err:
        node_sensitivity(None, "nowhere.npz", mode="both")  # type: ignore[arg-type]
    assert str(err.value) == "unknown mode 'both'; expected one of single, leave-one-out"
    with pytest.raises(InputError) as err:
        node_sensitivity(None, "nowhere.npz", granularity="bias")  # type: ignore[arg-type]
    assert str(err.value) == "unknown granularity 'bias'; expected one of node, weight, activation"


def _qnode(name: str, order: int, weights=(), inputs=(), outputs=()) -> QuantizedNode:
    return QuantizedNode(name, "Conv", order, order, frozenset(weights), frozenset(inputs), frozenset(outputs))


A, B = _qnode("a", 0, {1}, {2}, {3}), _qnode("b", 1, (), {3}, {4})
ALL = frozenset({1, 2, 3, 4})


def test_node_experiments_quantize_the_node_alone_or_all_but_it_then_everything() -> None:
    graph = SimpleNamespace(all_edges=ALL)
    assert node_experiments(graph, [A, B], "single") == [
        Experiment("a", frozenset({1, 2, 3})),
        Experiment("b", frozenset({3, 4})),
        Experiment("fully quantized", ALL),
    ]
    assert node_experiments(graph, [A, B], "leave-one-out") == [
        Experiment("a", frozenset({4})),
        Experiment("b", frozenset({1, 2})),
        Experiment("fully quantized", ALL),
    ]
    assert node_experiments(graph, [A], "single", "weight") == [
        Experiment("a", frozenset({1})),
        Experiment("fully quantized", ALL),
    ]
    assert node_experiments(graph, [A], "leave-one-out", "activation")[0] == Experiment("a", frozenset({1, 4}))
    assert sensitivity_cache("single") == "float" and sensitivity_cache("leave-one-out") == "quantized"


class _Runner:
    """An experiment runner whose experiment ``k`` gives metrics from ``values(label)``; each
    experiment takes ``cost`` seconds of ``clock``; past ``clock.at`` a call raises."""

    def __init__(self, records: int = 3, clock=None, cost: float = 1.0) -> None:
        self.data = [None] * records
        self.calls: list[tuple[list[str], str]] = []
        self.clock, self.cost = clock, cost

    def run(self, experiments, cache, deadline=None):
        labels = [e.label for e in experiments]
        if self.clock is not None:
            if self.clock.now + self.cost * len(labels) > self.clock.at:
                self.clock.now = self.clock.at
                raise DeadlineReached("out")
            self.clock.now += self.cost * len(labels)
        self.calls.append((labels, cache))
        return [{"y": {"mse": float(len(label)), "cosine": None}, "z": {"mse": 1.0, "cosine": 0.5}} for label in labels]


def _session(runner, graph) -> Session:
    pair = SimpleNamespace(fp32_path=Path("f.onnx"), quantized_path=Path("q.onnx"))
    return Session(pair, SimpleNamespace(name="d.npz"), graph, runner, ["mse", "cosine"], True, ["t"])


class _Graph:
    """A QdqGraph's index: three nodes (c has no weight edge)."""

    def __init__(self) -> None:
        self.nodes = [_qnode("ab", 0, {1}, {2}, {3}), _qnode("c", 1, (), {3}, {4}), _qnode("defg", 2, {5})]
        self.all_edges = frozenset({1, 2, 3, 4, 5})
        self.unremovable = ["w"]

    def node(self, name: str) -> QuantizedNode:
        return next(n for n in self.nodes if n.name == name)


def test_sensitivity_in_measures_each_chosen_node_and_the_whole_model() -> None:
    runner = _Runner()
    result = sensitivity_in(_session(runner, _Graph()), "single", "weight")
    # c has no weight edge: it is not analysed; the mse of output y is the label's length here
    assert runner.calls == [(["ab", "defg", "fully quantized"], "float")]
    assert [(n.node, n.op_type, n.order) for n in result.nodes] == [("defg", "Conv", 2), ("ab", "Conv", 0)]
    ab = result.nodes[1]
    assert ab.metrics == {"mse": 1.5, "cosine": 0.5}  # means over the outputs where defined
    assert ab.outputs == {"y": {"mse": 2.0, "cosine": None}, "z": {"mse": 1.0, "cosine": 0.5}}
    assert result.baseline == {"mse": 8.0, "cosine": 0.5}
    assert (result.fp32_model, result.quantized_model, result.data, result.records) == ("f.onnx", "q.onnx", "d.npz", 3)
    assert (result.mode, result.granularity, result.unremovable, result.measured_at) == (
        "single",
        "weight",
        ["w"],
        ["t"],
    )
    assert result.higher_is_better == {"mse": False, "cosine": True} and list(result.metric_definitions) == [
        "mse",
        "cosine",
    ]
    assert result.unmeasured == []
    runner = _Runner()
    result = sensitivity_in(_session(runner, _Graph()), "leave-one-out", nodes=["c", "ab"])
    assert runner.calls == [(["c", "ab", "fully quantized"], "quantized")]
    # leave-one-out: the node whose float copy leaves the lowest mse (c: 1.0, ab: 1.5) first
    assert _names(result.nodes) == ["c", "ab"]


class _Clock:
    def __init__(self, at: float) -> None:
        self.now, self.at = 0.0, at

    def clock(self) -> float:
        return self.now

    def left(self) -> float:
        return self.at - self.now


def _experiments(count: int) -> list[Experiment]:
    return [*(Experiment(f"n{i}", frozenset()) for i in range(count)), Experiment("whole", frozenset())]


def _chunks(runner: _Runner) -> list[int]:
    return [len(labels) for labels, _ in runner.calls]


def test_chunks_before_a_deadline_take_half_the_time_left_at_the_rate_so_far() -> None:
    clock = _Clock(at=12.0)
    runner = _Runner(clock=clock)
    measured, whole = measure_until(runner, _experiments(16), "float", clock)
    # first: ceil(16 / 8) = 2 nodes and the whole model; then at one second an experiment, half of
    # the time left: 9 s -> 4, 5 s -> 2, 3 s -> 1, 2 s -> 1, 1 s -> 1 (at least one); at 12 s the
    # next chunk is interrupted and dropped
    assert _chunks(runner) == [3, 4, 2, 1, 1, 1]
    assert runner.calls[0][0] == ["n0", "n1", "whole"] and runner.calls[1][0] == ["n2", "n3", "n4", "n5"]
    assert len(measured) == 11 and measured[10]["y"]["mse"] == 3.0  # n10's
    assert whole["y"]["mse"] == 5.0
    # the first chunk rounds up: ceil(9 / 8) = 2, then the 7 left fit in half of 17 s
    clock = _Clock(at=20.0)
    runner = _Runner(clock=clock)
    measured, _ = measure_until(runner, _experiments(9), "quantized", clock)
    assert _chunks(runner) == [3, 7] and len(measured) == 9 and {c for _, c in runner.calls} == {"quantized"}
    # with no time spent, the rate is taken as 1e-9 s: everything left in one chunk
    clock = _Clock(at=1.0)
    runner = _Runner(clock=clock, cost=0.0)
    measure_until(runner, _experiments(16), "float", clock)
    assert _chunks(runner) == [3, 14]
    # a deadline before the first chunk ended stops the ranking
    clock = _Clock(at=2.0)
    with pytest.raises(DeadlineReached):
        measure_until(_Runner(clock=clock), _experiments(16), "float", clock)


def test_sensitivity_in_with_a_deadline_names_the_nodes_it_did_not_measure() -> None:
    clock = _Clock(at=3.0)
    runner = _Runner(clock=clock)
    result = sensitivity_in(_session(runner, _Graph()), "single", deadline=clock)
    # ceil(3 / 8) = 1 node and the whole model (2 s), then one node in the last second; the next
    # chunk is interrupted
    assert runner.calls == [(["ab", "fully quantized"], "float"), (["c"], "float")]
    assert _names(result.nodes) == ["ab", "c"] and result.unmeasured == ["defg"]
    assert result.stopped == "ranking stopped at the budget after 2 of 3 nodes"


# -- experiments.py -------------------------------------------------------------------------------


def test_metric_mean_is_over_the_outputs_where_the_metric_is_defined() -> None:
    assert metric_mean({"y": {"m": 1.0}, "z": {"m": 4.0}}, "m") == 2.5
    assert metric_mean({"y": {"m": 1.0}, "z": {"m": None}, "w": {}}, "m") == 1.0
    assert metric_mean({"y": {"m": None}}, "m") is None and metric_mean({}, "m") is None


def test_tensor_bytes_count_elements_times_item_size() -> None:
    size = experiments_module._tensor_bytes
    assert size(numpy_helper.from_array(np.zeros((2, 3), np.float32))) == 24
    assert size(numpy_helper.from_array(np.zeros((4,), np.int64))) == 32
    assert size(numpy_helper.from_array(np.int8(3))) == 1
    assert size(numpy_helper.from_array(np.zeros((0, 5), np.float32))) == 0


def _pack(*reads: str, experiments=(0,)) -> experiments_module._Packed:
    nodes = [helper.make_node("Add", [r, "x"], [f"o{i}"]) for i, r in enumerate(reads)]
    return experiments_module._Packed(list(experiments), nodes, [], {})


def test_rounds_keep_each_groups_initializers_within_the_budget(monkeypatch) -> None:
    monkeypatch.setattr(experiments_module, "SESSION_BYTES", 100)
    sizes = {"a": 60, "b": 50, "c": 40, "d": 10}
    p1, p2, p3, p4 = _pack("a", "a"), _pack("b"), _pack("c", "d"), _pack("d")
    # a read twice counts once; 60 + 50 > 100 starts a group; 50 + 50 = 100 fits on the dot
    assert experiments_module._rounds([p1, p2, p3, p4], sizes) == [[p1], [p2, p3], [p4]]
    # a pack without experiments is left out, and one larger than the budget gets a group of its own
    empty, big = _pack("a", experiments=()), _pack("a", "b", "c")
    assert experiments_module._rounds([empty, big, p4], sizes) == [[big], [p4]]
    assert experiments_module._rounds([empty], sizes) == []
    # names that are no initializer weigh nothing
    assert experiments_module._rounds([_pack("x"), _pack("y")], sizes) == [[_pack("x"), _pack("y")]]


def test_renamed_copies_carry_the_experiments_suffix_and_unnamed_nodes_stay_unnamed() -> None:
    named = helper.make_node("Relu", ["a"], ["b"], name="relu")
    unnamed = helper.make_node("Neg", ["b"], ["c"])
    first, second = experiments_module._renamed([named, unnamed], {"b", "c"}, 3)
    assert (first.name, list(first.input), list(first.output)) == ("relu@3", ["a"], ["b@3"])
    assert (second.name, list(second.input), list(second.output)) == ("", ["b@3"], ["c@3"])
    assert named.output == ["b"]  # the originals are untouched


def test_an_experiment_runner_refuses_an_unknown_strategy_and_counts_its_workers() -> None:
    with pytest.raises(InputError) as err:
        ExperimentRunner(None, None, [], None, [], RuntimeOptions(), "fast")  # type: ignore[arg-type]
    assert str(err.value) == "unknown strategy 'fast'; expected one of reuse, naive"
    runner = ExperimentRunner(None, None, [("y", "y_q"), ("z", "z_q")], [], ["mse"], RuntimeOptions(threads=3))  # type: ignore[arg-type]
    assert runner.output_names == ["y", "z"] and runner.workers == 3 and runner.strategy == "reuse"
    assert runner.run([]) == []
    plain = ExperimentRunner(None, None, [], [], [], RuntimeOptions(threads=0), "naive")  # type: ignore[arg-type]
    assert plain.workers == (os.cpu_count() or 1)


class _Cache:
    def __init__(self, covers: bool) -> None:
        self._covers, self.asked = covers, []

    def covers(self, names) -> bool:
        self.asked.append(list(names))
        return self._covers

    def values(self, batch):
        return {"y": "kept"}


def test_the_runner_reads_the_reference_from_a_cache_that_covers_its_outputs() -> None:
    cache = _Cache(True)
    runner = ExperimentRunner(None, None, [("y", "y_q")], [], ["mse"], RuntimeOptions(), reference=cache)  # type: ignore[arg-type]
    assert runner.reference is cache and cache.asked == [["y"]]
    assert runner.reference_values(None) == {"y": "kept"}
    other = ExperimentRunner(None, None, [("y", "y_q")], [], ["mse"], RuntimeOptions(), reference=_Cache(False))  # type: ignore[arg-type]
    assert other.reference is None


def test_accumulators_fold_each_output_apart() -> None:
    acc = experiments_module._Accumulators(["y", "z"], ["mse", "max_abs"])
    acc.update("y", np.zeros((2, 2), np.float32), np.full((2, 2), 2.0, np.float32))
    acc.update("y", np.zeros((1, 2), np.float32), np.ones((1, 2), np.float32))
    acc.update("z", np.ones((1, 3), np.float32), np.ones((1, 3), np.float32))
    assert acc.results() == {"y": {"mse": 3.0, "max_abs": 2.0}, "z": {"mse": 0.0, "max_abs": 0.0}}


def test_an_experiment_model_onnxruntime_cannot_load_or_run_is_a_model_error() -> None:
    broken = helper.make_model(
        helper.make_graph([helper.make_node("Nope", ["x"], ["y"])], "g", [], []),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    with pytest.raises(ModelError, match=r"^net: onnxruntime cannot load the experiment model \(.+\)$"):
        experiments_module._session(broken, RuntimeOptions(), "net", 1)
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", 1, [2])]
        ),
        opset_imports=[helper.make_opsetid("", 13)],
    )
    runner = ExperimentRunner(None, None, [], [], [], RuntimeOptions(), label="net")  # type: ignore[arg-type]
    pack = experiments_module._Packed(
        [0], [], ["x"], {}, experiments_module._session(model, RuntimeOptions(), "n", 1), ["y"]
    )
    assert runner._call(pack, {"x": np.array([-1.0, 2.0], np.float32)})[0].tolist() == [0.0, 2.0]
    with pytest.raises(ModelError, match=r"^net: onnxruntime failed to run an experiment \(.+\)$"):
        runner._call(pack, {"x": np.zeros((3,), np.int64)})
    # a pack whose experiments all equal the cache fetches nothing
    assert runner._run_pack(experiments_module._Packed([0], [], [], {0: {"y": (False, "y")}}), {}) == {}


# -- saturation.py --------------------------------------------------------------------------------


def test_overflowing_presets_are_avx2_and_the_targets_that_overflow_once_each() -> None:
    assert saturation.overflowing_presets() == ["onnxruntime-avx2"]
    targets = ("onnxruntime-arm64", "tflite", "onnxruntime-avx2", "onnxruntime-arm64", "onnxruntime-arm64-neon")
    assert saturation.overflowing_presets(targets) == [
        "onnxruntime-avx2",
        "onnxruntime-arm64",
        "onnxruntime-arm64-neon",
    ]


def test_the_exact_counterpart_of_each_overflowing_preset() -> None:
    name, scheme = saturation.exact_counterpart("onnxruntime-avx2")
    assert name == "onnxruntime-vnni" and scheme.name == "onnxruntime-vnni"
    for preset in ("onnxruntime-arm64-neon", "onnxruntime-arm64"):
        name, scheme = saturation.exact_counterpart(preset)
        assert name == scheme.name == f"{preset} with exact sums"
        assert not scheme.neon_pair_wrap and not scheme.depthwise_pair_wrap
    with pytest.raises(InputError) as err:
        saturation.exact_counterpart("onnxruntime-vnni")
    assert str(err.value) == (
        "no pair sums overflow on preset 'onnxruntime-vnni'; the presets that overflow are "
        "onnxruntime-avx2, onnxruntime-arm64-neon, onnxruntime-arm64"
    )


def _layer(node: str, pairs: int, saturated: int) -> saturation.LayerSaturation:
    return saturation.LayerSaturation(
        node, pairs, saturated, 1 if saturated else None, saturated // 2, f"{node}_q", 3, 10, 2
    )


def test_a_report_adds_its_layers_and_names_the_worst_share() -> None:
    layers = (_layer("a", 100, 10), _layer("b", 10, 2), _layer("c", 0, 0), _layer("d", 50, 10))
    report = saturation.SaturationReport("m.onnx", 4, layers, {"y": 30.0, "z": None})
    assert (report.pairs, report.saturated, report.share) == (160, 22, 22 / 160)
    assert layers[2].share == 0.0 and layers[1].share == 0.2
    # b (0.2) and d (0.2) share the largest share: d saturated more
    assert report.worst() is layers[3]
    assert saturation.SaturationReport("m", 0, (_layer("c", 0, 0),), {}).worst() is None
    assert saturation.SaturationReport("m", 0, (), {}).share == 0.0
    assert report.effect == "saturate" and report.exact == "onnxruntime-vnni"
    assert saturation.SaturationReport("m", 0, (), {}, "onnxruntime-arm64").effect == "wrap"
    assert saturation.SaturationReport("m", 0, (), {}, "elsewhere").effect == "saturate"
    assert report.to_dict() == {
        "model": "m.onnx",
        "records": 4,
        "saturating_preset": "onnxruntime-avx2",
        "exact_preset": "onnxruntime-vnni",
        "effect": "saturate",
        "pairs": 160,
        "saturated": 22,
        "share": 22 / 160,
        "layers": [
            {
                "node": layer.node,
                "pairs": layer.pairs,
                "saturated": layer.saturated,
                "worst_record": layer.worst_record,
                "worst_record_saturated": layer.worst_record_saturated,
                "tensor": layer.tensor,
                "differing": 3,
                "elements": 10,
                "max_steps": 2,
                "share": share,
            }
            for layer, share in zip(layers, (0.1, 0.2, 0.0, 0.2), strict=True)
        ],
        "outputs_sqnr_vs_exact": {"y": 30.0, "z": None},
    }


def test_sqnr_of_the_overflowing_run_is_undefined_without_noise_or_signal() -> None:
    assert saturation._sqnr(100.0, 1.0) == pytest.approx(20.0)
    assert saturation._sqnr(2.0, 4.0) == pytest.approx(10 * math.log10(0.5))
    assert saturation._sqnr(0.0, 1.0) is None and saturation._sqnr(1.0, 0.0) is None


def test_fold_counts_differing_8bit_elements_and_the_outputs_energy() -> None:
    tensors: dict[str, list[int]] = {}
    energy = {"y": [0.0, 0.0]}
    ours = {
        "a": np.array([[0, 5, -128], [7, 7, 7]], np.int8),
        "y": np.array([1.0, 2.0], np.float32),
        "w": np.array([1, 2], np.int8),  # a constant: not compared
        "odd": np.array([1, 2], np.uint8),  # shapes differ: skipped
        "gone": np.array([1], np.uint8),  # not in the other run
    }
    theirs = {
        "a": np.array([[0, 6, 127], [7, 4, 7]], np.int8),
        "y": np.array([1.5, 2.0], np.float32),
        "w": np.array([9, 9], np.int8),
        "odd": np.array([1, 2, 3], np.uint8),
    }
    saturation._fold(ours, theirs, tensors, energy, {"w"})
    assert tensors == {"a": [6, 3, 255]}
    assert energy == {"y": [1.5**2 + 4.0, 0.25]}
    saturation._fold(
        {"a": np.array([[1, 1, 1], [1, 1, 1]], np.int8)}, {"a": np.ones((2, 3), np.int8)}, tensors, energy, set()
    )
    assert tensors == {"a": [12, 3, 255]}  # elements add up, the largest step stays


def test_quantized_outputs_are_a_qoperator_nodes_own_or_its_quantizelinears() -> None:
    nodes = [
        helper.make_node("QLinearConv", ["x"] * 8, ["c"], name="conv"),
        helper.make_node("Conv", ["xd", "wd"], ["m"], name="qdq"),
        helper.make_node("QuantizeLinear", ["m", "s", "z"], ["mq"], name="qm"),
        helper.make_node("MatMul", ["xd", "wd"], ["n"]),
        helper.make_node("QuantizeLinear", ["n", "s", "z"], ["nq"]),
        helper.make_node("Relu", ["n"], ["r"], name="two_readers"),
        helper.make_node("Add", ["r", "r"], ["p"], name="float"),
        helper.make_node("MatMulInteger", ["a", "b"], ["i"], name="mmi"),
        helper.make_node("QGemm", ["a"] * 6, ["g"], name="gemm", domain="com.microsoft"),
    ]
    found = saturation._quantized_outputs(helper.make_model(helper.make_graph(nodes, "g", [], [])))
    # the unnamed MatMul is named by its type and index; n has two readers, so no QuantizeLinear of its own
    assert found == {"conv": "c", "qdq": "mq", "mmi": "i", "gemm": "g"}
    nodes[5].input[0] = "xd"  # now the QuantizeLinear alone reads n
    found = saturation._quantized_outputs(helper.make_model(helper.make_graph(nodes, "g", [], [])))
    assert found == {"conv": "c", "qdq": "mq", "MatMul_3": "nq", "mmi": "i", "gemm": "g"}


def test_weight_remedies_rewrite_int8_codes_as_documented() -> None:
    w = np.array([-128, -127, -3, -1, 0, 1, 3, 127], np.int8)
    scale, zp = np.array([0.5], np.float32), np.array([0], np.int8)
    halved, s2, z2 = saturation._halve(w, scale, zp)
    # rint(w / 2), half to even: -64, -64 (-63.5), -2 (-1.5), -0 (-0.5), 0, 0 (0.5), 2 (1.5), 64 (63.5)
    assert halved.tolist() == [-64, -64, -2, 0, 0, 0, 2, 64] and halved.dtype == np.int8
    assert s2.tolist() == [1.0] and s2.dtype == np.float32 and z2.tolist() == [0] and z2.dtype == np.int8
    assert saturation._halve(w, scale, np.array([5], np.int8))[2].tolist() == [2]  # rint(2.5)
    sym, s3, z3 = saturation._symmetric(w, scale, zp)
    assert sym.tolist() == [-127, -127, -3, -1, 0, 1, 3, 127] and sym.dtype == np.int8 and s3 is scale and z3 is zp
    u8, s4, z4 = saturation._to_uint8(w, scale, zp)
    assert u8.tolist() == [0, 1, 125, 127, 128, 129, 131, 255] and u8.dtype == np.uint8
    assert s4 is scale and z4.tolist() == [128] and z4.dtype == np.uint8


def _qlinear_matmul(weight_dtype=np.int8) -> onnx.ModelProto:
    tensor = numpy_helper.from_array
    inits = [
        tensor(np.array([[-128, 3], [5, -7]]).astype(weight_dtype), "w"),
        tensor(np.float32(0.5), "ws"),
        tensor(np.array(0, weight_dtype), "wz"),
    ]
    node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], name="mm")
    return helper.make_model(helper.make_graph([node], "g", [], [], inits))


def _inits(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def test_rewritten_weights_are_new_initializers_read_by_the_kernel() -> None:
    model = _qlinear_matmul()
    copy = saturation._rewrite_weights(model, saturation._halve)
    node = copy.graph.node[0]
    assert list(node.input) == ["x", "xs", "xz", "w::mm:3", "ws::mm:4", "wz::mm:5", "ys", "yz"]
    inits = _inits(copy)
    assert inits["w::mm:3"].tolist() == [[-64, 2], [2, -4]] and float(inits["ws::mm:4"]) == 1.0
    assert model.graph.node[0].input[3] == "w"  # the model itself is unchanged
    # nothing to rewrite: u8 weights, or no kernel
    assert saturation._rewrite_weights(_qlinear_matmul(np.uint8), saturation._halve) is None
    assert saturation._rewrite_weights(helper.make_model(helper.make_graph([], "g", [], [])), saturation._halve) is None


def _qdq_conv(bias: bool = True, qoperator: bool = False) -> onnx.ModelProto:
    """A Conv whose int8 weight (scale 0.5) and int32 bias (scale 0.25) go through DequantizeLinear."""
    tensor = numpy_helper.from_array
    inits = [
        tensor(np.array([[[[-128]]], [[[6]]]], np.int8), "w"),
        tensor(np.array([0.5, 0.5], np.float32), "ws"),
        tensor(np.array([0, 0], np.int8), "wz"),
        tensor(np.array([100, -7], np.int32), "b"),
        tensor(np.array([0.25, 0.25], np.float32), "bs"),
    ]
    if qoperator:
        node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], name="c")
        return helper.make_model(helper.make_graph([node], "g", [], [], inits))
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="dqw", axis=0),
        helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], name="dqb", axis=0),
        helper.make_node("Conv", ["xd", "wd", "bd"] if bias else ["xd", "wd"], ["y"], name="conv"),
    ]
    return helper.make_model(helper.make_graph(nodes, "g", [], [], inits))


def test_a_bias_follows_its_weights_new_scale() -> None:
    # QDQ: the bias codes are divided by the scale's factor (2) and its scale multiplied by it
    inits = _inits(saturation._rewrite_weights(_qdq_conv(), saturation._halve))
    copy = saturation._rewrite_weights(_qdq_conv(), saturation._halve)
    dqw, dqb, _ = copy.graph.node
    assert list(dqw.input) == ["w::dqw:0", "ws::dqw:1", "wz::dqw:2"]
    assert list(dqb.input) == ["b::dqb:0", "bs::dqb:1"]
    assert inits["w::dqw:0"].ravel().tolist() == [-64, 3] and inits["ws::dqw:1"].tolist() == [1.0, 1.0]
    assert inits["b::dqb:0"].tolist() == [50, -4] and inits["b::dqb:0"].dtype == np.int32  # rint(-3.5) = -4
    assert inits["bs::dqb:1"].tolist() == [0.5, 0.5] and inits["bs::dqb:1"].dtype == np.float32
    # u8 weights keep their scale: the bias stays
    copy = saturation._rewrite_weights(_qdq_conv(), saturation._to_uint8)
    assert list(copy.graph.node[1].input) == ["b", "bs"] and copy.graph.node[0].input[0] == "w::dqw:0"
    # a Conv without a bias
    copy = saturation._rewrite_weights(_qdq_conv(bias=False), saturation._halve)
    assert list(copy.graph.node[1].input) == ["b", "bs"]
    # QOperator: the int32 bias input (8) is divided by the factor, its scale is the kernel's own
    copy = saturation._rewrite_weights(_qdq_conv(qoperator=True), saturation._halve)
    node = copy.graph.node[0]
    assert node.input[8] == "b::c:8" and _inits(copy)["b::c:8"].tolist() == [50, -4]


def test_a_dequantized_weight_read_otherwise_than_as_a_kernels_weight_is_left_alone() -> None:
    model = _qdq_conv()
    model.graph.node.append(helper.make_node("Relu", ["wd"], ["r"]))  # wd read by a Relu too
    assert saturation._rewrite_weights(model, saturation._halve) is None
    model = _qdq_conv()
    model.graph.node[2].input[:] = ["wd", "xd", "bd"]  # read as the Conv's input, not its weight
    assert saturation._rewrite_weights(model, saturation._halve) is None
    model = _qdq_conv()
    del model.graph.node[0].input[2]  # no zero point
    assert saturation._rewrite_weights(model, saturation._halve) is None
