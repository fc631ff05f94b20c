"""Unit tests of the sensitivity analyses' parts: rankings, experiments, chunks before a deadline,
the experiment runner's plumbing, and the saturation report's arithmetic and weight rewrites.

Expected values are worked by hand from the docstrings (docs/sensitivity.md, docs/saturation.md),
or computed by numpy and onnxruntime; none is read back from the code under test.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from pytest_qaccuracy.analysis import compare as compare_module
from pytest_qaccuracy.analysis import experiments as experiments_module
from pytest_qaccuracy.analysis import reduced_compare as reduced
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
    open_session,
    outputs_dict,
    rank,
    sensitivity_cache,
    sensitivity_in,
)
from pytest_qaccuracy.analysis.slices import SliceSpec
from pytest_qaccuracy.data.progress import reporting
from pytest_qaccuracy.errors import CheckError, InputError, ModelError
from pytest_qaccuracy.metrics.channels import ChannelSpans
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.model.quant_params import QuantParams
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.progress_recorders import TaskRecorder, record_closes

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
    """A deadline ``at`` seconds after its start (a monotonic clock's reading, far from 0)."""

    def __init__(self, at: float, start: float = 1000.0) -> None:
        self.now, self.at = start, start + at

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
    # the first group fits on the dot too: 60 + 40 = 100
    assert experiments_module._rounds([_pack("a"), _pack("c")], sizes) == [[_pack("a"), _pack("c")]]
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
    unloadable = (
        r"^net: onnxruntime cannot load the experiment model \(.*INVALID_ARGUMENT.*'x' is not a graph input.*\)$"
    )
    with pytest.raises(ModelError, match=unloadable):
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
    with pytest.raises(ModelError, match=r"^net: onnxruntime failed to run an experiment \(.*ONNXRuntimeError.*\)$"):
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


def test_the_exact_counterpart_of_each_overflowing_preset(avx2_host) -> None:
    from dataclasses import replace as changed

    from pytest_qaccuracy.backend.scheme import get_scheme

    name, scheme = saturation.exact_counterpart("onnxruntime-avx2")
    assert name == "onnxruntime-vnni" and scheme.name == "onnxruntime-vnni"
    for preset in ("onnxruntime-arm64-neon", "onnxruntime-arm64"):
        name, scheme = saturation.exact_counterpart(preset)
        assert name == scheme.name == f"{preset} with exact sums"
        assert not scheme.neon_pair_wrap and not scheme.depthwise_pair_wrap
        # the preset itself but for its name and the two wraps
        original = get_scheme(preset)
        flags = {"neon_pair_wrap": original.neon_pair_wrap, "depthwise_pair_wrap": original.depthwise_pair_wrap}
        assert changed(scheme, name=preset, **flags) == original
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
    same = np.array([1, 2], np.uint8)
    saturation._fold({"s": same}, {"s": same.copy()}, tensors, energy, set())
    assert tensors["s"] == [2, 0, 0]


def test_quantized_outputs_are_a_qoperator_nodes_own_or_its_quantizelinears() -> None:
    nodes = [
        helper.make_node("Nothing", ["x"], [], name="no_output"),
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
    nodes[6].input[0] = "xd"  # now the QuantizeLinear alone reads n
    found = saturation._quantized_outputs(helper.make_model(helper.make_graph(nodes, "g", [], [])))
    assert found == {"conv": "c", "qdq": "mq", "MatMul_4": "nq", "mmi": "i", "gemm": "g"}


def test_weight_remedies_rewrite_int8_codes_as_documented() -> None:
    w = np.array([-128, -127, -3, -1, 0, 1, 3, 127], np.int8)
    scale, zp = np.array([0.5], np.float32), np.array([0], np.int8)
    halved, s2, z2 = saturation._halve(w, scale, zp)
    # rint(w / 2), half to even: -64, -64 (-63.5), -2 (-1.5), -0 (-0.5), 0, 0 (0.5), 2 (1.5), 64 (63.5)
    assert halved.tolist() == [-64, -64, -2, 0, 0, 0, 2, 64] and halved.dtype == np.int8
    assert s2.tolist() == [1.0] and s2.dtype == np.float32 and z2.tolist() == [0] and z2.dtype == np.int8
    assert saturation._halve(w, scale, np.array([5, -6], np.int8))[2].tolist() == [2, -3]  # rint(2.5), -3
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
    assert _inits(copy)["b::c:8"].dtype == np.int32


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


# -- reduced_compare.py ---------------------------------------------------------------------------


def _types(**shapes) -> dict:
    """name -> (element type, dims) as tensor types, as _value_types reads them from a model."""
    values = [helper.make_tensor_value_info(n, t, dims) for n, (t, dims) in shapes.items()]
    model = helper.make_model(helper.make_graph([], "g", values[:1], values[1:2], value_info=values[2:]))
    return reduced._value_types(model)


FLOAT, INT8, UINT8, INT32 = (
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.INT32,
)
PER_TENSOR = QuantParams(np.array(0.5), np.array(0, np.int8))
PER_CHANNEL = QuantParams(np.array([0.5, 0.25]), np.array([0, 0], np.int8), axis=1)


def _spec(names, params=PER_TENSOR, f=(FLOAT, ["n", 2, 3]), q=(INT8, ["n", 2, 3]), **tracker):
    layer = compare_module._tracker("f", "q", params, names, **tracker)
    return reduced.reduction_spec(layer, _types(f=f), _types(q=q))


def test_value_types_read_inputs_outputs_and_value_info_with_their_ranks() -> None:
    types = _types(a=(FLOAT, ["n", 2]), b=(INT8, [1, None, 3]), c=(UINT8, None))
    assert set(types) == {"a", "b", "c"}
    assert reduced._rank_and_type(types, "a") == (2, FLOAT, [None, 2])
    assert reduced._rank_and_type(types, "b") == (3, INT8, [1, None, 3])
    assert reduced._rank_and_type(types, "c") == (None, UINT8, None)
    assert reduced._rank_and_type(types, "d") == (None, None, None)


def test_a_layer_is_reduced_only_with_built_in_metrics_on_a_static_float_record() -> None:
    spec = _spec(["mse"])
    assert (spec.fp32, spec.capture, spec.params, spec.dims, spec.q_type) == ("f", "q", PER_TENSOR, (2, 3), INT8)
    assert spec.fields == {"sq_err"} and (spec.steps, spec.bounds, spec.cross) == (False, None, False)
    assert spec.spans and not spec.check_shapes
    # outputs and views keep their whole tensors; custom and no metrics too
    assert _spec(["mse"], worst=True) is None
    assert _spec(["mse"], view=SliceSpec("v", "f[:, 0]")) is None
    assert _spec([]) is None
    # the fp32 tensor: typed, float32, of rank 2 at least, static after the record axis
    assert _spec(["mse"], f=(FLOAT, ["n", 6]), q=(INT8, None)).dims == (6,)
    for f in [(FLOAT, ["n"]), (onnx.TensorProto.DOUBLE, ["n", 2, 3]), (FLOAT, ["n", 2, "k"]), (FLOAT, ["n", 0, 3])]:
        assert _spec(["mse"], f=f, q=(INT8, None)) is None, f
    assert (
        reduced.reduction_spec(compare_module._tracker("f", "q", PER_TENSOR, ["mse"]), {}, _types(q=(INT8, None)))
        is None
    )
    # the quantized tensor: of the same rank or unknown (then its shape is checked at run time)
    assert _spec(["mse"], q=(INT8, ["n", 6])) is None
    assert _spec(["mse"], q=(INT8, None)).check_shapes
    assert _spec(["mse"], q=(INT8, ["n", 3, 2])).check_shapes
    # integer with its parameters, or float without
    assert _spec(["mse"], params=None, q=(FLOAT, ["n", 2, 3])).q_type == FLOAT
    assert _spec(["mse"], params=None, q=(INT8, ["n", 2, 3])) is None
    assert _spec(["mse"], q=(FLOAT, ["n", 2, 3])) is None
    assert _spec(["mse"], q=(INT32, ["n", 2, 3])).q_type == INT32
    # untyped (a com.microsoft op's output): its zero point's type
    assert (
        reduced.reduction_spec(
            compare_module._tracker("f", "q", PER_TENSOR, ["mse"]), _types(f=(FLOAT, ["n", 2, 3])), {}
        ).q_type
        == INT8
    )
    uint8 = QuantParams(np.array(0.5), np.array(3, np.uint8))
    assert (
        reduced.reduction_spec(
            compare_module._tracker("f", "q", uint8, ["mse"]), _types(f=(FLOAT, ["n", 2, 3])), {}
        ).q_type
        == UINT8
    )
    assert (
        reduced.reduction_spec(compare_module._tracker("f", "q", None, ["mse"]), _types(f=(FLOAT, ["n", 2, 3])), {})
        is None
    )


def test_a_reduced_layer_asks_for_the_statistics_its_metrics_read() -> None:
    # max_abs needs sq_err too: its NaN marks the records whose max is NaN
    assert _spec(["max_abs"]).fields == {"max_abs_err", "sq_err"}
    assert _spec(["max_abs", "tae"]).fields == {"max_abs_err", "abs_err"}
    # ref_min/ref_max need ref_sq, for the same reason
    assert _spec(["clipped"]).fields == {"ref_min", "ref_max", "ref_sq"}
    assert _spec(["clipped", "mre"]).fields == {"ref_min", "ref_max", "abs_err", "ref_abs"}
    cosine = _spec(["cosine"])
    assert cosine.cross and cosine.fields == {"ref_sq", "test_sq", "sq_err"}
    # steps only for a per-channel scale (a per-tensor one divides max |f - q|)
    assert not _spec(["lsb"]).steps and _spec(["lsb"], params=PER_CHANNEL).steps
    assert not _spec(["mse"], params=PER_CHANNEL).steps and not _spec(["lsb"], params=PER_CHANNEL).spans
    # clipped's bounds: int8 [-128.5, 127.5] steps around the zero point
    low, high = _spec(["clipped"]).bounds
    assert (low.tolist(), high.tolist()) == (-64.25, 63.75)
    low, high = _spec(["clipped"], params=PER_CHANNEL).bounds
    assert (
        low.shape == (1, 2, 1)
        and low.ravel().tolist() == [-64.25, -32.125]
        and high.ravel().tolist() == [63.75, 31.875]
    )
    assert _spec(["clipped"], params=None, q=(FLOAT, ["n", 2, 3])).bounds is None
    last = QuantParams(np.array([1.0, 2.0, 4.0]), np.array([0, 0, 0], np.uint8), axis=-1)
    low, high = reduced._range_bounds(last, 3)
    assert (
        low.shape == (1, 1, 3)
        and low.ravel().tolist() == [-0.5, -1.0, -2.0]
        and high.ravel().tolist() == [255.5, 511.0, 1022.0]
    )
    unset = QuantParams(np.array([1.0, 2.0]), np.array([1, 1], np.int8))
    assert reduced._range_bounds(unset, 4)[0].shape == (1, 2, 1, 1)  # no axis: the channels are on axis 1


def test_reduced_statistics_are_the_graphs_fields_and_name_the_missing_ones() -> None:
    stats = reduced.ReducedStats({"sq_err": np.array([1.0, 2.0])}, 6)
    assert stats.count == 6 and stats.sq_err.tolist() == [1.0, 2.0]
    stats.prepare(["sq_err"])
    with pytest.raises(KeyError, match=r"statistics \['ref_sq', 'test_sq'\] were not reduced"):
        stats.prepare(["test_sq", "sq_err", "ref_sq"])
    with pytest.raises(AttributeError, match=r"^statistic 'ref_sq' was not reduced$"):
        _ = stats.ref_sq
    with pytest.raises(AttributeError, match=r"^other$"):
        _ = stats.other
    pair = reduced.ReducedPair(stats, 2, (2, 3), 0.5, None, 0, 4, None, None)
    assert pair.records == 2 and pair.ref is None and pair.test is None and pair.first_record == 4


def _reduced(names, params=PER_TENSOR):
    return compare_module._tracker("f", "q", params, names)


def test_folding_the_graphs_statistics_gives_the_whole_tensor_metrics() -> None:
    f = np.array([[[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]], [[2.0, 2.0, 2.0], [1.0, 1.0, -4.0]]], np.float32)
    q = np.array([[[1.0, -1.5, 3.0], [0.5, 0.5, -1.0]], [[2.0, 2.0, 1.0], [1.0, 1.0, -4.0]]], np.float32)
    names = ["mse", "max_abs", "cosine", "sqnr", "tae", "mre"]
    spec = _spec(names, params=None, q=(FLOAT, ["n", 2, 3]))
    d = (f - q).astype(np.float64).reshape(2, -1)
    ff, qq = f.astype(np.float64).reshape(2, -1), q.astype(np.float64).reshape(2, -1)
    cross = np.sum(ff * (ff - qq), axis=1)
    sums = np.stack([np.sum(d * d, 1), np.sum(np.abs(d), 1), np.sum(ff * ff, 1), np.sum(np.abs(ff), 1), cross], 1)
    order = {"sq_err": 0, "abs_err": 1, "ref_sq": 2, "ref_abs": 3, "cross": 4}
    spec = replace(spec, sum_fields=(*sorted(spec.fields - {"max_abs_err", "test_sq"}), "cross"))
    values = {
        "sums": sums[:, [order[n] for n in spec.sum_fields]][:, :, None].astype(np.float32),
        "max_abs": np.abs(d).max(1),
    }
    layer = _reduced(names, None)
    reduced.fold_reduced(layer, spec, values, 0)
    whole = _reduced(names, None)
    whole.update(f, q, 0)
    assert layer.results()[0] == pytest.approx(whole.results()[0], rel=1e-6)


def test_a_quantized_shape_that_differs_is_the_layers_problem() -> None:
    spec = _spec(["mse"], params=None, q=(FLOAT, None))
    layer = _reduced(["mse"], None)
    reduced.fold_reduced(layer, spec, {"sq_err": np.zeros(2), "qshape": np.array([2, 3, 2])}, 0)
    assert layer.problem == "shape (2, 3) in the fp32 model but (3, 2) in the quantized model"
    same = _reduced(["mse"], None)
    reduced.fold_reduced(same, spec, {"sq_err": np.array([6.0, 12.0]), "qshape": np.array([2, 2, 3])}, 0)
    assert same.problem is None and same.results()[0] == {"mse": 1.5}


def test_steps_are_max_err_over_a_per_tensor_scale_or_the_graphs_per_channel_steps() -> None:
    spec = _spec(["lsb"])
    layer = _reduced(["lsb"])
    reduced.fold_reduced(layer, spec, {"sq_err": np.array([1.0, 1.0]), "max_abs": np.array([0.25, 1.0])}, 0)
    assert layer.results()[0] == {"lsb": 2.0}  # 1.0 / 0.5
    spec = _spec(["lsb"], params=PER_CHANNEL)
    layer = _reduced(["lsb"], PER_CHANNEL)
    values = {"sq_err": np.array([1.0, np.nan]), "max_abs": np.array([0.5, 1.0]), "steps": np.array([3.0, 1.0])}
    reduced.fold_reduced(layer, spec, values, 0)
    assert layer.results()[0] == {"lsb": None}  # record 1's error is NaN: so are its steps
    layer = _reduced(["lsb"], PER_CHANNEL)
    reduced.fold_reduced(layer, spec, {**values, "sq_err": np.array([1.0, 1.0])}, 0)
    assert layer.results()[0] == {"lsb": 3.0}


def test_a_nan_error_or_reference_makes_the_records_extremes_nan() -> None:
    stats = {"sq_err": np.array([np.nan, 1.0]), "abs_err": np.array([1.0, np.nan])}
    assert reduced._nan_rows(stats, ("sq_err", "abs_err")).tolist() == [True, False]
    assert reduced._nan_rows(stats, ("abs_err",)).tolist() == [False, True]
    assert reduced._nan_rows(stats, ("ref_sq",)) is None
    # max_abs: NaN where sq_err is NaN; max from the max and min of f - q
    spec = _spec(["max_abs", "mpeir"], params=None, q=(FLOAT, ["n", 2, 3]))
    layer = _reduced(["max_abs"], None)
    values = {"sq_err": np.array([np.nan, 1.0]), "max_diff": np.array([2.0, 0.5]), "min_diff": np.array([-1.0, -3.0])}
    reduced.fold_reduced(layer, spec, values, 0)
    assert layer.results()[0] == {"max_abs": None}
    layer = _reduced(["max_abs"], None)
    reduced.fold_reduced(layer, spec, {**values, "sq_err": np.array([1.0, 1.0])}, 0)
    assert layer.results()[0] == {"max_abs": 3.0}


def test_empty_records_give_zero_statistics() -> None:
    spec = replace(_spec(["mse", "max_abs"], params=None, q=(FLOAT, ["n", 2, 3])), dims=(0, 3))
    layer = _reduced(["mse", "max_abs"], None)
    reduced.fold_reduced(layer, spec, {"sq_err": np.array([np.nan, 5.0]), "max_abs": np.array([1.0, 2.0])}, 0)
    whole = _reduced(["mse", "max_abs"], None)
    whole.update(np.zeros((2, 0, 3), np.float32), np.zeros((2, 0, 3), np.float32), 0)
    assert layer.results() == whole.results()


def test_saturated_counts_and_channel_spans_are_folded_as_the_whole_tensor_path_folds_them() -> None:
    f = np.array([[[1.0, 200.0], [-3.0, 0.5], [2.0, 2.0]], [[0.0, 1.0], [5.0, -70.0], [1.0, 4.0]]], np.float32)
    q = np.clip(np.rint(f / 0.5), -128, 127).astype(np.int8)
    spec = _spec(["clipped"], f=(FLOAT, ["n", 3, 2]), q=(INT8, ["n", 3, 2]))
    assert spec.spans
    low, high = spec.bounds
    values = {
        "ref_sq": np.sum(f.astype(np.float64) ** 2, axis=(1, 2)),
        "saturated": np.count_nonzero((f < low) | (f >= high), axis=(1, 2)),
        "span_min1": f.min(axis=2),
        "span_max1": f.max(axis=2),
        "span_min_rest": f.min(axis=1),
        "span_max_rest": f.max(axis=1),
    }
    layer = _reduced(["clipped"])
    reduced.fold_reduced(layer, spec, values, 0)
    whole = _reduced(["clipped"])
    whole.update(f, q, 0)
    assert values["saturated"].tolist() == [1, 1]
    assert layer.results() == whole.results()
    for axis in (1, 2):
        np.testing.assert_array_equal(layer.spans.mins[axis], whole.spans.mins[axis])
        np.testing.assert_array_equal(layer.spans.maxs[axis], whole.spans.maxs[axis])
    assert compare_module._channel_report(layer) == compare_module._channel_report(whole)


def test_rows_and_spans_of_odd_shapes() -> None:
    assert reduced._row(np.min, np.array([[3.0, 1.0], [2.0, 5.0]])).tolist() == [1.0, 2.0]
    assert reduced._row(np.max, np.zeros((3, 0))).tolist() == [0.0, 0.0, 0.0]
    assert reduced._row(np.max, np.array([1.0, 2.0])).tolist() == [0.0, 0.0]
    assert reduced._row(np.max, np.arange(8.0).reshape(2, 2, 2)).tolist() == [3.0, 7.0]
    # a record of one element per channel axis: nothing to track
    spans = ChannelSpans()
    reduced._fold_spans(spans, (2, 1, 1), {"span_min1": np.zeros((2, 1)), "span_max1": np.zeros((2, 1))})
    assert spans.mins == {}
    # axes 1 and 3 (axis 2 has one element): axis 3 from the rest's plane
    rest_min = np.array([[[1.0, -2.0]], [[0.0, 4.0]]])  # (records, dim 2, dim 3)
    spans = ChannelSpans()
    values = {"span_min1": np.array([[0.0, 1.0], [2.0, -1.0]]), "span_max1": np.array([[5.0, 6.0], [7.0, 8.0]])}
    reduced._fold_spans(spans, (2, 2, 1, 2), {**values, "span_min_rest": rest_min, "span_max_rest": rest_min + 10})
    assert set(spans.mins) == {1, 3}
    assert spans.mins[1].tolist() == [0.0, -1.0] and spans.maxs[1].tolist() == [7.0, 8.0]
    assert spans.mins[3].tolist() == [0.0, -2.0] and spans.maxs[3].tolist() == [11.0, 14.0]
    # without the first axis's extremes, the others still fold
    spans = ChannelSpans()
    reduced._fold_spans(spans, (2, 2, 1, 2), {"span_min_rest": rest_min, "span_max_rest": rest_min + 10})
    assert set(spans.mins) == {3}


class _MergedRunner:
    """A merged-graph runner whose runs give ``stats`` per reduced layer, or raise ``errors`` in turn."""

    def __init__(self, stats, errors=()) -> None:
        self.stats, self.errors = stats, list(errors)

    def run(self, batch):
        if self.errors:
            error = self.errors.pop(0)
            if error is not None:
                raise error
        return {"y": 1}, {"y_q": 2}, self.stats


def test_a_reduced_pass_folds_its_layers_and_falls_back_only_on_its_first_batch() -> None:
    spec = _spec(["mse"], params=None, q=(FLOAT, ["n", 2, 3]))
    layer, broken = _reduced(["mse"], None), _reduced(["mse"], None)
    broken.problem = "shape"  # a layer with a problem is not folded again
    batch = SimpleNamespace(start=3)
    runner = _MergedRunner([{"sq_err": np.array([6.0])}, {}], [ModelError("first"), None, ModelError("later")])
    reduced_pass = reduced.ReducedPass(runner, [(layer, spec), (broken, spec)], ["whole"], 5)
    assert reduced_pass.note == "onnxruntime: the sums of 2 of 5 layers computed in the merged graph"
    assert reduced_pass.whole == ["whole"]
    with pytest.raises(reduced.ReductionUnavailable, match=r"^first$"):
        reduced_pass.run(batch)
    assert reduced_pass.run(batch) == ({"y": 1}, {"y_q": 2})
    assert layer.results()[0] == {"mse": 1.0}
    with pytest.raises(ModelError, match=r"^later$"):
        reduced_pass.run(batch)


def test_a_reduced_layer_that_cannot_fold_is_named() -> None:
    spec = _spec(["mse"], params=None, q=(FLOAT, ["n", 2, 3]))
    layer = _reduced(["mse"], None)
    reduced_pass = reduced.ReducedPass(_MergedRunner([{"max_abs": np.ones(1)}]), [(layer, spec)], [], 1)
    with pytest.raises(CheckError, match=r"^layer 'f': AttributeError: statistic 'sq_err' was not reduced$"):
        reduced_pass.run(SimpleNamespace(start=0))
    layer.metrics = {"x": SimpleNamespace(update=lambda pair: (_ for _ in ()).throw(InputError("ours")))}
    with pytest.raises(InputError, match=r"^ours$"):
        reduced.ReducedPass(_MergedRunner([{"sq_err": np.ones(1)}]), [(layer, spec)], [], 1).run(
            SimpleNamespace(start=0)
        )


def _merged_pair():
    f = helper.make_model(
        helper.make_graph([], "f", [], [], value_info=[helper.make_tensor_value_info("f", FLOAT, ["n", 2, 3])])
    )
    q = helper.make_model(
        helper.make_graph([], "q", [], [], value_info=[helper.make_tensor_value_info("q", FLOAT, ["n", 2, 3])])
    )
    return SimpleNamespace(
        matcher=SimpleNamespace(f=SimpleNamespace(model=f), q=SimpleNamespace(model=q)),
        fp32="F",
        quantized="Q",
        inputs=[SimpleNamespace(name="x")],
        fp32_path=Path("a.onnx"),
        quantized_path=Path("b.onnx"),
    )


def test_start_reduced_says_why_the_sums_run_in_numpy(monkeypatch) -> None:
    options = RuntimeOptions()
    assert reduced.start_reduced(_merged_pair(), [], [], options, options) == (None, "numpy: no layers compared")
    custom = compare_module._tracker("f", "q", None, ["mse"])
    custom.metrics["mine"] = object()
    assert reduced.start_reduced(_merged_pair(), [], [custom], options, options) == (
        None,
        "numpy: no layer has only built-in metrics on float32/integer tensors",
    )
    made = []

    def runner(*args):
        made.append(args)
        if len(made) > 1:
            raise reduced.ReductionUnavailable("cannot merge")
        return "RUNNER"

    monkeypatch.setattr(reduced, "ReducedRunner", runner)
    output = compare_module._tracker("y", "y_q", None, ["mse"], worst=True)
    layer = _reduced(["mse"], None)
    q_options = RuntimeOptions(threads=2)
    started, note = reduced.start_reduced(_merged_pair(), [output], [layer, custom], options, q_options, ["gate"])
    assert note == "" and started.runner == "RUNNER" and started.whole == [output, custom]
    assert [t for t, _ in started.reduced] == [layer]
    assert started.note == "onnxruntime: the sums of 1 of 2 layers computed in the merged graph"
    args = made[0]
    assert args[:3] == ("F", "Q", ["x"]) and [s.fp32 for s in args[3]] == ["f"]
    assert args[4:] == (["y", "f"], ["y_q", "q", "gate"], options, q_options, "a.onnx + b.onnx")
    assert reduced.start_reduced(_merged_pair(), [], [layer], options, options) == (
        None,
        "numpy (fallback): cannot merge",
    )


@pytest.mark.parametrize(
    ("strategy", "session_bytes", "passes"), [("naive", None, 4), ("reuse", None, 1), ("reuse", 1, 3)]
)
def test_the_runners_progress_counts_each_pass_over_the_records(
    zoo, monkeypatch, strategy, session_bytes, passes
) -> None:
    """Naive: the fp32 pass and one per experiment; reuse: one per round of sessions (12 records)."""
    if session_bytes is not None:  # a pack per experiment, one pack alive at a time: a pass per pack
        monkeypatch.setattr(experiments_module, "SESSION_NODES", 1)
        monkeypatch.setattr(experiments_module, "SESSION_BYTES", session_bytes)
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with open_session(pair, zoo["data"], "mse", RuntimeOptions(batch_size=5), strategy=strategy) as session:
        chosen = [session.qgraph.node(n) for n in ("conv1", "conv3", "gemm")]
        experiments = [Experiment(n.name, n.edges()) for n in chosen]
        progress = TaskRecorder()
        with reporting(progress):
            results = session.runner.run(experiments, "float")
        assert progress.tasks == [["sensitivity", 12 * passes, 12 * passes]]
        assert session.runner.sessions_built == (3 if strategy == "naive" or session_bytes else 1)
        assert session.runner.rounds == (0 if strategy == "naive" else passes)
        assert len(results) == 3 and all(r["logits"]["mse"] > 0 for r in results)


def test_each_kernel_reading_a_halved_weight_gets_its_int32_bias_rescaled_or_left_alone() -> None:
    """One weight read by six Convs: without bias, with a bias from an Identity, a float bias, int8
    bias codes, a bias scale that is no initializer, and a plain int32 QDQ bias (the only one rescaled)."""
    tensor = numpy_helper.from_array
    model = _qdq_conv()
    graph = model.graph
    del graph.node[1:]
    graph.initializer.extend(
        [
            tensor(np.array([1.0, 2.0], np.float32), "fb"),
            tensor(np.array([3, 4], np.int8), "b8"),
            tensor(np.array([0.25, 0.25], np.float32), "bs8"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Conv", ["xd", "wd"], ["ya"], name="a"),
            helper.make_node("Identity", ["fb"], ["ib"], name="identity"),
            helper.make_node("Conv", ["xd", "wd", "ib"], ["yb"], name="b"),
            helper.make_node("Conv", ["xd", "wd", "fb"], ["yc"], name="c"),
            helper.make_node("DequantizeLinear", ["b8", "bs8"], ["bd8"], name="dq8"),
            helper.make_node("Conv", ["xd", "wd", "bd8"], ["yd"], name="d"),
            helper.make_node("DequantizeLinear", ["b", "scale_in"], ["bdx"], name="dqx"),
            helper.make_node("Conv", ["xd", "wd", "bdx"], ["ye"], name="e"),
            helper.make_node("DequantizeLinear", ["b", "bs"], ["bd"], name="dqb"),
            helper.make_node("Conv", ["xd", "wd", "bd"], ["yf"], name="f"),
        ]
    )
    copy = saturation._rewrite_weights(model, saturation._halve)
    nodes = {n.name: n for n in copy.graph.node}
    assert list(nodes["dqw"].input) == ["w::dqw:0", "ws::dqw:1", "wz::dqw:2"]
    assert list(nodes["identity"].input) == ["fb"] and list(nodes["c"].input) == ["xd", "wd", "fb"]
    assert list(nodes["dq8"].input) == ["b8", "bs8"] and list(nodes["dqx"].input) == ["b", "scale_in"]
    assert list(nodes["dqb"].input) == ["b::dqb:0", "bs::dqb:1"]
    inits = _inits(copy)
    assert inits["b::dqb:0"].tolist() == [50, -4] and inits["bs::dqb:1"].tolist() == [0.5, 0.5]


def _qlinear_conv(w: np.ndarray) -> onnx.ModelProto:
    """One uint8 QLinearConv (pads 1) with int8 weights ``w`` (scale 0.01) and a uint8 output."""
    tensor = numpy_helper.from_array
    inits = [tensor(np.float32(0.02), "xs"), tensor(np.uint8(0), "xzp"), tensor(w, "w"), tensor(np.float32(0.01), "ws")]
    inits += [tensor(np.int8(0), "wzp"), tensor(np.float32(40.0), "ys"), tensor(np.uint8(128), "yzp")]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xzp", "w", "ws", "wzp", "ys", "yzp"], ["y"], name="conv", pads=[1] * 4
    )
    x = helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, [None, w.shape[1], 6, 6])
    graph = helper.make_graph(
        [node], "conv", [x], [helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.fixture
def avx2_host(monkeypatch):
    """The machine's own preset (``onnxruntime``) resolved as on an x86 CPU without VNNI."""
    from pytest_qaccuracy.backend import host

    monkeypatch.setenv(host.ENV_OVERRIDE, "onnxruntime-avx2")
    host.host_preset.cache_clear()
    yield
    host.host_preset.cache_clear()


def _sqnr_against(exact: np.ndarray, value: np.ndarray) -> float:
    ref = exact.astype(np.float64)
    return float(10 * np.log10(np.sum(ref * ref) / np.sum((value.astype(np.float64) - ref) ** 2)))


def test_remedies_run_on_the_reports_preset_against_the_originals_exact_sums(tmp_path, avx2_host) -> None:
    from pytest_qaccuracy.backend import IntegerSession

    rng = np.random.default_rng(37)
    w = rng.choice(np.array([-128, -128, -50, 3, 90], np.int8), size=(6, 8, 3, 3)).astype(np.int8)
    x = np.where(rng.random((5, 8, 6, 6)) < 0.5, 0, rng.integers(1, 256, (5, 8, 6, 6))).astype(np.uint8)
    np.savez(tmp_path / "data.npz", x=x)
    model = _qlinear_conv(w)

    def run(proto, preset) -> np.ndarray:
        return IntegerSession(proto, preset).run(None, {"x": x})[0]

    # x86 without VNNI: the pairs saturate; both weight remedies stop it
    report = saturation.measure_saturation(model, tmp_path / "data.npz", batch_size=2)
    assert report.saturated > 0
    exact = run(model, "onnxruntime-vnni")
    assert report.outputs == {"y": pytest.approx(_sqnr_against(exact, run(model, "onnxruntime-avx2")))}
    halved = run(saturation._rewrite_weights(model, saturation._halve), "onnxruntime-avx2")
    found = saturation.check_remedies(model, tmp_path / "data.npz", report, batch_size=2)
    assert found == [
        saturation.RemedyResult(
            "7-bit weights", "quantize with reduce_range=True", 0, {"y": pytest.approx(_sqnr_against(exact, halved))}
        ),
        saturation.RemedyResult(
            "u8 weights", "weight_type=QuantType.QUInt8, or session.x64quantprecision=1 on onnxruntime", 0, {"y": None}
        ),
        saturation.RemedyResult("worst layers in float", "nodes_to_exclude=['conv']", None, {}, "QDQ models only"),
    ]
    # ARM64 without dot products: the int8 pairs wrap; symmetric weights stop it there (on x86 they
    # would still saturate), measured against the same preset with exact sums
    report = saturation.measure_saturation(model, tmp_path / "data.npz", preset="onnxruntime-arm64-neon")
    assert report.saturated > 0
    exact = run(model, saturation.exact_counterpart("onnxruntime-arm64-neon")[1])
    symmetric = saturation._rewrite_weights(model, saturation._symmetric)
    assert saturation.measure_saturation(symmetric, tmp_path / "data.npz").saturated > 0
    found = saturation.check_remedies(model, tmp_path / "data.npz", report)
    expected = _sqnr_against(exact, run(symmetric, "onnxruntime-arm64-neon"))
    assert found == [
        saturation.RemedyResult(
            "symmetric weights",
            'quantize with extra_options={"WeightSymmetric": True}',
            0,
            {"y": pytest.approx(expected)},
        ),
        saturation.RemedyResult("worst layers in float", "nodes_to_exclude=['conv']", None, {}, "QDQ models only"),
    ]


def test_a_model_without_int8_kernel_weights_has_nothing_to_change(tmp_path, avx2_host) -> None:
    model = _qlinear_conv(np.ones((2, 2, 3, 3), np.int8))
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.ones((2, 2, 3, 3), np.uint8), "w"))
    model.graph.initializer[4].CopyFrom(numpy_helper.from_array(np.uint8(0), "wzp"))
    np.savez(tmp_path / "data.npz", x=np.full((2, 2, 6, 6), 3, np.uint8))
    report = saturation.measure_saturation(model, tmp_path / "data.npz")
    assert report.saturated == 0 and report.outputs == {"y": None}
    found = saturation.check_remedies(model, tmp_path / "data.npz", report)
    assert [(r.name, r.how, r.saturated, r.outputs, r.note) for r in found] == [
        ("7-bit weights", "quantize with reduce_range=True", None, {}, "nothing to change"),
        (
            "u8 weights",
            "weight_type=QuantType.QUInt8, or session.x64quantprecision=1 on onnxruntime",
            None,
            {},
            "nothing to change",
        ),
        ("worst layers in float", "nodes_to_exclude=[]", None, {}, "QDQ models only"),
    ]


def test_an_open_dataset_is_read_and_left_open_and_a_path_is_closed(tmp_path, monkeypatch) -> None:
    from pytest_qaccuracy.data import load_dataset

    rng = np.random.default_rng(3)
    model = _qlinear_conv(rng.integers(-128, 128, (2, 2, 3, 3)).astype(np.int8))
    np.savez(tmp_path / "data.npz", x=rng.integers(0, 256, (3, 2, 6, 6)).astype(np.uint8))
    with load_dataset(tmp_path / "data.npz") as dataset:
        for _ in range(2):  # the caller's dataset stays open
            report = saturation.measure_saturation(model, dataset)
            remedies = saturation.check_remedies(model, dataset, report)
        assert report.records == 3 and len(remedies) == 3
    closed = record_closes(monkeypatch, saturation)
    report = saturation.measure_saturation(model, tmp_path / "data.npz")
    saturation.check_remedies(model, tmp_path / "data.npz", report)
    assert closed == [tmp_path / "data.npz"] * 2


def test_a_weight_that_is_no_initializer_is_not_rewritten() -> None:
    model = _qlinear_matmul()
    model.graph.node[0].input[3] = "computed"  # the weight comes from the graph, not an initializer
    assert saturation._rewrite_weights(model, saturation._halve) is None


def test_only_int8_weights_with_constant_scale_and_zero_point_are_rewritten_kernel_by_kernel() -> None:
    model = _qlinear_matmul()
    model.graph.node[0].input[4] = "scale_in"  # a scale that is no initializer
    assert saturation._rewrite_weights(model, saturation._halve) is None
    # a kernel with u8 weights first, then one with int8 weights: the second is rewritten
    model = _qlinear_matmul()
    u8 = onnx.NodeProto()
    u8.CopyFrom(model.graph.node[0])
    u8.name, u8.input[3], u8.input[5], u8.output[0] = "u8", "w8", "wz8", "y8"
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.full((2, 2), 200, np.uint8), "w8"), numpy_helper.from_array(np.uint8(0), "wz8")]
    )
    model.graph.node.insert(0, u8)
    copy = saturation._rewrite_weights(model, saturation._halve)
    assert copy.graph.node[0].input[3] == "w8" and copy.graph.node[1].input[3] == "w::mm:3"


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_a_dequantized_matmul_or_gemm_weight_is_rewritten(op: str) -> None:
    model = _qdq_conv(bias=False)
    model.graph.node[2].op_type = op
    copy = saturation._rewrite_weights(model, saturation._halve)
    assert copy is not None and list(copy.graph.node[0].input) == ["w::dqw:0", "ws::dqw:1", "wz::dqw:2"]


