"""The recipe search's node phase on stand-ins for its estimates and experiments (the truth is a rule
on the float set, so the answer is known by hand): the shortest prefix of the node order, and
pruning (float nodes of a verified pass brought back to 8 bits in rounds, each from the last
verified pass)."""

from __future__ import annotations

import time

import pytest

from pytest_qaccuracy.analysis.recipe import Budget, Recipe
from pytest_qaccuracy.analysis.recipe import estimate as estimate_module
from pytest_qaccuracy.analysis.recipe.cost import CostModel
from pytest_qaccuracy.analysis.recipe.search import RecipeSearch, Step

WORK = {"a": 8.0, "b": 4.0, "c": 2.0, "d": 1.0}


class Rule:
    """A float set passes when ``passes(floats)``; counts the estimates and experiments it answered."""

    def __init__(self, passes) -> None:
        self.passes, self.estimates, self.experiments = passes, 0, []

    def margins(self, floats, what, proxy=False):
        self.estimates += len(floats)
        return [0.5 if self.passes(set(f)) else -0.5 for f in floats]

    def droppable_margins(self, kept, nodes):
        return self.margins([[m for m in kept if m != n] for n in nodes], "pruning")


def _search(rule: Rule) -> RecipeSearch:
    search = RecipeSearch.__new__(RecipeSearch)
    search.started, search.budget, search.steps, search.best = time.monotonic(), Budget(), [], None
    search.on_note, search.cost = None, CostModel(WORK)

    def measure(recipe: Recipe, phase: str, change: str) -> Step:
        passed = rule.passes(set(recipe.float))
        rule.experiments.append(sorted(recipe.float))
        step = Step(len(search.steps), phase, change, recipe, search.cost.relative(recipe), {}, passed, 0.0, 0.0)
        search.steps.append(step)
        if passed and (search.best is None or step.cost < search.best.cost):
            search.best = step
        return step

    search.measure = measure
    return search


def _prune(rule: Rule) -> RecipeSearch:
    search = _search(rule)
    passing = search.measure(Recipe(float=frozenset(WORK)), "nodes", "float: all")
    search._prune(rule, passing, lambda n: WORK[n])
    return search


def test_pruning_goes_on_in_rounds_past_the_nodes_that_miss(monkeypatch):
    """One node estimated per round: the costliest misses alone, and the next rounds bring every
    other node back to 8 bits, one verified experiment each (a single round stopped at the first)."""
    monkeypatch.setattr(estimate_module, "PRUNE_NODES", 1)
    rule = Rule(lambda floats: "a" in floats)
    search = _prune(rule)
    assert sorted(search.best.recipe.float) == ["a"]
    assert rule.experiments == [["a", "b", "c", "d"], ["a", "c", "d"], ["a", "d"], ["a"]]


@pytest.mark.parametrize(
    ("passes", "cheapest"),
    [
        (lambda f: "a" in f and ("c" in f or "d" in f), ["a", "d"]),  # one round: b and c together
        (lambda f: "a" in f and ("b" in f or {"c", "d"} <= f), ["a", "c", "d"]),  # b goes, then c, d miss alone
        (lambda f: bool(f), ["d"]),
    ],
)
def test_pruning_ends_at_a_verified_pass_no_node_of_which_drops_alone(passes, cheapest):
    rule = Rule(passes)
    search = _prune(rule)
    best = sorted(search.best.recipe.float)
    assert passes(set(best))
    assert all(not passes(set(best) - {n}) for n in best)  # nothing more to bring back alone
    assert best == cheapest


@pytest.mark.parametrize(
    ("passing", "expected"),
    [
        ({1, 40}, 1),  # one node matters: its prefix passes, longer ones miss until all (not monotone)
        ({3, 4, 40}, 3),  # past the first short prefixes: bisected between 2 and 4
        (set(range(30, 41)), 30),  # a long prefix: bisected between 8 and 40
    ],
)
def test_the_order_head_is_estimated_before_bisection(passing, expected):
    order = [f"n{i}" for i in range(40)]
    rule = Rule(lambda floats: len(floats) in passing)
    search = _search(rule)
    search._note = lambda text: None
    size, margin = search._estimated_boundary(rule, order, 0, 0.0)
    assert (size, margin) == (expected, 0.5)


def test_out_of_time_the_node_phase_verifies_instead_of_estimating():
    """When one more estimate and one experiment do not fit, the boundary is every node (then
    verified), with no estimate run."""
    order = [f"n{i}" for i in range(40)]
    rule = Rule(lambda floats: len(floats) in {1, 40})
    search = _search(rule)
    search._note = lambda text: None
    search.budget = Budget(seconds=10.0)
    search.steps.append(Step(0, "start", "starting recipe", Recipe(), 0.0, {}, False, -1.0, 20.0))
    assert search._estimated_boundary(rule, order, 0, 0.0) == (40, None)
    assert rule.estimates == 0


@pytest.mark.parametrize(("gain", "estimated"), [(0.6, True), (0.4, False)])
def test_the_order_head_is_estimated_when_one_node_gains_half_the_deficit(gain, estimated):
    """The ranking's single gains gate the head: with a deficit of 1 (base margin -1), a node that
    gains 0.6 alone makes the head worth its estimates, 0.4 does not (bisection alone then)."""
    order = [f"n{i}" for i in range(40)]
    rule = Rule(lambda floats: len(floats) in {1, 40})
    rule.base, rule.gains = -1.0, {"n0": gain, "n1": 0.3}
    search = _search(rule)
    search._note = lambda text: None
    size, _ = search._estimated_boundary(rule, order, 0, 0.0)
    assert size == (1 if estimated else 40)
