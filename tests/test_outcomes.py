"""The typed outcome record and the one definition of a pair's verdict (``outcomes.py``): validation,
the target text, the order of "worst first", the builtins round trip, and every status branch."""

from __future__ import annotations

import math

import pytest

from pytest_qaccuracy.outcomes import Outcome, pair_status, worst_first


def _outcome(**changes: object) -> Outcome:
    base = {
        "kind": "tolerance",
        "check": "max_abs",
        "scope": "output",
        "subject": "output 'y'",
        "metric": "max_abs",
        "op": "<=",
        "threshold": 2.0,
        "value": 3.0,
        "passed": False,
        "source": "marker",
        "detail": "max_abs 3 > 2 for output 'y'",
    }
    return Outcome(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["tolerance", "rule", "task", "drift", "saturation", "gate", "error"])
@pytest.mark.parametrize("scope", ["output", "layer", "task", "model"])
def test_every_documented_kind_and_scope_is_accepted(kind: str, scope: str) -> None:
    outcome = _outcome(kind=kind, scope=scope)
    assert (outcome.kind, outcome.scope) == (kind, scope)


def test_an_unknown_kind_is_one_line_listing_the_kinds() -> None:
    with pytest.raises(ValueError) as error:
        _outcome(kind="tol")
    assert str(error.value) == (
        "outcome kind 'tol': expected one of tolerance, rule, task, drift, saturation, gate, error"
    )


def test_an_unknown_scope_is_one_line_listing_the_scopes() -> None:
    with pytest.raises(ValueError) as error:
        _outcome(scope="graph")
    assert str(error.value) == "outcome scope 'graph': expected one of output, layer, task, model"


def test_the_target_names_the_deployment_only_when_there_is_one() -> None:
    assert _outcome().target == "output 'y'"
    assert _outcome(deployment="x86-avx2").target == "output 'y' on x86-avx2"


def test_a_passed_check_has_no_excess_whatever_its_value() -> None:
    assert _outcome(passed=True, value=10.0, threshold=1.0).excess == 0.0
    assert _outcome(passed=True, value=None).excess == 0.0


@pytest.mark.parametrize(
    ("op", "value", "threshold", "expected"),
    [
        ("<=", 3.0, 2.0, 0.5),  # (3 - 2) / 2
        ("<", 3.0, 2.0, 0.5),
        (">=", 0.25, 1.0, 0.75),  # (1 - 0.25) / 1
        (">", 0.25, 1.0, 0.75),
        (">=", 0.5, 4.0, 0.875),  # (4 - 0.5) / 4: below 1, so a floor of 1 would show
        ("<=", -1.0, -4.0, 0.75),  # (-1 - -4) / |-4|
        (">=", -3.0, -2.0, 0.5),  # (-2 - -3) / |-2|
        ("<=", 5e-13, 0.0, 0.5),  # a bound of 0 divides by 1e-12
        ("<=", 1.0, 0.0, 1e12),
        ("<=", 2.0, 1e-13, (2.0 - 1e-13) / 1e-12),  # a bound below 1e-12 divides by 1e-12 too
        ("<=", 1.0, 2.0, 0.0),  # failed though inside its bound (e.g. a NaN elsewhere): no excess
        (">=", 2.0, 1.0, 0.0),
    ],
)
def test_a_failed_check_is_as_far_beyond_its_bound_as_its_gap_relative_to_the_bound(
    op: str, value: float, threshold: float, expected: float
) -> None:
    assert _outcome(op=op, value=value, threshold=threshold).excess == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "changes",
    [{"value": None}, {"threshold": None}, {"op": "=="}, {"op": "in"}, {"op": "<=", "value": None, "threshold": None}],
)
def test_a_failure_without_a_value_bound_or_order_is_infinitely_far(changes: dict[str, object]) -> None:
    assert _outcome(**changes).excess == math.inf


def test_worst_first_puts_failures_first_farthest_first_and_keeps_ties_in_order() -> None:
    a = _outcome(check="a", value=3.0)  # excess 0.5
    b = _outcome(check="b", value=6.0)  # excess 2.0
    c = _outcome(check="c", value=None)  # excess inf
    d = _outcome(check="d", value=3.0)  # the same excess as a, after it
    ok1 = _outcome(check="ok1", passed=True, value=1.0)
    ok2 = _outcome(check="ok2", passed=True, value=0.0)
    ordered = worst_first([ok1, a, ok2, b, d, c])
    assert [o.check for o in ordered] == ["c", "b", "a", "d", "ok1", "ok2"]
    assert worst_first([]) == []