def test_a_weight_sliced_from_int8_constants_is_no_dequantized_weight() -> None:
    """A Conv's weight from a Slice of three constants (data, starts, ends): not a DequantizeLinear."""
    tensor = numpy_helper.from_array
    inits = [tensor(np.full((4, 1, 1, 1), -100, np.int8), "w"), tensor(np.array([0], np.int64), "st")]
    inits.append(tensor(np.array([2], np.int64), "en"))
    nodes = [helper.make_node("Slice", ["w", "st", "en"], ["ws"]), helper.make_node("Conv", ["x", "ws"], ["y"])]
    assert (
        saturation._rewrite_weights(helper.make_model(helper.make_graph(nodes, "g", [], [], inits)), saturation._halve)
        is None
    )


def test_a_matmulinteger_saturates_pair_by_pair_against_brute_force(tmp_path) -> None:
    """u8 x s8 products summed in int16 pairs, each pair sum saturated (x86 without VNNI); its int32
    output is no 8-bit tensor, so no elements are compared; the model is labelled by its graph."""
    rng = np.random.default_rng(1)
    b = rng.choice(np.array([-128, 127, 100], np.int8), size=(16, 3)).astype(np.int8)
    a = rng.integers(200, 256, (4, 16)).astype(np.uint8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["i"], name="mmi")],
        "mmi_graph",
        [helper.make_tensor_value_info("a", onnx.TensorProto.UINT8, [None, 16])],
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    np.savez(tmp_path / "data.npz", a=a)
    products = a.astype(np.int64)[:, :, None] * b.astype(np.int64)  # (records, K, N)
    pairs = products[:, 0::2] + products[:, 1::2]
    saturated = (pairs > 32767) | (pairs < -32768)
    exact = products.sum(axis=1).astype(np.float64)
    summed = np.clip(pairs, -32768, 32767).sum(axis=1).astype(np.float64)
    report = saturation.measure_saturation(model, tmp_path / "data.npz", batch_size=3)
    per_record = saturated.reshape(4, -1).sum(axis=1)
    (layer,) = report.layers
    assert (layer.node, layer.pairs, layer.saturated) == ("mmi", pairs.size, int(saturated.sum()))
    assert (layer.worst_record, layer.worst_record_saturated) == (int(np.argmax(per_record)), int(per_record.max()))
    assert (layer.tensor, layer.elements, layer.differing, layer.max_steps) == ("i", 0, 0, 0)
    assert report.outputs["i"] == pytest.approx(10 * np.log10(np.sum(exact**2) / np.sum((summed - exact) ** 2)))
    assert (report.model, report.records) == ("mmi_graph", 4)
    model.graph.name = ""
    assert saturation.measure_saturation(model, tmp_path / "data.npz").model == "model"
    onnx.save(model, tmp_path / "net.onnx")
    assert saturation.measure_saturation(tmp_path / "net.onnx", tmp_path / "data.npz").model == "net.onnx"
    # small weights: pair sums counted, none saturated, no worst record
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.ones((16, 3), np.int8), "b"))
    (layer,) = saturation.measure_saturation(model, tmp_path / "data.npz").layers
    assert (layer.pairs, layer.saturated, layer.worst_record, layer.worst_record_saturated) == (96, 0, None, 0)


