"""Task-metric tolerance names (``max_drop:cer``, ``min:exact_match``): stdlib only, so that the
plugin's rules read them at start-up without importing numpy (``tests/plugin/test_imports.py``).
The task metrics themselves are :mod:`pytest_qaccuracy.metrics.task`."""

from __future__ import annotations

import re

#: Task-metric tolerances ``<kind>:<value name>`` (``max_drop:cer``, ``min:exact_match``): kind -> (op,
#: what is compared). ``max_drop`` bounds how much worse the quantized side is, in the metric's direction.
TASK_KINDS: dict[str, tuple[str, str]] = {
    "min": (">=", "quantized"),
    "max": ("<=", "quantized"),
    "max_drop": ("<=", "drop"),
}
_TASK_NAME = re.compile(r"^(?P<kind>min|max|max_drop):(?P<value>[a-z_][a-z0-9_]*)$")


def task_tolerance(name: str) -> tuple[str, str] | None:
    """``(kind, value name)`` of a task-metric tolerance name (``max_drop:cer``), None for any other."""
    match = _TASK_NAME.match(name)
    return None if match is None else (match["kind"], match["value"])
