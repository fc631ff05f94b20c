"""Numbers as every layer shows and stores them: one test for a finite value, one formatter.

A metric value is a finite float or undefined (None with a reason); NaN and Inf never reach a table, a JSON
file or a colour scale. :func:`finite` is that test. :func:`format_number` is how a value is printed
to people (6 significant digits); where the value is missing, each output says so in its own words,
given by the caller: ``undefined`` in a sentence of a failure message, ``-`` in the terminal summary's
cells, ``n/a`` in the sensitivity tables. :func:`format_metric` is a metric's value in the comparison
tables, the report and the graphs (SQNR in dB, cosine with the decimals that show its distance from 1).
:func:`format_fixed` is the fixed decimals of ONE's visq legends, which the DOT graphs copy.
"""

from __future__ import annotations

import math

#: How a failure message's sentences print a missing value.
UNDEFINED = "undefined"


def finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number, else None (None, NaN, Inf, booleans, non-numbers)."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def format_number(value: float | None, missing: str = UNDEFINED) -> str:
    """``value`` with 6 significant digits (``0.962963``, ``1.23457e+06``, ``nan``); None as ``missing``."""
    if value is None:
        return missing
    return f"{float(value):.6g}"


def format_fixed(value: float) -> str:
    """ONE's ``x.xxxx``, switching to scientific notation where 4 decimals would hide the value."""
    if value == 0 or 1e-3 <= abs(value) < 1e5:
        return f"{value:.4f}"
    return f"{value:.4e}"


def format_metric(name: str, value: float | None) -> str:
    """Format one metric value for people: ``n/a`` for None, dB for SQNR, 4 significant digits otherwise.

    Cosine similarity is shown with enough decimals that ``1 - cosine`` keeps 2 significant digits
    (``0.999953`` shows as ``0.999953``, not ``1``).

    Args:
        name: the metric name (lower case, as in the comparison JSON).
        value: the value, or None when undefined.

    Returns:
        The formatted value.
    """
    number = finite(value)
    if number is None:
        return "n/a" if value is None else str(value)
    if name == "sqnr":
        return f"{number:.2f} dB"
    if name == "cosine":
        gap = 1.0 - abs(number)
        decimals = 4 if gap <= 0 else min(12, max(4, 1 - math.floor(math.log10(gap))))
        return f"{number:.{decimals}f}"
    if number == 0:
        return "0"
    return f"{number:.4g}"
