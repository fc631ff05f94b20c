"""The recipe search's estimates (``analysis/recipe/estimate.py``) with stand-ins for the sensitivity
session: how the work-reuse runner's passes are sized from their pace and the time left, when whole
edited models are run instead, what progress is written, how nodes are ordered from their estimated
gains and SQNR drops, and each node's SQNR drop from a layer-wise comparison."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
from onnx import TensorProto, helper

from pytest_qaccuracy.analysis.recipe import estimate as estimate_module
from pytest_qaccuracy.analysis.recipe.checks import parse_checks
from pytest_qaccuracy.analysis.recipe.measure import judge
from tests.progress_recorders import Clock

COSINE = parse_checks(["cosine>=0.99"])


class _Runner:
    """The work-reuse runner's stand-in: set ``n`` has metrics ``values(n)``; each set takes ``pace``
    seconds of the clock; writes down each pass's size and the experiments' sets of edges."""

    def __init__(self, clock: Clock, pace: float, values=lambda n: {"y": {"cosine": 0.5 + n / 1000}}) -> None:
        self.clock, self.pace, self.values = clock, pace, values
        self.passes: list[int] = []
        self.edges: list[frozenset] = []
        self.count = 0

    def run(self, experiments, side):
        assert side == "quantized"
        self.passes.append(len(experiments))
        for experiment in experiments:
            self.edges.append(experiment.enabled)
            self.clock.now += self.pace
            self.count += 1
            yield self.values(self.count - 1)


def _estimator(monkeypatch, pace: float = 1.0, checks=COSINE, measure=None, direct=True, **runner):
    """An Estimator without a model: a runner stand-in, ``enabled`` the set's names, notes kept."""
    clock = Clock()
    monkeypatch.setattr(estimate_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    estimator = estimate_module.Estimator.__new__(estimate_module.Estimator)
    estimator.checks, estimator.measure, estimator.direct = list(checks), measure, direct
    estimator.notes = []
    estimator.note = estimator.notes.append
    estimator.enabled = lambda names: frozenset(names)
    estimator.session = SimpleNamespace(runner=_Runner(clock, pace, **runner), records=4)
    estimator.qgraph = SimpleNamespace(build=lambda enabled: ("model", enabled))
    return estimator, clock


@pytest.mark.parametrize(
    ("pace", "passes"),
    [
        (1.0, [8, 30, 30, 30, 2]),  # 30 s of notes at 1 s a set
        (7.0, [8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4]),
        (0.1, [8, 92]),  # 300 would fit: at most 128 a pass
        (0.0001, [8, 92]),  # no pace measured: 1 ms a set at the least
    ],
)
def test_a_pass_holds_what_fits_in_half_a_minute_at_the_last_pace(monkeypatch, pace, passes):
    estimator, _ = _estimator(monkeypatch, pace)
    sets = [[f"n{i}"] for i in range(100)]
    out = estimator.margins(sets, "ranking")
    assert estimator.session.runner.passes == passes
    assert estimator.session.runner.edges == [frozenset(s) for s in sets]
    assert out == [judge({"estimate": {"y": {"cosine": 0.5 + n / 1000}}}, COSINE).margin for n in range(100)]
    done = [sum(passes[: i + 1]) for i in range(len(passes))]
    assert estimator.notes == [f"ranking: {d}/100 estimated" for d in done]


def test_few_sets_write_no_progress(monkeypatch):
    estimator, _ = _estimator(monkeypatch)
    out = estimator.margins([[f"n{i}"] for i in range(8)], "pruning")
    assert len(out) == 8 and estimator.notes == [] and estimator.session.runner.passes == [8]
    estimator.margins([[f"n{i}"] for i in range(9)], "pruning")
    assert estimator.notes == ["pruning: 8/9 estimated", "pruning: 9/9 estimated"]


def test_the_proxy_ranks_by_the_output_sqnr(monkeypatch):
    """``proxy``: the margin of SQNR >= 100 dB, whatever the checks."""
    values = lambda n: {"y": {"cosine": 0.999, "sqnr": 20.0 + n}}  # noqa: E731
    estimator, _ = _estimator(monkeypatch, values=values)
    out = estimator.margins([["a"], ["b"]], "ranking", proxy=True)
    assert out == [judge({"e": values(n)}, [estimate_module.PROXY]).margin for n in (0, 1)]
    assert str(estimate_module.PROXY) == "sqnr >= 100" and out[0] < out[1] < 0


def test_the_room_left_caps_each_pass_at_half_of_it_at_the_slowest_pace(monkeypatch):
    """The first pass runs unbounded (no pace yet); then a pass holds half the room at the slowest
    pace so far; when not one set fits, the estimation ends with a note."""
    estimator, clock = _estimator(monkeypatch, pace=2.0)
    budget_end = 50.0
    out = estimator.margins([[f"n{i}"] for i in range(40)], "ranking", room=lambda: budget_end - clock.now)
    # after 8 sets (16 s): 34 s left, half at 2 s a set = 8; then 18 s left: 4; then 10 s: 2; 6 s: 1;
    # 4 s: 1; 2 s: half is 1 s, less than a set
    assert estimator.session.runner.passes == [8, 8, 4, 2, 1, 1]
    assert len(out) == 24
    assert estimator.notes[-1] == "ranking: 24/40 estimated, no time left for the others"


def test_no_room_measured_means_no_limit(monkeypatch):
    estimator, _ = _estimator(monkeypatch, pace=1.0)
    out = estimator.margins([[f"n{i}"] for i in range(20)], "ranking", room=lambda: None)
    assert len(out) == 20 and estimator.session.runner.passes == [8, 12]


def test_the_slowest_pace_not_the_last_sizes_the_room(monkeypatch):
    paces = iter([3.0] * 8 + [1.0] * 100)
    estimator, clock = _estimator(monkeypatch)
    sizes = []

    def run(experiments, side):
        sizes.append(len(experiments))
        for _ in experiments:
            clock.now += next(paces)
            yield {"y": {"cosine": 0.9}}

    estimator.session.runner.run = run
    out = estimator.margins([[f"n{i}"] for i in range(60)], "ranking", room=lambda: 40.0 - clock.now)
    # 8 sets at 3 s (24 s); then half the room left at 3 s a set, though the later sets take 1 s:
    # 16 s left: 2; 14: 2; 12: 2; 10, 9, 8, 7, 6: 1 each; 5 s: none
    assert sizes == [8, 2, 2, 2, 1, 1, 1, 1, 1] and len(out) == 19


def test_enough_ends_after_the_pass_that_satisfies_it(monkeypatch):
    estimator, _ = _estimator(monkeypatch, pace=0.5)
    seen = []

    def enough(margins):
        seen.append(len(margins))
        return len(margins) >= 10

    out = estimator.margins([[f"n{i}"] for i in range(200)], "ranking", enough=enough)
    assert seen == [8, 68] and len(out) == 68


@pytest.mark.parametrize("count", [1, 2])
def test_one_or_two_sets_run_as_whole_edited_models(monkeypatch, count):
    built = []
    estimator, _ = _estimator(monkeypatch, measure=lambda model: built.append(model) or -0.5 * len(built))
    out = estimator.margins([[f"n{i}"] for i in range(count)], "prefixes")
    assert out == [-0.5 * (i + 1) for i in range(count)]
    assert built == [("model", frozenset([f"n{i}"])) for i in range(count)]
    assert estimator.session.runner.passes == []


def test_three_sets_go_to_the_runner_when_it_computes_the_checks(monkeypatch):
    estimator, _ = _estimator(monkeypatch, measure=lambda model: 1.0)
    out = estimator.margins([["a"], ["b"], ["c"]], "prefixes")
    assert len(out) == 3 and estimator.session.runner.passes == [3]


def test_checks_the_runner_cannot_compute_are_measured_on_whole_models(monkeypatch):
    """Not ``direct`` (a top-k or task check): every set is a whole model, progress every 8."""
    built = []
    estimator, _ = _estimator(monkeypatch, measure=lambda model: built.append(model) or 0.25, direct=False)
    out = estimator.margins([[f"n{i}"] for i in range(17)], "pruning")
    assert out == [0.25] * 17 and len(built) == 17 and estimator.session.runner.passes == []
    assert estimator.notes == ["pruning: 8/17 estimated", "pruning: 16/17 estimated"]
    # the proxy (ranking) still runs on the runner
    estimator.margins([["a"], ["b"]], "ranking", proxy=True)
    assert estimator.session.runner.passes == [2]


def test_droppable_sets_quantize_each_node_again(monkeypatch):
    estimator, _ = _estimator(monkeypatch)
    asked = []
    estimator.margins = lambda floats, what, **k: asked.append((what, [list(f) for f in floats])) or []
    estimator.droppable_margins(["a", "b", "c"], ["b", "c"])
    assert asked == [
        ("pruning", [["a", "c"], ["a", "b"]]),
    ]


def _ordering(monkeypatch, margins, direct=True, records=4):
    """An estimator whose ``margins`` returns ``margins`` (base first) and keeps what it was asked."""
    estimator, _ = _estimator(monkeypatch, direct=direct)
    estimator.session.records = records
    asked = {}

    def fake(floats, what, proxy=False, room=None, enough=None):
        asked.update(floats=[list(f) for f in floats], what=what, proxy=proxy, room=room, enough=enough)
        return list(margins)

    estimator.margins = fake
    return estimator, asked


def test_nodes_are_ordered_by_gain_per_cost_then_the_cheapest(monkeypatch):
    cost = {"a": 0.125, "b": 2.0, "c": 1.0, "d": 2.0, "e": 0.5}.__getitem__
    # base -1.0; gains a 0.25, b 1.0, c 0 (no gain), d -0.125 (worse), e not estimated (cut short)
    estimator, asked = _ordering(monkeypatch, [-1.0, -0.75, 0.0, -1.0, -1.125])
    order = estimator.order(["a", "b", "c", "d", "e"], cost)
    # gain per cost: a 2.0, b 0.5; then the others cheapest first
    assert order == ["a", "b", "e", "c", "d"]
    assert asked["floats"] == [[], ["a"], ["b"], ["c"], ["d"], ["e"]] and asked["what"] == "ranking"
    assert asked["proxy"] is False
    assert estimator.base == -1.0
    assert estimator.gains == {"a": 0.25, "b": 1.0, "c": 0.0, "d": -0.125}
    assert estimator.notes == ["ranking 5 node(s) by the gain of each alone in float on 4 evaluation record(s)"]


def test_a_gain_is_by_cost_not_alone(monkeypatch):
    cost = {"a": 10.0, "b": 1.0}.__getitem__
    estimator, _ = _ordering(monkeypatch, [-1.0, -0.5, -0.9])  # a gains 0.5 for 10, b 0.1 for 1
    assert estimator.order(["a", "b"], cost) == ["b", "a"]


def test_an_infinite_margin_gains_nothing(monkeypatch):
    cost = {"a": 1.0, "b": 1.0, "c": 2.0}.__getitem__
    estimator, _ = _ordering(monkeypatch, [-math.inf, -0.5, 0.1, -1.0])
    assert estimator.order(["a", "b", "c"], cost) == ["a", "b", "c"]  # none helpful: cheapest first
    assert estimator.gains == {"a": 0.0, "b": 0.0, "c": 0.0}
    estimator, _ = _ordering(monkeypatch, [-1.0, math.nan, -0.5, -1.0])
    assert estimator.order(["a", "b", "c"], cost) == ["b", "a", "c"]
    assert estimator.gains == {"a": 0.0, "b": 0.5, "c": 0.0}


def test_a_proxy_ranks_when_the_checks_are_not_the_runners(monkeypatch):
    estimator, asked = _ordering(monkeypatch, [0.0, 0.0], direct=False)
    estimator.order(["a"], lambda n: 1.0, room=lambda: 10.0)
    assert asked["proxy"] is True
    assert asked["enough"]([-1.0, 0.5]) is False  # the proxy's margin says nothing of the checks


def test_a_timed_ranking_ends_at_a_node_passing_alone(monkeypatch):
    estimator, asked = _ordering(monkeypatch, [0.0, 0.0])
    room = lambda: 10.0  # noqa: E731
    estimator.order(["a"], lambda n: 1.0, room=room)
    enough = asked["enough"]
    assert asked["room"] is room
    assert enough([0.5, -1.0, -0.1]) is False  # the base passing is not a node passing
    assert enough([-1.0, -1.0, 0.0]) is True  # at its bound counts
    assert enough([-1.0, 0.25, -1.0]) is True  # the first node
    assert enough([-1.0]) is False
    estimator.order(["a"], lambda n: 1.0)  # no time limit: every node is estimated
    assert asked["enough"]([-1.0, 1.0]) is False


def test_above_the_leave_one_out_limit_the_nodes_are_chosen_by_drop(monkeypatch):
    """The output's writers first, then the top nodes by SQNR drop, estimated by drop per cost; the
    others follow the estimated ones by drop per cost."""
    monkeypatch.setattr(estimate_module, "LEAVE_ONE_OUT_NODES", 3)
    drops = {"a": 1.0, "b": 6.0, "c": 3.0, "d": 4.0, "e": 2.0}
    cost = {"a": 1.0, "b": 6.0, "c": 1.0, "d": 1.0, "e": 1.0, "f": 0.25}.__getitem__
    called = []
    monkeypatch.setattr(
        estimate_module,
        "layer_drops",
        lambda session, nodes, options: called.append((session, nodes, options)) or drops,
    )
    estimator, asked = _ordering(monkeypatch, [-1.0, -1.0, -1.0, -1.0], records=6)
    estimator.options = "options"
    estimator.session.pair = SimpleNamespace(quantized=SimpleNamespace(graph=SimpleNamespace(output=[])))
    estimator.qgraph = SimpleNamespace(nodes=[SimpleNamespace(name=n) for n in "abcde"])
    estimator._writes = lambda node: ["y"] if node.name == "a" else []
    estimator.session.pair.quantized.graph.output = [SimpleNamespace(name="y")]
    order = estimator.order(["a", "b", "c", "d", "e"], cost)
    # a writes the output; then the top 2 of the rest by drop (b 6, d 4), by drop per cost: d 4, b 1
    assert asked["floats"] == [[], ["a"], ["d"], ["b"]]
    assert estimator.notes == [
        "ranking 5 node(s) by their SQNR drop, one pass over 6 evaluation record(s)",
        "ranking 3 node(s) by the gain of each alone in float on 6 evaluation record(s)",
    ]
    # no gains: by drop per cost (d 4, c 3, e 2, b 1, a 1; a and b equal: the cheaper first)
    assert order == ["d", "c", "e", "a", "b"]
    assert called == [(estimator.session, ["a", "b", "c", "d", "e"], "options")]


def test_at_the_leave_one_out_limit_every_node_is_estimated(monkeypatch):
    monkeypatch.setattr(estimate_module, "LEAVE_ONE_OUT_NODES", 3)
    monkeypatch.setattr(estimate_module, "layer_drops", _no_drops)
    estimator, asked = _ordering(monkeypatch, [-1.0, -1.0, -1.0, -1.0])
    estimator.order(["a", "b", "c"], lambda n: 1.0)
    assert asked["floats"] == [[], ["a"], ["b"], ["c"]]


def _no_drops(*args):
    raise AssertionError("no layer-wise pass at or below the limit")


def test_drop_per_cost_of_cheap_nodes_is_not_floored_at_one(monkeypatch):
    """Above the limit, the chosen nodes are estimated by drop per cost: a node of cost 0.25 and drop 1
    (4 per unit) before one of cost 1 and drop 2."""
    monkeypatch.setattr(estimate_module, "LEAVE_ONE_OUT_NODES", 2)
    drops = {"a": 1.0, "b": 2.0, "c": 0.5}
    cost = {"a": 0.25, "b": 1.0, "c": 1.0}.__getitem__
    monkeypatch.setattr(estimate_module, "layer_drops", lambda *args: drops)
    estimator, asked = _ordering(monkeypatch, [-1.0, -1.0, -1.0])
    estimator.options = None
    estimator.session.pair = SimpleNamespace(quantized=SimpleNamespace(graph=SimpleNamespace(output=[])))
    estimator.qgraph = SimpleNamespace(nodes=[])
    estimator.order(["a", "b", "c"], cost)
    assert asked["floats"] == [[], ["a"], ["b"]]


class _Layer(SimpleNamespace):
    pass


def _layers_model():
    """x -> A -> t1; t1, x -> B -> t2, t3; t2 -> C -> y; an unnamed node; D reads only x."""
    nodes = [
        helper.make_node("Relu", ["x"], ["t1"], name="A"),
        helper.make_node("Split", ["t1"], ["t2", "t3"], name="B", axis=0),
        helper.make_node("Relu", ["t2"], ["y"], name="C"),
        helper.make_node("Relu", ["t3"], ["u"]),
        helper.make_node("Relu", ["x"], ["v"], name="D"),
        helper.make_node("Dropout", ["t1"], [""], name="E"),
    ]
    graph = helper.make_graph(
        nodes,
        "layers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "u", "v")],
    )
    return helper.make_model(graph)


def test_a_nodes_drop_is_from_its_worst_input_to_its_worst_output(monkeypatch):
    from pytest_qaccuracy.analysis import compare as compare_module

    layers = {"t1": 30.0, "t2": 12.0, "t3": 25.0}
    result = SimpleNamespace(
        layers=[_Layer(tensor=t, metrics={"sqnr": v}) for t, v in layers.items()],
        outputs=[_Layer(name="y", metrics={"sqnr": 5.0}), _Layer(name="v", metrics={"sqnr": 150.0})],
    )
    calls = []

    def compare(pair, data, metrics, options, capture):
        calls.append((pair, data, metrics, options, capture))
        return result

    monkeypatch.setattr(compare_module, "compare", compare)
    session = SimpleNamespace(pair=SimpleNamespace(fp32=_layers_model()), dataset="records")
    drops = estimate_module.layer_drops(session, ["missing", "A", "B", "C", "D", "E"], "options")
    assert calls == [(session.pair, "records", "sqnr", "options", "reference")]
    assert drops == {
        "A": 70.0,  # x is a graph input (exact, 100 dB) -> t1 30 dB
        "B": 18.0,  # 30 -> min(12, 25)
        "C": 7.0,  # 12 -> y, an output: 5
        "D": 0.0,  # x -> v, 150 dB capped at 100: 100 -> 100
        "E": 0.0,  # no named output: its input's SQNR both sides
        "missing": 0.0,
    }


def test_a_tensor_without_sqnr_counts_as_exact(monkeypatch):
    from pytest_qaccuracy.analysis import compare as compare_module

    result = SimpleNamespace(
        layers=[_Layer(tensor="x", metrics={"sqnr": 40.0}), _Layer(tensor="t1", metrics={"sqnr": None})],
        outputs=[],
    )
    monkeypatch.setattr(compare_module, "compare", lambda *a, **k: result)
    session = SimpleNamespace(pair=SimpleNamespace(fp32=_layers_model()), dataset=None)
    drops = estimate_module.layer_drops(session, ["A", "B"], None)
    assert drops == {"A": 0.0, "B": 0.0}  # x 40 -> t1 (None: 100); B's outputs unmeasured: its input's


def test_a_pass_of_one_when_a_set_takes_longer_than_half_a_minute(monkeypatch):
    estimator, _ = _estimator(monkeypatch, pace=40.0)
    estimator.margins([[f"n{i}"] for i in range(11)], "ranking")
    assert estimator.session.runner.passes == [8, 1, 1, 1]


def test_fast_sets_are_capped_by_the_room_at_their_own_pace(monkeypatch):
    """At 0.125 s a set, 10 s of room hold 40 sets (half of it), not 5 (a 1 s floor)."""
    estimator, clock = _estimator(monkeypatch, pace=0.125)
    estimator.margins([[f"n{i}"] for i in range(100)], "ranking", room=lambda: 11.0 - clock.now)
    assert estimator.session.runner.passes[:2] == [8, 40]


def test_eight_whole_models_write_no_progress(monkeypatch):
    estimator, _ = _estimator(monkeypatch, measure=lambda model: 0.0, direct=False)
    estimator.margins([[f"n{i}"] for i in range(8)], "pruning")
    assert estimator.notes == []


def test_experiments_are_named_by_their_place_in_the_pass(monkeypatch):
    estimator, _ = _estimator(monkeypatch, pace=3.0)
    names = []
    run = estimator.session.runner.run
    estimator.session.runner.run = lambda experiments, side: (
        names.append([e.label for e in experiments]) or run(experiments, side)
    )
    estimator.margins([[f"n{i}"] for i in range(12)], "ranking")
    assert names == [[str(i) for i in range(8)], [str(i) for i in range(4)]]


class _Opened:
    def __init__(self) -> None:
        self.calls = []

    def __call__(self, pair, evaluation, metrics, options, capture, records):
        self.calls.append(dict(pair=pair, evaluation=evaluation, metrics=metrics, options=options, capture=capture))
        self.records = records
        return SimpleNamespace(qgraph="qgraph", close=lambda: self.calls.append("closed"), records=records)


@pytest.mark.parametrize(
    ("checks", "measure", "direct", "metrics"),
    [
        (["cosine>=0.99", "sqnr>=20", "cosine>=0.995"], "given", True, ["cosine", "sqnr"]),
        (["cosine>=0.99"], None, True, ["cosine"]),
        (["min_top1_agreement>=0.9"], None, True, ["sqnr"]),  # no tensor metric: the proxy's
        (["min_top1_agreement>=0.9", "cosine>=0.99"], "given", False, ["cosine", "sqnr"]),
        (["cosine>=0.99 on y"], "given", False, ["sqnr"]),  # one output's check: measured whole
        (["sqnr>=30", "cosine>=0.99 on y"], "given", False, ["sqnr"]),
    ],
)
def test_the_session_computes_the_direct_checks_metrics_and_the_proxys(monkeypatch, checks, measure, direct, metrics):
    from pathlib import Path

    from pytest_qaccuracy.runtime import RuntimeOptions

    suite = Path(__file__).resolve().parents[2] / "example_suites"
    opened = _Opened()
    monkeypatch.setattr(estimate_module, "open_session", opened)
    options = RuntimeOptions(batch_size=5)
    measure = (lambda model: 0.0) if measure else None
    parsed = [
        replace(parse_checks([c.removesuffix(" on y")])[0], output="y" if c.endswith(" on y") else None) for c in checks
    ]
    quantized = suite / "models" / "digits_cnn.qdq.onnx"
    with estimate_module.Estimator(
        suite / "models" / "digits_cnn.onnx", quantized, "records", parsed, options, 3, print, measure
    ) as estimator:
        assert estimator.direct is direct and estimator.measure is measure
        (call,) = opened.calls
        assert call["metrics"] == metrics and call["options"] is options and call["capture"] == "deployed"
        assert call["evaluation"] == "records" and opened.records == 3
        assert Path(call["pair"].quantized_path) == quantized
        assert Path(call["pair"].fp32_path) == suite / "models" / "digits_cnn.onnx"
        assert estimator.options is options and estimator.qgraph == "qgraph" and estimator.label == quantized.name
        assert estimator.base is None and estimator.gains == {} and estimator.checks == parsed
    assert opened.calls[-1] == "closed"


def test_what_a_nodes_output_pair_delivers():
    """A node's outputs, and for each QuantizeLinear reading one, what that pair's DequantizeLinear
    writes; an output nothing reads (a graph output) and a QuantizeLinear nothing reads are fine."""
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"]),
        helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["cd"]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["rq"]),
    ]
    consumers = {"c": [(0, nodes[1], 0), (0, nodes[3], 0)], "cq": [(0, nodes[2], 0)], "r": [(0, nodes[4], 0)]}
    estimator = estimate_module.Estimator.__new__(estimate_module.Estimator)
    estimator.qgraph = SimpleNamespace(view=SimpleNamespace(nodes=nodes, consumers=consumers))
    assert estimator._writes(SimpleNamespace(index=0)) == ["c", "cd"]
    assert estimator._writes(SimpleNamespace(index=3)) == ["r"]  # its pair is read by nothing
    assert estimator._writes(SimpleNamespace(index=2)) == ["cd"]  # a graph output
