"""Reading one option: the command line first, then the ini file, with one error path for all.

An :class:`Option` has a command-line flag, an ini key, or both. :func:`read_option` returns the
value given, parsed, and where it came from (:class:`Origin`); a value the parser refuses is a
``pytest.UsageError`` whose one line names the flag or the ini key it came from, then why:
``--qaccuracy-min-cosine: expected a number, got 'high'`` or ``qaccuracy_batch_size: expected an
integer >= 1, got '0'``. Checks that run later (a metric the registry lacks, a provider onnxruntime
lacks) name the option the same way, from the origin kept in the settings.

Only stdlib and pytest at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pytest

from pytest_qaccuracy.plugin.ini import ini_lines, ini_text
from pytest_qaccuracy.tolerances import BadValue

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Option:
    """One option: where it can be given (an ini key, a command-line flag, or both) and how pytest
    declares it (:meth:`declare`), so the table of options is the only declaration."""

    ini: str | None = None
    flag: str | None = None
    #: the flag's help (the ini key's too, unless ``ini_help``)
    help: str = ""
    ini_help: str | None = None
    metavar: str | None = None
    #: the flag's argparse action: ``store``, ``append`` (repeatable), ``store_true``, ``store_const`` (True)
    action: str = "store"
    #: the flag's argparse ``dest``; None: argparse's (``--qaccuracy-max-lsb`` -> ``qaccuracy_max_lsb``)
    dest: str | None = None
    #: the ini key's pytest type: ``string``, or a list of strings (``linelist``, ``args``)
    ini_type: Literal["string", "linelist", "args"] = "string"

    @classmethod
    def named(cls, name: str, help: str, metavar: str | None = None, **fields: Any) -> Option:
        """The usual pair: ini key ``qaccuracy_<name>``, flag ``--qaccuracy-<name with dashes>``."""
        return cls(f"qaccuracy_{name}", "--qaccuracy-" + name.replace("_", "-"), help, metavar=metavar, **fields)

    @property
    def lines(self) -> bool:
        """Whether the ini key holds a list of strings."""
        return self.ini_type != "string"

    def declare(self, parser: pytest.Parser, group: pytest.OptionGroup) -> None:
        """Add the flag to ``group`` and the ini key to ``parser``; values stay as written (:mod:`.ini`)."""
        if self.flag is not None:
            extra: dict[str, Any] = {"dest": self.dest} if self.dest else {}
            if self.action in ("store", "append"):
                extra.update(metavar=self.metavar, default=[] if self.action == "append" else None)
            elif self.action == "store_const":
                extra.update(const=True, default=None)
            group.addoption(self.flag, action=self.action, help=self.help, **extra)
        if self.ini is not None:
            parser.addini(self.ini, self.ini_help or self.help, type=self.ini_type)


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a value was given."""

    #: how an error names the option: the flag or the ini key
    where: str
    #: how a value's source reads: ``command line --qaccuracy-rtol``, ``ini file tox.ini (qaccuracy_rtol)``
    source: str
    command_line: bool


def ini_source(config: pytest.Config) -> str:
    """``ini file <name>`` (the configuration file pytest read), or ``ini file`` without one."""
    return f"ini file {config.inipath.name}" if config.inipath else "ini file"


def _given(value: object) -> bool:
    """Whether a value counts as given: not None, not blank text, not an empty list."""
    if isinstance(value, str):
        return bool(value.strip())
    return value is not None and value != []


def given(config: pytest.Config, option: Option) -> tuple[object, Origin] | None:
    """The value as written (text, a native TOML scalar, or a list of strings) and where: the command
    line when it gives one, else the ini file; None when neither does."""
    if option.flag is not None:
        value = config.getoption(option.dest or option.flag)
        if _given(value):
            return value, Origin(option.flag, f"command line {option.flag}", True)
    if option.ini is not None:
        found = ini_lines(config, option.ini) if option.lines else ini_text(config, option.ini)
        if _given(found):
            return found, Origin(option.ini, f"{ini_source(config)} ({option.ini})", False)
    return None


def usage_error(where: str, exc: ValueError) -> pytest.UsageError:
    """The one error of a bad option value: ``<flag or ini key>: <reason>``."""
    reason = exc.reason if isinstance(exc, BadValue) else str(exc)
    return pytest.UsageError(f"{where}: {reason}")


def read_option(config: pytest.Config, option: Option, parse: Callable[[object], T]) -> tuple[T, Origin] | None:
    """``parse`` of the value given for ``option`` and where it came from; None when it is not given.

    Raises:
        pytest.UsageError: ``parse`` raised ValueError (see :func:`usage_error`).
    """
    found = given(config, option)
    if found is None:
        return None
    value, origin = found
    try:
        return parse(value), origin
    except ValueError as exc:
        raise usage_error(origin.where, exc) from None
