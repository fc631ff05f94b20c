"""The recipe search's global phase and its statistics: histogram kinds folded one pass each (the
cheapest method's first), the phase's share of a time budget with the floor of the first histogram
method, rows reused when a method's ranges equal another's, and the node ranking's estimation order."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from pytest_qaccuracy.analysis.calibration import CalibrationOptions, compute_ranges
from pytest_qaccuracy.analysis.calibration import candidates as C
from pytest_qaccuracy.analysis.calibration.auto import extrema_pass, histogram_pass
from pytest_qaccuracy.analysis.recipe import Budget, Recipe, parse_checks, search_recipe
from pytest_qaccuracy.analysis.recipe import estimate as estimate_module
from pytest_qaccuracy.analysis.recipe.build import HISTOGRAM_RULES, RecipeBuilder, default_methods
from pytest_qaccuracy.analysis.recipe.search import GLOBAL_SHARE, STATISTICS_SHARE, RecipeSearch, Step
from pytest_qaccuracy.runtime import RuntimeOptions
from tests.ort_features import needs_cache

SUITE = Path(__file__).resolve().parents[2] / "example_suites"
FP32 = SUITE / "models" / "digits_cnn.onnx"
CALIB = SUITE / "data" / "digits_calib.npz"
TEST = SUITE / "data" / "digits_test.npz"


def test_histogram_pass_folds_only_the_kinds_asked():
    rng = np.random.default_rng(3)
    batches = [{"t": rng.standard_normal((4, 50)).astype(np.float32) * 3} for _ in range(3)]

    def passes():
        return iter([(b, 4) for b in batches])

    extrema = extrema_pass(passes, ["t"], 12)
    alone = histogram_pass(passes, ["t"], extrema, 12, ("mse",))["t"]
    assert alone.kl is None and alone.magnitude is None
    values = np.concatenate([b["t"].ravel() for b in batches]).astype(np.float64)
    bound = np.abs(values).max()
    by_hand = np.histogram(values, C.MSE_BINS, (-bound, bound))[0]
    np.testing.assert_array_equal(alone.mse.counts, by_hand)
    every = histogram_pass(passes, ["t"], extrema, 12)["t"]  # auto's: all three in one pass
    np.testing.assert_array_equal(every.mse.counts, alone.mse.counts)
    assert every.kl is not None and every.magnitude is not None
    with pytest.raises(ValueError, match="unknown histogram kind 'wide'"):
        histogram_pass(passes, ["t"], extrema, 12, ("wide",))


def test_builder_folds_each_histogram_when_a_method_needs_it():
    """The extrema pass alone for the cheap methods; each histogram method's own pass on first use;
    the ranges equal the calibration methods' own (``compute_ranges``, their calibrator)."""
    builder = RecipeBuilder(FP32, CALIB, RuntimeOptions())
    builder.statistics()
    assert builder.folded == [] and builder.pass_seconds > 0
    mse, kl = Recipe(method="mse", activation_type="int8"), Recipe(method="kl")
    assert builder.needs(Recipe(method="percentile")) is None and builder.expected_seconds(Recipe()) == 0
    assert (builder.needs(mse), builder.needs(kl)) == ("mse", "kl")
    assert 0 < builder.expected_seconds(mse) < builder.expected_seconds(kl)
    found = builder.estimated_ranges(mse)
    assert builder.folded == ["mse"] and builder.needs(mse) is None and builder.expected_seconds(mse) == 0
    assert all(s.kl is None and s.magnitude is None for s in builder._histograms.values())
    own = compute_ranges(str(FP32), CALIB, CalibrationOptions(method="mse", activation_type="int8")).ranges
    assert {n: found[n] for n in own} == own
    counts = {n: s.mse.counts.copy() for n, s in builder._histograms.items()}
    found = builder.estimated_ranges(kl)
    assert builder.folded == ["mse", "kl"]
    own = compute_ranges(str(FP32), CALIB, CalibrationOptions(method="kl")).ranges
    assert {n: found[n] for n in own} == own
    for name, stats in builder._histograms.items():  # the second pass kept the first's histograms
        np.testing.assert_array_equal(stats.mse.counts, counts[name])


def test_histogram_methods_come_last_cheapest_first():
    names = default_methods()
    slow = [m for m in names if m in HISTOGRAM_RULES]
    assert names[-len(slow) :] == tuple(slow)
    assert slow[0] == "mse" and slow[-1] == "kl"  # mse's 2047 bins before kl's 8001 and its search


class _Builder:
    """The statistics a global move needs: ``expected`` seconds for ``mse`` until folded."""

    def __init__(self, expected: float) -> None:
        self.expected, self.folded = expected, []

    def expected_seconds(self, recipe: Recipe) -> float:
        return self.expected if recipe.method == "mse" and "mse" not in self.folded else 0.0

    def write_seconds(self, recipe: Recipe) -> float:
        return 6.0 if recipe.method == "ort-minmax" else 0.0  # onnxruntime's calibrator, when verified


