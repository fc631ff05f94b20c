"""A slice's own rules and tolerances (``tolerances.py``: ``slice_rules``, ``with_slice_tolerances``),
as docs/pytest.md describes slices: a view's rules apply to that view of that pair only, and win."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_qaccuracy.tolerances import Tolerance, parse_rule, rules_for, slice_rules, with_slice_tolerances


def _view(name: str, rules=(), tolerances=()) -> SimpleNamespace:
    return SimpleNamespace(name=name, rules=list(rules), tolerances=list(tolerances))


def test_slice_rules_apply_to_their_view_of_their_pair() -> None:
    views = [_view("boxes", ["sqnr>=10", "cosine>=0.9"]), _view("scores", ["sqnr>=30"]), _view("plain")]
    rules = slice_rules("det[1]", views, offset=4)
    assert [(r.pair, r.output, r.text, r.source) for r in rules] == [
        ("det[[]1]", "boxes", "sqnr>=10", "slice 'boxes' rules"),  # the pair id is matched literally
        ("det[[]1]", "boxes", "cosine>=0.9", "slice 'boxes' rules"),
        ("det[[]1]", "scores", "sqnr>=30", "slice 'scores' rules"),
    ]
    positions = [r.position for r in rules]
    assert positions == sorted(set(positions)) and positions[0] > 4  # in order, after every other rule
    pair_rule = parse_rule("* sqnr>=20", "ini", 3)
    assert rules_for([pair_rule, *rules], "det[1]", ["boxes"], layer=False)["sqnr"].value == 10
    assert rules_for([pair_rule, *rules], "det[1]", ["scores"], layer=False)["sqnr"].value == 30
    assert rules_for([pair_rule, *rules], "det[1]", ["logits"], layer=False)["sqnr"].value == 20
    assert rules_for(rules, "det1", ["boxes"], layer=False) == {}  # another pair
    assert slice_rules("p", []) == []


def test_a_tolerance_set_only_on_views_is_asked_for_without_a_value() -> None:
    views = [_view("boxes", tolerances=[("min_sqnr", 10.0)]), _view("scores", tolerances=[("min_cosine", 0.9)])]
    found = with_slice_tolerances({"min_cosine": Tolerance("min_cosine", 0.99, "marker")}, views)
    assert found["min_cosine"] == Tolerance("min_cosine", 0.99, "marker")  # the pair's own stays
    assert found["min_sqnr"] == Tolerance("min_sqnr", None, "slice 'boxes'")
    assert found["min_cosine"].applies and not found["min_sqnr"].applies
    assert set(found) == {"min_cosine", "min_sqnr"}
