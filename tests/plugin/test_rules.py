"""Tolerance values and rule lines, without a pytest session."""

from __future__ import annotations

import pytest

from pytest_qaccuracy.tolerances import check_tolerance, parse_number, parse_rule, parse_rules, rules_for


def test_parse_number_explains_bad_values() -> None:
    assert parse_number("1e-3") == 0.001
    assert parse_number(1) == 1.0 and isinstance(parse_number(1), float)
    with pytest.raises(ValueError, match=r"got '5%' \(write a fraction"):
        parse_number("5%")
    with pytest.raises(ValueError, match="inline comments are not supported"):
        parse_number("0.1 # why")
    with pytest.raises(ValueError, match="expected a number, got True"):
        parse_number(True)
    with pytest.raises(ValueError, match="expected an integer"):
        parse_number("1.5", int)


def test_check_tolerance_ranges() -> None:
    assert check_tolerance("min_sqnr", "-3") == -3.0  # a negative SQNR floor is legal
    assert check_tolerance("topk", "5") == 5
    with pytest.raises(ValueError, match="topk: must be >= 1"):
        check_tolerance("topk", 0)
    with pytest.raises(ValueError, match="max_top1_drop: must be between 0 and 1"):
        check_tolerance("max_top1_drop", 0.5e1)
    with pytest.raises(ValueError, match="unknown tolerance 'min_cos'"):
        check_tolerance("min_cos", 1)


def test_parse_rule_forms() -> None:
    rule = parse_rule("det*::head/* sqnr >= 8", "ini")
    assert (rule.pair, rule.layer, rule.metric, rule.op, rule.value) == ("det*", "head/*", "sqnr", ">=", 8.0)
    outputs = parse_rule("* cosine>0.99", "ini")
    assert outputs.layer is None and outputs.op == ">"
    with pytest.raises(ValueError, match="bad tolerance rule"):
        parse_rule("*::* sqnr", "ini")
    with pytest.raises(ValueError, match="unknown metric 'snr'"):
        parse_rule("* snr>=3", "ini", known_metrics=["sqnr"])
    with pytest.raises(ValueError, match="expected a number"):
        parse_rule("* sqnr>=high", "ini")


def test_most_specific_rule_wins() -> None:
    rules = parse_rules(
        ["*::* sqnr>=20", "*::head* sqnr>=8", "detector::head_cls sqnr>=12", "# a comment", "*::* sqnr>=25"], "ini"
    )
    assert rules_for(rules, "detector", ["head_cls"], layer=True)["sqnr"].value == 12
    assert rules_for(rules, "detector", ["head_box"], layer=True)["sqnr"].value == 8
    assert rules_for(rules, "resnet", ["conv1"], layer=True)["sqnr"].value == 25  # tie: the later line
    assert rules_for(rules, "resnet", [None, "conv1"], layer=True)["sqnr"].value == 25
    assert rules_for(rules, "resnet", ["logits"], layer=False) == {}  # layer rules never apply to outputs


def test_a_full_tie_goes_to_the_rule_later_in_the_sequence() -> None:
    """Equal globs and equal positions (e.g. lists parsed separately): the later rule still wins,
    as "on a tie, the later line" says; the first one must not stick."""
    first, second = parse_rule("*::* sqnr>=20", "a"), parse_rule("*::* sqnr>=30", "b")
    assert first.specificity == second.specificity
    assert rules_for([first, second], "p", ["conv"], layer=True)["sqnr"] is second
    assert rules_for([second, first], "p", ["conv"], layer=True)["sqnr"] is first
    assert rules_for([first, second], "p", ["conv"], layer=False) == {}
    outputs = parse_rule("* cosine>=0.9", "a"), parse_rule("* cosine>=0.99", "b")
    assert rules_for(outputs, "p", ["y"], layer=False)["cosine"] is outputs[1]