class _Ticks:
    """A clock that counts its readings: a Deadline reads it once per check."""

    def __init__(self) -> None:
        self.readings = 0

    def __call__(self) -> float:
        self.readings += 1
        return 0.0


@pytest.mark.parametrize(("strategy", "checks"), [("naive", 3 + 2 + 2 * 3), ("reuse", 1 + 3)])
def test_the_runner_checks_its_deadline_before_each_batch_and_session(zoo, monkeypatch, strategy, checks) -> None:
    """12 records in batches of 5. Naive: each fp32 batch, each experiment, each of its batches.
    Reuse: the one packed session's build, then each batch."""
    from pytest_qaccuracy.analysis.deadline import Deadline

    labels = []
    real = experiments_module.OrtRunner

    def runner(model, names, options, label):
        labels.append(label)
        return real(model, names, options, label)

    monkeypatch.setattr(experiments_module, "OrtRunner", runner)
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    ticks = _Ticks()
    with open_session(pair, zoo["data"], "mse", RuntimeOptions(batch_size=5), strategy=strategy) as session:
        experiments = [Experiment(n, session.qgraph.node(n).edges()) for n in ("conv1", "gemm")]
        session.runner.run(experiments, "float", Deadline(1.0, 1.0, ticks))
    assert ticks.readings == checks
    name = pair.quantized_path.name
    if strategy == "naive":
        assert labels == [f"{name} (fp32)", f"{name} [conv1]", f"{name} [gemm]"]
    else:
        assert labels == [f"{name} (cache)", f"{name} (fp32)"]


