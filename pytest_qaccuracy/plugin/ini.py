"""Ini values as written: the plugin parses them itself, so errors read the same on every pytest.

Every ``qaccuracy_*`` key is declared as a plain string or a list of strings, which no pytest
version converts: pytest 8.4 raised ``ValueError`` from its own ``float()`` for ``type="float"``, 9.2
a ``UsageError`` reading ``could not convert string to float: '5%'``. Native TOML configuration
(pytest >= 9: ``pytest.toml``, ``[tool.pytest]``) keeps numbers and booleans, which pytest refuses
for a string key; :func:`ini_value` then reads the value from that file itself.

Only stdlib and pytest at module level.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

_MISSING = object()
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file (``tomllib``, or ``tomli`` before Python 3.11); raises its ``TOMLDecodeError``."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    with path.open("rb") as handle:
        return tomllib.load(handle)


def toml_decode_error() -> type[Exception]:
    """The ``TOMLDecodeError`` of :func:`load_toml`'s parser."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    return tomllib.TOMLDecodeError


def ini_value(config: pytest.Config, name: str) -> object:
    """The value of ini key ``name`` unconverted: text from ini files, a native value from native TOML."""
    try:
        return config.getini(name)
    except (TypeError, ValueError, pytest.UsageError) as exc:
        value = _native_toml(config, name)
        if value is _MISSING:
            reason = str(exc).rsplit(f"'{name}' ", 1)[-1]
            raise pytest.UsageError(f"{name}: {reason}") from None
        return value


def _native_toml(config: pytest.Config, name: str) -> object:
    """``name`` from the native TOML table of ``config.inipath``, or ``_MISSING``."""
    path = config.inipath
    if path is None or path.suffix != ".toml":
        return _MISSING
    try:
        data = load_toml(path)
    except (OSError, toml_decode_error()):
        return _MISSING
    table = data.get("tool", {}).get("pytest", {}) if path.name == "pyproject.toml" else data.get("pytest", {})
    return table.get(name, _MISSING) if isinstance(table, dict) else _MISSING


def ini_text(config: pytest.Config, name: str) -> str | int | float | bool | None:
    """A scalar key: the text (stripped), a native TOML scalar, or None when unset or empty."""
    value = ini_value(config, name)
    if isinstance(value, str):
        return value.strip() or None
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise pytest.UsageError(f"{name}: expected one value, got {value!r}")


def ini_lines(config: pytest.Config, name: str) -> list[str]:
    """A list key (``linelist`` or ``args``): its items; native TOML wants a list of strings."""
    value = ini_value(config, name)  # [] when unset: pytest's default for a linelist or args key
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise pytest.UsageError(f"{name}: expected a list of strings, got {value!r}")


def parse_bool(value: object) -> bool:
    """``true``/``false`` (also yes/no, on/off, 1/0) or a native boolean; ValueError otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"expected true or false, got {value!r}")
