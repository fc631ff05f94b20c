"""Edges of tolerance parsing and rule selection (``tolerances.py``), from docs/pytest.md's rules."""

from __future__ import annotations

import re

import pytest

from pytest_qaccuracy.tolerances import OPS, TOLERANCES, Rule, check_tolerance, parse_number, parse_rule, parse_rules


def test_parse_number_keeps_the_kind_asked_for() -> None:
    assert parse_number(3) == 3.0 and type(parse_number(3)) is float
    assert parse_number(2.5) == 2.5
    assert parse_number(7, int) == 7 and type(parse_number(7, int)) is int
    assert parse_number(" 4 ", int) == 4 and type(parse_number(" 4 ", int)) is int
    with pytest.raises(ValueError, match=r"^expected an integer, got '2.5'$"):
        parse_number(2.5, int)
    with pytest.raises(ValueError, match=r"^expected a number, got 'nan'$"):
        parse_number("nan")
    with pytest.raises(ValueError, match=r"^expected a number, got '0.1 ; why' \(inline comments are not supported"):
        parse_number("0.1 ; why")
    with pytest.raises(ValueError, match=r"^expected a number, got 'high'$"):
        parse_number("high")  # no hint when nothing explains it


def test_check_tolerance_bounds_are_inclusive() -> None:
    for name in ("min_cosine", "min_top1_agreement", "max_top1_drop", "max_saturated"):
        assert check_tolerance(name, 1) == 1.0
        assert check_tolerance(name, 0) == 0.0
        with pytest.raises(ValueError, match=rf"^{name}: must be between 0 and 1, got 1.5$"):
            check_tolerance(name, 1.5)
    assert check_tolerance("max_lsb", 2.5) == 2.5  # no upper bound
    assert check_tolerance("topk", 1) == 1
    with pytest.raises(ValueError, match=r"^max_lsb: must be >= 0, got -1.0$"):
        check_tolerance("max_lsb", -1)
    with pytest.raises(ValueError, match=r"^topk: expected an integer, got '2.5'$"):
        check_tolerance("topk", "2.5")
    known = re.escape(", ".join([*TOLERANCES, "min:<task value>", "max:<task value>", "max_drop:<task value>"]))
    with pytest.raises(ValueError, match=rf"^unknown tolerance 'x' \(known: {known}\)$"):
        check_tolerance("x", 1)


def test_a_parsed_rule_compares_through_its_operator() -> None:
    """Checks compare a value with ``OPS[rule.op](value, rule.value)``: the boundary belongs to >=, not to <."""
    rule = parse_rule("* sqnr>=20", "ini")
    assert (rule.op, rule.value) == (">=", 20.0)
    holds = OPS[rule.op]
    assert holds(20.0, rule.value) and holds(21.0, rule.value) and not holds(19.5, rule.value)
    strict = parse_rule("* lsb<1", "ini")
    assert (strict.op, strict.value) == ("<", 1.0)
    assert OPS[strict.op](0.5, strict.value) and not OPS[strict.op](1.0, strict.value)


def test_parse_rule_keeps_its_text_source_and_position() -> None:
    rule = parse_rule("  ::conv* SQNR>=20  ", "ini file pytest.ini", 3)
    assert rule == Rule("*", "conv*", "sqnr", ">=", 20.0, "::conv* SQNR>=20", "ini file pytest.ini", 3)
    assert parse_rule("* cosine>=0.9", "marker").position == 0
    message = "bad tolerance rule 'sqnr': expected '<pair glob>[::<layer glob>] <metric><op><value>'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_rule(" sqnr ", "ini")


def test_parse_rules_numbers_rules_and_checks_metrics() -> None:
    rules = parse_rules(["# note", "", "* cosine>=0.9", "*::* sqnr>=20"], "ini", known_metrics=iter(["sqnr", "cosine"]))
    assert [(r.position, r.source, r.text) for r in rules] == [(0, "ini", "* cosine>=0.9"), (1, "ini", "*::* sqnr>=20")]
    with pytest.raises(ValueError, match="unknown metric 'lsb'"):
        parse_rules(["* lsb<=1"], "ini", known_metrics=["sqnr"])
    assert parse_rules(["* lsb<=1"], "ini")[0].metric == "lsb"  # no list: any metric


def test_task_tolerance_names_are_kind_colon_value() -> None:
    from pytest_qaccuracy.tolerances import TASK_KINDS, is_tolerance, task_tolerance

    assert TASK_KINDS == {"min": (">=", "quantized"), "max": ("<=", "quantized"), "max_drop": ("<=", "drop")}
    assert task_tolerance("max_drop:cer") == ("max_drop", "cer")
    assert task_tolerance("min:exact_match") == ("min", "exact_match")
    assert task_tolerance("max:f1_speech2") == ("max", "f1_speech2")
    for name in ("max_drop:", "drop:cer", "min:Cer", "min:2cer", "min:cer x", "xmin:cer", "min:cer:", "min_cosine"):
        assert task_tolerance(name) is None, name
    assert is_tolerance("min_cosine") and is_tolerance("max_drop:cer")
    assert not is_tolerance("max_drop") and not is_tolerance("cosine")


def test_task_tolerance_lines_and_values() -> None:
    from pytest_qaccuracy.tolerances import BadValue, parse_task_line

    assert parse_task_line("max_drop:cer = 0.005") == ("max_drop:cer", 0.005)
    assert parse_task_line("  min:exact_match=0.9  ") == ("min:exact_match", 0.9)
    assert parse_task_line("max_drop:cer = -0.01") == ("max_drop:cer", -0.01)  # a drop below 0 asks for a gain
    for bad in ("max_drop:cer", "max_drop:cer = ", "drop:cer = 1", "max_drop:cer = 1 2", "= 1"):
        with pytest.raises(
            ValueError, match=re.escape(f"bad task tolerance {bad.strip()!r}: expected '<min|max|max_drop>")
        ):
            parse_task_line(bad)
    value = check_tolerance("min:exact_match", "0.75")
    assert value == 0.75 and isinstance(value, float)
    assert check_tolerance("max:cer", 2) == 2.0 and isinstance(check_tolerance("max:cer", 2), float)
    with pytest.raises(BadValue) as info:
        check_tolerance("max_drop:cer", "abc")
    assert "max_drop:cer" in str(info.value)
    with pytest.raises(
        ValueError,
        match=r"unknown tolerance 'max_drop' \(known: .*min_cosine.*, min:<task value>, "
        r"max:<task value>, max_drop:<task value>\)",
    ):
        check_tolerance("max_drop", 1)