def test_nonfinite_inputs_are_refused_unless_allowed(zoo, tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
    x[1, 0, 0, 0] = np.inf
    np.savez(tmp_path / "inf.npz", x=x)
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    from pytest_qaccuracy.errors import DataError

    with pytest.raises(DataError, match=r"record 1, input 'x': contains"):
        node_sensitivity(pair, tmp_path / "inf.npz", nodes=["conv1"])
    result = node_sensitivity(pair, tmp_path / "inf.npz", nodes=["conv1"], allow_nonfinite=True, metrics="mse")
    assert result.records == 2 and _names(result.nodes) == ["conv1"]


def test_node_sensitivity_hands_every_choice_to_its_session_and_closes_it(monkeypatch) -> None:
    from pytest_qaccuracy.analysis import sensitivity as sensitivity_module

    calls = []

    class Opened:
        closed = False

        def close(self) -> None:
            self.closed = True

    opened = Opened()

    def session(*args, **kwargs):
        calls.append((args, kwargs))
        return opened

    monkeypatch.setattr(sensitivity_module, "open_session", session)
    monkeypatch.setattr(sensitivity_module, "sensitivity_in", lambda *args: ("measured", args))
    options = RuntimeOptions(batch_size=3)
    result = node_sensitivity(
        "PAIR", "DATA", "leave-one-out", "weight", "mse", ["a"], options, "deployed", "naive", True, ["t"]
    )  # type: ignore[arg-type]
    assert calls == [(("PAIR", "DATA", "mse", options, "deployed", "naive", True), {"outputs": ["t"]})]
    assert result == ("measured", (opened, "leave-one-out", "weight", ["a"])) and opened.closed
    calls.clear()
    node_sensitivity("PAIR", "DATA")  # type: ignore[arg-type]
    assert calls == [(("PAIR", "DATA", "cosine", None, "reference", "reuse", False), {"outputs": None})]


@pytest.mark.parametrize(
    ("threads", "nodes", "pooled"),
    [(2, ("conv1", "gemm"), True), (1, ("conv1", "gemm"), False), (2, ("conv1",), False)],
)
def test_packed_sessions_run_side_by_side_only_with_several_workers_and_packs(
    zoo, monkeypatch, threads, nodes, pooled
) -> None:
    """One pack per experiment: with two workers and two packs each pack runs on a worker thread of
    its own; with one worker, or one pack, on the caller's thread."""
    import threading

    monkeypatch.setattr(experiments_module, "SESSION_NODES", 1)
    seen = []
    real = ExperimentRunner._call

    def call(self, pack, feeds):
        seen.append(threading.current_thread().name)
        return real(self, pack, feeds)

    monkeypatch.setattr(ExperimentRunner, "_call", call)
    sessions = []
    made = experiments_module._session

    def build(model, options, label, threads):
        sessions.append((label, threads))
        return made(model, options, label, threads)

    monkeypatch.setattr(experiments_module, "_session", build)
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with open_session(pair, zoo["data"], "mse", RuntimeOptions(batch_size=12, threads=threads)) as session:
        experiments = [Experiment(n, session.qgraph.node(n).edges()) for n in nodes]
        session.runner.run(experiments, "float")
    assert len(seen) == len(nodes)
    # side by side, each session has one thread; alone, the threads asked
    assert sessions == [(pair.quantized_path.name, 1 if threads > 1 else threads)] * len(nodes)
    if pooled:
        assert all(name.startswith("qaccuracy-experiment_") for name in seen)
    else:
        assert seen == ["MainThread"] * len(nodes)


def test_an_experiment_session_takes_the_runs_options_and_its_own_thread_count(monkeypatch) -> None:
    made = []
    monkeypatch.setattr(experiments_module, "make_session", lambda model, **kwargs: made.append((model, kwargs)) or "S")
    options = RuntimeOptions(providers=("CPUExecutionProvider",), optimization="basic", threads=4)
    assert experiments_module._session("M", options, "net", 1) == "S"
    assert made == [
        (
            "M",
            {
                "providers": options.providers,
                "threads": 1,
                "optimization": "basic",
                "config": options.session_config,
            },
        )
    ]


def test_a_pack_holds_up_to_session_nodes_nodes_on_the_dot(zoo, monkeypatch) -> None:
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with open_session(pair, zoo["data"], "mse") as session:
        experiments = [Experiment(n, session.qgraph.node(n).edges()) for n in ("conv3", "gemm")]
        (whole,), _ = session.runner._plan(experiments, frozenset())
        first = len(session.runner._plan(experiments[:1], frozenset())[0][0].nodes)
        assert 0 < first < len(whole.nodes)
        for limit, packs in ((len(whole.nodes), [[0, 1]]), (len(whole.nodes) - 1, [[0], [1]])):
            monkeypatch.setattr(experiments_module, "SESSION_NODES", limit)
            assert [p.experiments for p in session.runner._plan(experiments, frozenset())[0]] == packs


@pytest.mark.parametrize("cache", ["float", "quantized"])
def test_the_reused_configuration_is_all_float_or_all_quantized(zoo, cache) -> None:
    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with open_session(pair, zoo["data"], "mse") as session:
        built = []
        build = session.qgraph.build
        session.qgraph.build = lambda edges, **kwargs: built.append(edges) or build(edges, **kwargs)
        experiment = Experiment("conv3", session.qgraph.node("conv3").edges())
        # the float configuration is the default
        (result,) = session.runner.run([experiment]) if cache == "float" else session.runner.run([experiment], cache)
        assert built[0] == (frozenset() if cache == "float" else session.qgraph.all_edges)
    # either way, the numbers of the experiment run alone
    with open_session(pair, zoo["data"], "mse", strategy="naive") as naive:
        (alone,) = naive.runner.run([experiment])
    assert result["logits"]["mse"] == pytest.approx(alone["logits"]["mse"], rel=1e-9)


def test_a_session_takes_an_open_dataset_and_refuses_nonfinite_inputs_by_default(zoo, tmp_path) -> None:
    from pytest_qaccuracy.data import load_dataset
    from pytest_qaccuracy.errors import DataError

    pair = ModelPair(zoo["fp32"], zoo["qdq_u8"])
    with load_dataset(zoo["data"]) as dataset:
        with open_session(pair, dataset, records=4) as session:
            assert session.records == 4 and not session.owns_dataset
        with open_session(pair, dataset) as session:  # still open after the first session closed
            assert session.records == 12
    x = np.zeros((2, 3, 16, 16), np.float32)
    x[0, 0, 0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", x=x)
    with open_session(pair, tmp_path / "nan.npz") as session:  # the records are checked as they are read
        experiment = Experiment("conv1", session.qgraph.node("conv1").edges())
        with pytest.raises(DataError, match=r"record 0, input 'x': contains NaN"):
            session.runner.run([experiment])
    with open_session(pair, tmp_path / "nan.npz", allow_nonfinite=True) as session:
        assert len(session.runner.run([experiment])) == 1


def test_block_sums_of_opposite_infinities_give_nan_without_a_warning() -> None:
    import warnings

    spec = replace(_spec(["mse"], params=None, q=(FLOAT, ["n", 2, 3])), sum_fields=("sq_err",))
    layer = _reduced(["mse"], None)
    sums = np.array([[[1.0, 2.0]], [[np.inf, -np.inf]]], np.float32)  # (records, fields, blocks)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reduced.fold_reduced(layer, spec, {"sums": sums}, 0)
    assert layer.results() == ({"mse": None}, {"mse": "NaN or Inf in the compared values"})
