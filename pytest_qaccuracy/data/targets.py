"""Task-metric targets: one per record, of any shape, from the dataset or a JSON-lines sidecar file.

In a dataset (docs/data.md), ``targets`` holds one target per record along its first axis (numbers,
arrays, or strings: a ``str`` array); variable-length targets (box lists) are ``targets_values``, all
records' rows concatenated, and ``targets_offsets``, ``records + 1`` integers from 0 where record
``i`` is ``targets_values[offsets[i]:offsets[i + 1]]``. A sidecar file has one JSON object per line,
``{"record": 3, "target": ...}``, every record exactly once. Everything is checked against the
records before anything runs; an error names the file and the record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pytest_qaccuracy.errors import DataError

TARGETS_KEY = "targets"
VALUES_KEY = "targets_values"
OFFSETS_KEY = "targets_offsets"
#: Array names that hold targets rather than model inputs.
TARGET_KEYS = (TARGETS_KEY, VALUES_KEY, OFFSETS_KEY)


def _item(value: Any) -> Any:
    """One record's target as Python: a str for text, a number, or an array."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "O":
            return [_item(v) for v in value.tolist()]
        return value
    if isinstance(value, np.generic):
        return value.item()
    return value


def assemble_targets(arrays: Mapping[str, np.ndarray], count: int, where: str) -> list[Any] | None:
    """One target per record from the stored arrays (:data:`TARGET_KEYS`), or None when there are none.

    Args:
        arrays: the target arrays the dataset holds, by name.
        count: the dataset's number of records.
        where: the file, for messages (``data.npz``).
    """
    if not arrays:
        return None
    if TARGETS_KEY in arrays and (VALUES_KEY in arrays or OFFSETS_KEY in arrays):
        raise DataError(f"{where}: both '{TARGETS_KEY}' and '{VALUES_KEY}'/'{OFFSETS_KEY}'; keep one layout")
    if TARGETS_KEY in arrays:
        fixed = np.asarray(arrays[TARGETS_KEY])
        if fixed.ndim == 0 or fixed.shape[0] != count:
            raise DataError(
                f"{where}: '{TARGETS_KEY}' has shape {fixed.shape}, expected one target per record ({count})"
            )
        return [_item(fixed[i]) for i in range(count)]
    missing = [k for k in (VALUES_KEY, OFFSETS_KEY) if k not in arrays]
    if missing:
        raise DataError(f"{where}: '{VALUES_KEY}' and '{OFFSETS_KEY}' go together; '{missing[0]}' is missing")
    values, offsets = np.asarray(arrays[VALUES_KEY]), np.asarray(arrays[OFFSETS_KEY])
    if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or len(offsets) != count + 1:
        raise DataError(
            f"{where}: '{OFFSETS_KEY}' must be {count + 1} integers (records + 1), got {offsets.dtype} {offsets.shape}"
        )
    if values.ndim == 0:
        raise DataError(f"{where}: '{VALUES_KEY}' is 0-d; expected the rows of every record, concatenated")
    if offsets[0] != 0:
        raise DataError(f"{where}: '{OFFSETS_KEY}' must start at 0, got {int(offsets[0])}")
    steps = np.diff(offsets)
    if (steps < 0).any():
        record = int(np.argmax(steps < 0))
        raise DataError(
            f"{where}: record {record}: '{OFFSETS_KEY}' goes back from {int(offsets[record])} "
            f"to {int(offsets[record + 1])}"
        )
    if offsets[-1] != len(values):
        raise DataError(
            f"{where}: '{OFFSETS_KEY}' ends at {int(offsets[-1])} but '{VALUES_KEY}' has {len(values)} rows"
        )
    return [_item(values[offsets[i] : offsets[i + 1]]) for i in range(count)]


def read_sidecar(path: str | os.PathLike[str], count: int) -> list[Any]:
    """Targets from a JSON-lines file ``{"record": <int>, "target": <any JSON>}``, every record once."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DataError(f"{path}: cannot read targets ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: cannot read targets ({exc})") from None
    found: dict[int, Any] = {}
    first: dict[int, int] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: line {number}: not JSON ({exc.msg})") from None
        record = entry.get("record") if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or "target" not in entry
            or isinstance(record, bool)
            or not isinstance(record, int)
        ):
            raise DataError(f'{path}: line {number}: expected {{"record": <record number>, "target": ...}}')
        if not 0 <= record < count:
            raise DataError(f"{path}: line {number}: record {record} is not in the data (records 0..{count - 1})")
        if record in found:
            raise DataError(f"{path}: line {number}: record {record} again (first on line {first[record]})")
        found[record], first[record] = entry["target"], number
    missing = [i for i in range(count) if i not in found]
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
        raise DataError(f"{path}: no target for record {shown} ({len(missing)} of {count} records)")
    return [found[i] for i in range(count)]
