"""Numbers as every layer shows and stores them: one test for a finite value, one formatter.

A metric value is a finite float or undefined (None with a reason); NaN and Inf never reach a table, a JSON
file or a colour scale. :func:`finite` is that test. :func:`format_number` is how a value is printed
to people (6 significant digits); where the value is missing, each output says so in its own words,
given by the caller: ``undefined`` in a sentence of a failure message, ``-`` in the terminal summary's
cells, ``n/a`` in the sensitivity tables. :func:`format_fixed` is the one other style: the fixed
decimals of ONE's visq legends, which the DOT graphs copy.
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
