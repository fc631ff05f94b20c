"""The sensitivity analysis against a deadline: it stops between steps, keeps the nodes it measured
(the same figures as an unbounded run), names the others, and never starts a step after it."""

from __future__ import annotations

import pytest

from pytest_qaccuracy.analysis.deadline import Deadline, DeadlineReached
from pytest_qaccuracy.analysis.experiments import ExperimentRunner
from pytest_qaccuracy.analysis.partial import QdqGraph
from pytest_qaccuracy.analysis.sensitivity import SensitivityResult, node_sensitivity, open_session, sensitivity_in
from pytest_qaccuracy.analysis.sensitivity_report import SensitivityReport, analyse_pair
from pytest_qaccuracy.model import ModelPair
from pytest_qaccuracy.report.sensitivity_summary import sensitivity_brief, sensitivity_lines


class FakeClock:
    """A clock that moves only when told: each finished run of experiments costs ``step`` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clocked(monkeypatch):
    """A fake clock that advances one second per finished :meth:`ExperimentRunner.run`, and the fake
    times at which each run started (so that a test can see none started after the deadline)."""
    clock, started = FakeClock(), []
    run = ExperimentRunner.run

    def timed(self, experiments, cache="float", deadline=None):
        started.append(clock.now)
        out = run(self, experiments, cache, deadline)
        clock.now += 1.0
        return out

    monkeypatch.setattr(ExperimentRunner, "run", timed)
    return clock, started


def test_a_deadline_keeps_the_nodes_measured_before_it_with_their_unbounded_figures(zoo, damaged, clocked):
    clock, started = clocked
    pair = ModelPair(zoo["fp32"], damaged)
    order = [n.name for n in QdqGraph(pair.quantized, pair.fp32, "net").nodes]
    whole = {n.node: n for n in node_sensitivity(pair, zoo["data"], metrics="cosine,mse").nodes}
    started.clear()
    deadline = Deadline(2.5, 2.5, clock)
    with open_session(pair, zoo["data"], "cosine,mse") as session:
        result = sensitivity_in(session, deadline=deadline)
    measured = [n.node for n in result.nodes]
    assert 1 <= len(measured) < len(order)
    # a prefix in topological order was measured; the rest is named, not shown
    assert sorted(measured, key=order.index) == order[: len(measured)]
    assert result.unmeasured == order[len(measured) :]
    assert result.stopped == f"ranking stopped at the budget after {len(measured)} of {len(order)} nodes"
    for node in result.nodes:  # each measured node's figures are those of the whole run
        assert node.metrics["cosine"] == pytest.approx(whole[node.node].metrics["cosine"], rel=1e-9)
        assert node.metrics["mse"] == pytest.approx(whole[node.node].metrics["mse"], rel=1e-6)
    # every run that measured something started before the deadline; the one after it measured nothing
    assert started[:-1] == [t for t in started[:-1] if t < deadline.at] and started[-1] >= deadline.at
    again = SensitivityResult.from_dict(result.to_dict())
    assert again.unmeasured == result.unmeasured and again.stopped == result.stopped


def test_a_deadline_before_any_node_raises(zoo, damaged):
    pair = ModelPair(zoo["fp32"], damaged)
    with pytest.raises(DeadlineReached):
        analyse_pair(pair, zoo["data"], "cosine", target="cosine>=0.999", deadline=Deadline.after(0.0))


def test_a_deadline_after_the_ranking_drops_the_sweep_and_curves_and_says_so(zoo, damaged, monkeypatch):
    """The ranking ends, then the deadline passes: no sweep, no curves, and the report says why."""
    import pytest_qaccuracy.analysis.sensitivity_report as module

    pair = ModelPair(zoo["fp32"], damaged)
    clock = FakeClock()
    ranked = module.sensitivity_in

    def ranking_then_late(*args, **kwargs):
        result = ranked(*args, **kwargs)
        clock.now = 10.0
        return result

    monkeypatch.setattr(module, "sensitivity_in", ranking_then_late)
    report = analyse_pair(pair, zoo["data"], "cosine", target="cosine>=0.999", deadline=Deadline(5.0, 5.0, clock))
    full = analyse_pair(pair, zoo["data"], "cosine", target="cosine>=0.999", cumulative=False)
    assert report.sweep is None and report.cumulative is None
    assert report.stopped == "stopped at the budget; no sweep; no cumulative curves"
    assert report.sensitivity.to_dict() == full.sensitivity.to_dict()
    assert SensitivityReport.from_dict(report.to_dict()).stopped == report.stopped


def test_the_summary_shows_a_partial_ranking_as_partial(zoo, damaged, clocked):
    clock, _ = clocked
    pair = ModelPair(zoo["fp32"], damaged)
    report = analyse_pair(pair, zoo["data"], "cosine", target="cosine>=0.999", deadline=Deadline(1.5, 1.5, clock))
    assert report.stopped.startswith("ranking stopped at the budget after ") and report.stopped.endswith(
        "nodes; no sweep; no cumulative curves"
    )
    record = {"checks": [], "sensitivity": {"mode": "single", "metric": "cosine", "report": report.to_dict()}}
    lines = sensitivity_lines(record)
    assert lines[1] == "  " + report.stopped
    shown = {line.split()[1] for line in lines[4:] if line.split()[0].isdigit()}
    assert shown == {n.node for n in report.sensitivity.nodes} and not shown & set(report.sensitivity.unmeasured)
    assert sensitivity_brief(record)["stopped"] == report.stopped