def _fits(elapsed: float, builder: _Builder, statistics: float = 0.0, extended: bool = False) -> RecipeSearch:
    search = RecipeSearch.__new__(RecipeSearch)
    search.budget, search.builder = Budget(seconds=100.0), builder
    search.started = time.monotonic() - elapsed
    search.statistics_seconds, search.extended = statistics, extended
    return search


def test_global_share_and_the_floor_of_the_first_histogram_method():
    assert (GLOBAL_SHARE, STATISTICS_SHARE) == (0.3, 0.5)  # the figures below are of these shares
    builder = _Builder(expected=10.0)
    # past 30 %: no cheap move; the first histogram method while it ends within 50 %
    assert not _fits(35, builder)._global_fits(Recipe())
    assert _fits(35, builder)._global_fits(Recipe(method="mse"))
    assert not _fits(41, builder)._global_fits(Recipe(method="mse"))
    # after a histogram pass (8 s): 30 % plus its time, and no floor for another one
    builder.folded, builder.expected = ["mse"], 0.0
    assert _fits(37, builder, statistics=8.0)._global_fits(Recipe())
    assert not _fits(39, builder, statistics=8.0)._global_fits(Recipe())
    other = _Builder(expected=10.0)
    other.folded = ["kl"]
    assert not _fits(35, other, statistics=8.0)._global_fits(Recipe(method="mse"))
    # a histogram method that improved the margin: the other choices again, within 50 %
    assert _fits(45, builder, statistics=8.0, extended=True)._global_fits(Recipe())
    assert not _fits(51, builder, statistics=8.0, extended=True)._global_fits(Recipe())
    assert _fits(1000, builder)._global_fits(Recipe()) is False
    # onnxruntime's calibrator counts: 23 + 6 s of its run when verified fits in 30 %, 25 + 6 s does not
    assert _fits(23, builder)._global_fits(Recipe(method="ort-minmax"))
    assert not _fits(25, builder)._global_fits(Recipe(method="ort-minmax"))
    unbounded = _fits(1000, builder)
    unbounded.budget = Budget()
    assert unbounded._global_fits(Recipe(method="mse"))


@pytest.fixture(scope="module")
def few(tmp_path_factory) -> dict[str, Path]:
    """8 calibration records (fewer than moving-average's batch of 16) and 40 held-out ones."""
    root = tmp_path_factory.mktemp("global")
    calib, held = np.load(CALIB), np.load(TEST)
    np.savez(root / "calib.npz", x=calib["x"][:8])
    np.savez(root / "eval.npz", x=held["x"][:40])
    return {"calib": root / "calib.npz", "eval": root / "eval.npz"}


@needs_cache
def test_global_phase_reaches_histogram_methods_cheapest_first_and_reuses_equal_ranges(few):
    result = search_recipe(
        FP32,
        few["calib"],
        few["eval"],
        parse_checks(["sqnr>=500"]),  # out of reach: every global move is estimated
        methods=["kl", "moving-average", "ort-percentile", "mse"],
        vary=("method",),
        budget=Budget(experiments=1),
    )
    rows = [s for s in result.steps if s.estimated and s.phase == "global"]
    methods = [s.recipe.method for s in rows]
    assert methods.index("mse") < methods.index("ort-percentile") < methods.index("kl")
    # moving-average over 8 records is MinMax (one batch): the starting recipe's row, no second run
    (average,) = [s for s in rows if s.recipe.method == "moving-average"]
    assert average.change.endswith("(estimated as step 0)") and average.seconds == 0
    assert average.margin == result.steps[0].margin


@needs_cache
def test_ranking_estimates_the_chosen_nodes_by_drop_per_cost(monkeypatch, tmp_path):
    """Above LEAVE_ONE_OUT_NODES nodes the ranking estimates the output's writers, then the nodes
    chosen by their SQNR drop in the order of that drop per cost (a ranking cut short keeps the
    cheap nodes that matter)."""
    builder = RecipeBuilder(FP32, CALIB, RuntimeOptions())
    base = builder.write(Recipe(), tmp_path / "base.onnx")
    drops = {"conv1": 4.0, "relu1": 0.0, "pool1": 1.0, "conv2": 3.0, "relu2": 0.5, "pool2": 2.0, "fc": 5.0}
    cost = {"conv1": 100.0, "relu1": 1.0, "pool1": 1.0, "conv2": 10.0, "relu2": 1.0, "pool2": 1.0, "fc": 50.0}
    monkeypatch.setattr(estimate_module, "LEAVE_ONE_OUT_NODES", 4)
    monkeypatch.setattr(estimate_module, "layer_drops", lambda session, nodes, options: drops)
    asked = []
    with estimate_module.Estimator(
        FP32, base, TEST, parse_checks(["cosine>=0.99"]), RuntimeOptions(), 2, lambda text: None
    ) as estimator:
        monkeypatch.setattr(estimator, "margins", lambda floats, *a, **k: asked.extend(floats) or [0.0] * len(floats))
        nodes = [n.name for n in estimator.qgraph.nodes if n.name in drops]
        estimator.order(nodes, cost.__getitem__)
    assert sorted(nodes) == ["conv1", "conv2", "fc", "pool1", "pool2"]  # the Relus fused into their Conv's pair
    estimated = [names[0] for names in asked[1:]]  # after the base (nothing in float)
    # fc writes the output; the 3 others of the top 4 by drop (conv1 4, conv2 3, pool2 2) by drop per cost
    assert estimated == ["fc", "pool2", "conv2", "conv1"]


