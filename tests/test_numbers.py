"""One finite test and one number formatter for every layer (``numbers.py``), and the words each
output uses for a missing value."""

from __future__ import annotations

import math

import numpy as np

from pytest_qaccuracy import assertions
from pytest_qaccuracy.analysis.results import _metrics_dict
from pytest_qaccuracy.atomic import finite_json
from pytest_qaccuracy.metrics.base import NONFINITE_REASON, finite_result
from pytest_qaccuracy.numbers import finite, format_fixed, format_number
from pytest_qaccuracy.report import sensitivity_tables, summary


def test_finite() -> None:
    assert finite(0.25) == 0.25 and type(finite(np.float32(0.25))) is float
    assert finite(3) == 3.0 and finite("1.5") == 1.5
    for value in (None, math.nan, math.inf, -math.inf, np.float32("nan"), True, False, "x", [1.0]):
        assert finite(value) is None, value


def test_every_finite_user_agrees() -> None:
    """Results, strict JSON and metric results drop the same values."""
    assert _metrics_dict({"a": 0.5, "b": math.nan, "c": None, "d": -math.inf}) == {
        "a": 0.5,
        "b": None,
        "c": None,
        "d": None,
    }
    assert finite_json({"x": [math.inf, 2, 0.5]}) == {"x": [None, 2, 0.5]}
    assert type(finite_json({"x": 2})["x"]) is int  # integers stay integers in JSON
    assert finite_result(math.nan, None) == (None, NONFINITE_REASON)
    assert finite_result(None, "why") == (None, "why")
    assert finite_result(0.5, None) == (0.5, None)


def test_format_number() -> None:
    assert format_number(26 / 27) == "0.962963"
    assert format_number(1234567.0) == "1.23457e+06" and format_number(np.float32(0.1)) == "0.1"
    assert format_number(5) == "5" and format_number(math.nan) == "nan" and format_number(-math.inf) == "-inf"
    assert format_number(None) == "undefined" and format_number(None, missing="-") == "-"


def test_each_output_keeps_its_word_for_a_missing_value() -> None:
    """A sentence of a failure message, a terminal summary cell and a sensitivity table cell."""
    assert [assertions.fmt(None), summary._fmt(None), sensitivity_tables._fmt(None)] == ["undefined", "-", "n/a"]
    assert assertions.fmt(0.5) == summary._fmt(0.5) == sensitivity_tables._fmt(0.5) == "0.5"


def test_format_fixed() -> None:
    assert format_fixed(0.0) == "0.0000" and format_fixed(0.0128) == "0.0128" and format_fixed(-12.5) == "-12.5000"
    assert format_fixed(1.5e-6) == "1.5000e-06" and format_fixed(123456.0) == "1.2346e+05"


def test_format_fixed_switches_to_scientific_outside_one_thousandth_to_a_hundred_thousand() -> None:
    assert [format_fixed(v) for v in (0.0, 1e-3, 0.5, -0.5, 99999.5)] == [
        "0.0000",
        "0.0010",
        "0.5000",
        "-0.5000",
        "99999.5000",
    ]
    assert [format_fixed(v) for v in (9.99e-4, -1e-4, 1e5, 100000.5, -2e6)] == [
        "9.9900e-04",
        "-1.0000e-04",
        "1.0000e+05",
        "1.0000e+05",
        "-2.0000e+06",
    ]


def test_format_metric() -> None:
    from pytest_qaccuracy.numbers import format_metric

    assert format_metric("sqnr", None) == "n/a" and format_metric("mse", math.nan) == "nan"
    assert format_metric("mse", math.inf) == "inf"
    assert format_metric("sqnr", 12.5) == "12.50 dB" and format_metric("sqnr", -3) == "-3.00 dB"
    # cosine: 1 - cosine keeps 2 significant digits, 4 decimals at least, 12 at most
    assert format_metric("cosine", 0.999953) == "0.999953"
    assert format_metric("cosine", 0.9995) == "0.99950"  # 1 - cosine = 0.0005: 5 decimals
    assert format_metric("cosine", 0.5) == "0.5000" and format_metric("cosine", -0.99) == "-0.9900"
    assert format_metric("cosine", 1.0) == "1.0000" and format_metric("cosine", -1.0) == "-1.0000"
    assert format_metric("cosine", 1 - 1e-15) == "1.000000000000"
    assert format_metric("mse", 0) == "0" and format_metric("mse", 0.0) == "0"
    assert format_metric("mse", 0.000123456) == "0.0001235" and format_metric("mse", 123456.0) == "1.235e+05"
    assert format_metric("srmse", 2) == "2" and format_metric("mse", 1.0) == "1"