def test_to_dict_is_builtins_with_every_field_in_order() -> None:
    outcome = _outcome(
        kind="rule",
        check="rtol",
        scope="layer",
        subject="layer 'conv1'",
        metric="rtol",
        op="<=",
        threshold=None,
        value=0.25,
        passed=True,
        source="pytest.ini:3",
        detail="rtol within 0.1 + 0.01 for layer 'conv1'",
        deployment="arm64-sdot",
        params={"rtol": 0.1, "atol": 0.01},
    )
    document = outcome.to_dict()
    assert document == {
        "kind": "rule",
        "check": "rtol",
        "scope": "layer",
        "subject": "layer 'conv1'",
        "deployment": "arm64-sdot",
        "target": "layer 'conv1' on arm64-sdot",
        "metric": "rtol",
        "op": "<=",
        "threshold": None,
        "value": 0.25,
        "params": {"rtol": 0.1, "atol": 0.01},
        "output": None,
        "k": None,
        "passed": True,
        "source": "pytest.ini:3",
        "detail": "rtol within 0.1 + 0.01 for layer 'conv1'",
    }
    assert list(document) == [
        "kind", "check", "scope", "subject", "deployment", "target", "metric", "op", "threshold", "value",
        "params", "output", "k", "passed", "source", "detail",
    ]  # fmt: skip
    assert type(document["params"]) is dict


def test_from_dict_reads_back_every_field() -> None:
    outcome = _outcome(deployment="x86-vnni", params={"rtol": 0.5}, passed=True, value=1.5)
    again = Outcome.from_dict(outcome.to_dict())
    assert again == outcome
    # field by field, so that a swapped or dropped key cannot hide behind a default
    for name in Outcome.__dataclass_fields__:
        assert getattr(again, name) == getattr(outcome, name), name


def test_from_dict_defaults_and_types_of_an_older_document() -> None:
    document = {
        "kind": "task",
        "check": "top1",
        "scope": "task",
        "subject": "task",
        "metric": "accuracy",
        "op": ">=",
        "threshold": 0.9,
        "value": 0.95,
        "passed": 1,
        "source": "marker",
        "detail": "accuracy 0.95 >= 0.9",
    }
    outcome = Outcome.from_dict(document)
    assert outcome.deployment is None
    assert outcome.params == {} and type(outcome.params) is dict
    assert outcome.passed is True
    assert Outcome.from_dict({**document, "passed": 0}).passed is False
    assert Outcome.from_dict({**document, "params": None}).params == {}
    assert Outcome.from_dict({**document, "deployment": "arm64"}).target == "task on arm64"


def test_a_pair_with_no_check_is_unchecked() -> None:
    assert pair_status([]) == ("unchecked", None)
    assert pair_status(iter([]), {"t.py::test_a": "xpassed-strict"}) == ("unchecked", None)


def test_a_pair_whose_checks_all_passed_passed() -> None:
    checks = [{"passed": True}, {"passed": True, "xfail": "known"}]
    assert pair_status(checks) == ("passed", None)
    assert pair_status(iter(checks), {"t.py::test_a": "passed", "t.py::test_b": "xpassed"}) == ("passed", None)


def test_one_failed_check_outside_an_xfailed_test_fails_the_pair() -> None:
    assert pair_status([{"passed": True}, {"passed": False}]) == ("failed", None)
    assert pair_status([{"passed": False, "xfail": "known"}, {"passed": False}]) == ("failed", None)
    assert pair_status([{"passed": False, "xfail": None}]) == ("failed", None)


def test_failures_only_in_xfailed_tests_are_xfailed_with_the_reason() -> None:
    checks = iter([{"passed": True}, {"passed": False, "xfail": "issue 9"}, {"passed": False, "xfail": "issue 9"}])
    assert pair_status(checks) == ("xfailed", "issue 9")
    # passing checks' reasons do not count, only the failures'
    assert pair_status([{"passed": True, "xfail": "other"}, {"passed": False, "xfail": "mine"}]) == ("xfailed", "mine")


def test_a_strict_xpass_fails_a_pair_whose_checks_passed_naming_the_first_test() -> None:
    tests = {"t.py::test_b": "xpassed-strict", "t.py::test_a": "xpassed-strict", "t.py::test_c": "passed"}
    assert pair_status([{"passed": True}], tests) == (
        "failed",
        "passed, but t.py::test_a is marked xfail(strict=True)",
    )
    # a failed check takes precedence over the strict xpass's reason
    assert pair_status([{"passed": False}], tests) == ("failed", None)


def test_an_output_checks_output_name_is_a_field_that_round_trips() -> None:
    """Readers take the output's name from ``output``, never out of the subject's text."""
    outcome = _outcome(scope="output", subject="output 'x on tflite'", output="x on tflite")
    document = outcome.to_dict()
    assert document["output"] == "x on tflite"
    assert Outcome.from_dict(document) == outcome
    assert Outcome.from_dict({k: v for k, v in document.items() if k != "output"}).output is None


def test_a_top_k_checks_rank_is_a_field_that_round_trips() -> None:
    """Readers take k from ``k``, never out of the metric's text (``top-3 accuracy drop``)."""
    outcome = _outcome(check="max_top1_drop", metric="top-3 accuracy drop", k=3)
    document = outcome.to_dict()
    assert document["k"] == 3
    assert Outcome.from_dict(document) == outcome
    assert Outcome.from_dict({key: v for key, v in document.items() if key != "k"}).k is None