class _Runner:
    """The work-reuse runner's stand-in: the n-th set run has cosine ``cosines[n]``; counts its passes."""

    def __init__(self, cosines: list[float]) -> None:
        self.cosines, self.passes, self.count = cosines, [], 0

    def run(self, experiments, side):
        self.passes.append(len(experiments))
        for _ in experiments:
            self.count += 1
            yield {"y": {"cosine": self.cosines[self.count - 1]}}


def test_a_time_limited_ranking_ends_at_a_node_passing_alone():
    sets = [[f"n{i}"] for i in range(30)]
    cosines = [0.98] * 11 + [0.995] + [0.98] * 18  # the 12th set passes cosine >= 0.99
    estimator = estimate_module.Estimator.__new__(estimate_module.Estimator)
    estimator.checks, estimator.note, estimator.measure = parse_checks(["cosine>=0.99"]), lambda text: None, None
    estimator.direct, estimator.qgraph, estimator.enabled = True, None, lambda names: frozenset()
    estimator.session = type("Session", (), {"runner": _Runner(cosines)})()
    # unbounded: one pass holds every set, and every set is estimated
    out = estimator.margins(sets, "ranking")
    assert len(out) == 30 and estimator.session.runner.passes == [8, 22]
    # ended after the pass where a set passes (the first 8 miss, the second pass holds the rest)
    estimator.session.runner.passes, estimator.session.runner.count = [], 0
    out = estimator.margins(sets, "ranking", room=lambda: 1000.0, enough=lambda m: any(v >= 0 for v in m[:8]))
    assert estimator.session.runner.passes == [8, 22] and len(out) == 30
    estimator.session.runner.passes, estimator.session.runner.count = [], 0
    cosines[3] = 0.995  # a set of the first pass passes: the ranking ends there
    out = estimator.margins(sets, "ranking", room=lambda: 1000.0, enough=lambda m: any(v >= 0 for v in m))
    assert estimator.session.runner.passes == [8] and [i for i, m in enumerate(out) if m >= 0] == [3]


def test_the_descent_skips_a_calibrator_that_would_not_fit_and_goes_on():
    """onnxruntime's Entropy calibrator (20 s when verified) does not fit the phase's 30 s: that move
    is skipped, and the moves after it (the activation type) are still estimated; a move of no extra
    cost that does not fit ends the descent."""

    class Builder(_Builder):
        def write_seconds(self, recipe: Recipe) -> float:
            return 20.0 if recipe.method == "ort-entropy" else 0.0

        def needs(self, recipe: Recipe) -> None:
            return None

    estimated = []
    search = _fits(15, Builder(expected=0.0))
    search.methods, search.vary, search.on_note = ["minmax", "ort-entropy"], ("method", "activation_type"), None

    def estimate(edits, recipe, change):
        estimated.append(change)
        return Step(len(estimated), "global", change, recipe, 0.0, {}, False, -2.0, 0.0)

    search._estimate_global = estimate
    values = {("method", "minmax"), ("activation_type", "uint8")}
    search._descend(None, Recipe(), -1.0, {Recipe()}, values)
    assert estimated == ["activation_type=int8"]  # ort-entropy skipped, the descent went on
    estimated.clear()
    search.started = time.monotonic() - 31  # past 30 %: the first move of no extra cost ends it
    search._descend(None, Recipe(), -1.0, {Recipe()}, set(values))
    assert estimated == []


def test_widening_needs_room_for_twice_the_longest_experiment():
    from pytest_qaccuracy.analysis.recipe.search import WIDEN_EXPERIMENTS

    search = _fits(3, _Builder(expected=0.0))
    search.budget = Budget(seconds=10.0)
    search.steps = [Step(0, "start", "starting recipe", Recipe(), 0.0, {}, False, -1.0, 3.0)]
    assert WIDEN_EXPERIMENTS == 2.0
    assert search._room_for(WIDEN_EXPERIMENTS)  # 3 s spent + 2 x 3 s < 10 s
    search.started -= 2  # 5 s spent: 5 + 6 >= 10
    assert not search._room_for(WIDEN_EXPERIMENTS) and search._room_for(1.0)
