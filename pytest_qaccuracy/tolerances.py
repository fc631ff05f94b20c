"""Tolerances: the named output tolerances (:class:`Tolerance`), and ``qaccuracy_tolerances`` rule lines.

A rule line is ``<pair glob>[::<layer glob>] <metric><op><value>``, e.g. ``*::* sqnr>=20`` (every
layer of every pair) or ``detector::head* sqnr>=8``. Without ``::`` a rule applies to the pair's
outputs. For each target and metric the most specific matching rule wins: the one with the most
non-wildcard characters in its globs; on a tie, the later line. Pure: no pytest import.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from pytest_qaccuracy.task_names import TASK_KINDS, task_tolerance

#: Named tolerances (ini ``qaccuracy_<name>``, CLI ``--qaccuracy-<name>``, marker and TOML keys).
#: name -> (type, help)
TOLERANCES: dict[str, tuple[type, str]] = {
    "min_cosine": (float, "Smallest cosine similarity of each output (quantized vs fp32)"),
    "rtol": (float, "Relative tolerance per output element: |q - f| <= atol + rtol*|f|"),
    "atol": (float, "Absolute tolerance per output element (with rtol)"),
    "min_sqnr": (float, "Smallest SQNR of each output, in dB"),
    "min_top1_agreement": (float, "Smallest fraction (0..1) of records whose top-1 class is unchanged"),
    "max_top1_drop": (float, "Largest top-1 accuracy drop (fraction 0..1, needs labels); also top-k when topk > 1"),
    "topk": (int, "k of the extra top-k accuracy-drop check and of the top-k agreement reported"),
    "max_lsb": (float, "Largest error of each output in quantization steps"),
    "max_backend_steps": (int, "Largest step difference of any 8-bit tensor, integer emulation vs onnxruntime"),
    "max_saturated": (
        float,
        "Largest fraction (0..1) of int16 pair sums that saturate on x86 CPUs without VNNI "
        "(and wrap on each ARM64 target)",
    ),
    "min_channel_steps": (float, "Fewest quantization steps any varying channel of an output spans (axes 1..3)"),
}

_TASK_LINE = re.compile(r"^(?P<name>[^\s=]+)\s*=\s*(?P<value>\S+)$")


def is_tolerance(name: str) -> bool:
    """A named tolerance (:data:`TOLERANCES`) or a task-metric one (``max_drop:cer``)."""
    return name in TOLERANCES or task_tolerance(name) is not None


def parse_task_line(text: str) -> tuple[str, float]:
    """``max_drop:cer = 0.005`` as ``("max_drop:cer", 0.005)``; ValueError why not."""
    match = _TASK_LINE.match(text.strip())
    if match is None or task_tolerance(match["name"]) is None:
        kinds = "|".join(TASK_KINDS)
        raise ValueError(f"bad task tolerance {text.strip()!r}: expected '<{kinds}>:<value name> = <number>'")
    return match["name"], float(check_tolerance(match["name"], match["value"]))


#: The tolerance on the share of saturated int16 pair sums (``analysis.saturation``).
SATURATION = "max_saturated"
#: The tolerance of the agreement gate: the integer emulation's steps against onnxruntime.
GATE = "max_backend_steps"


@dataclass(frozen=True, slots=True)
class Tolerance:
    """One named tolerance in effect, validated once by :func:`check_tolerance`, with where it came
    from (``ini file pytest.ini``, ``marker @pytest.mark.qaccuracy(min_cosine=...)``, ...).

    ``value`` is None when only a pair's views set it: the views are checked, the pair's own
    outputs are not.
    """

    name: str
    value: float | None
    source: str

    @property
    def applies(self) -> bool:
        """Whether the pair's own outputs are held to it (False: its views' only)."""
        return self.value is not None


#: The tolerances in effect: name -> :class:`Tolerance`.
Tolerances = Mapping[str, Tolerance]

#: Values used when nothing else sets them.
DEFAULTS: dict[str, float | int] = {"min_cosine": 0.99, "topk": 1}

OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}

_RULE = re.compile(r"^(?P<target>\S+)\s+(?P<metric>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>>=|<=|>|<)\s*(?P<value>\S+)$")


def parse_number(text: object, kind: type = float) -> float | int:
    """``text`` as ``kind``; a ValueError says why not (inline comments, percentages)."""
    if isinstance(text, bool):
        raise ValueError(f"expected a number, got {text!r}")
    if isinstance(text, (int, float)) and kind is float:
        return float(text)
    if isinstance(text, int) and kind is int:
        return text
    raw = str(text).strip()
    hint = ""
    if "#" in raw or ";" in raw:
        hint = " (inline comments are not supported in ini files)"
    elif raw.endswith("%"):
        hint = " (write a fraction: 0.005, not 0.5%)"
    try:
        value = kind(raw)
    except ValueError:
        expected = "an integer" if kind is int else "a number"
        raise ValueError(f"expected {expected}, got {raw!r}{hint}") from None
    if kind is float and value != value:
        raise ValueError(f"expected a number, got {raw!r}")
    return value


class BadValue(ValueError):
    """A bad value of a named key: ``str()`` reads ``<key>: <reason>``, and ``reason`` alone is there
    for a caller that names the key its own way (``--qaccuracy-min-cosine``, ``qaccuracy_min_cosine``)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def check_tolerance(name: str, value: object) -> float | int:
    """Validate one named tolerance, from any source; :class:`BadValue` names the key and the problem.

    The only tolerance validator: options (:mod:`.settings`), markers, ``check()`` arguments, suite
    tables (:func:`tolerance_values`) and slices all call it.
    """
    if not is_tolerance(name):
        known = ", ".join([*TOLERANCES, *(f"{k}:<task value>" for k in TASK_KINDS)])
        raise ValueError(f"unknown tolerance '{name}' (known: {known})")
    kind = TOLERANCES[name][0] if name in TOLERANCES else float
    if name not in TOLERANCES:  # a task metric's bound: any number (a drop below 0 asks for a gain)
        try:
            return parse_number(value, float)
        except ValueError as exc:
            raise BadValue(name, str(exc)) from None
    try:
        number = parse_number(value, kind)
    except ValueError as exc:
        raise BadValue(name, str(exc)) from None
    if number < 0 and name != "min_sqnr":
        raise BadValue(name, f"must be >= 0, got {number}")
    if name == "topk" and number < 1:
        raise BadValue(name, f"must be >= 1, got {number}")
    if name in ("min_cosine", "min_top1_agreement", "max_top1_drop", "max_saturated") and number > 1:
        raise BadValue(name, f"must be between 0 and 1, got {number}")
    return number


def tolerance_values(values: Mapping[str, object], source: Callable[[str], str]) -> dict[str, Tolerance]:
    """``values`` validated by :func:`check_tolerance`, each with where it came from (``source(name)``);
    the first bad value raises its ValueError."""
    return {name: Tolerance(name, check_tolerance(name, value), source(name)) for name, value in values.items()}


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``qaccuracy_tolerances`` line."""

    pair: str
    layer: str | None
    metric: str
    op: str
    value: float
    text: str
    source: str
    position: int = 0
    required: bool = False  # a pair's own layer rule: matching no layer is an error (likely a typo)
    output: str | None = None  # a view's own output rule applies to that view only

    @property
    def specificity(self) -> tuple[int, int]:
        globs = self.pair + (self.layer or "") + (self.output or "")
        return (len(re.sub(r"[*?\[\]]", "", globs)), self.position)


def parse_rule(text: str, source: str, position: int = 0, known_metrics: Iterable[str] | None = None) -> Rule:
    """Parse ``<pair glob>[::<layer glob>] <metric><op><value>``; ValueError on a bad line."""
    match = _RULE.match(text.strip())
    if not match:
        expected = "'<pair glob>[::<layer glob>] <metric><op><value>'"
        raise ValueError(f"bad tolerance rule {text.strip()!r}: expected {expected}")
    target, metric = match["target"], match["metric"].lower()
    pair, _, layer = target.partition("::")
    if known_metrics is not None and metric not in set(known_metrics):
        raise ValueError(f"tolerance rule {text.strip()!r}: unknown metric '{metric}'")
    try:
        value = parse_number(match["value"])
    except ValueError as exc:
        raise ValueError(f"tolerance rule {text.strip()!r}: {exc}") from None
    return Rule(pair or "*", layer or None, metric, match["op"], float(value), text.strip(), source, position)


def parse_rules(lines: Sequence[str], source: str, known_metrics: Iterable[str] | None = None) -> list[Rule]:
    """The rule lines of ``lines``, skipping blanks and ``#`` comments.

    Positions count rules, not lines (0..n-1), so callers can append later rules at ``len(rules)``:
    a comment line must not move a rule past one that comes after it.
    """
    known = None if known_metrics is None else list(known_metrics)
    rules: list[Rule] = []
    for line in lines:
        if line.strip() and not line.strip().startswith("#"):
            rules.append(parse_rule(line, source, len(rules), known))
    return rules


def slice_rules(pair_id: str, slices: Sequence[object], offset: int = 0) -> list[Rule]:
    """Each view's own rules (``"sqnr>=10"``) on that view of ``pair_id`` only; they win over the
    pair's output rules (``position`` after every other rule)."""
    import glob
    from dataclasses import replace

    rules = []
    for view in slices:
        for text in getattr(view, "rules", ()):
            rule = parse_rule(f"{glob.escape(pair_id)} {text}", f"slice '{view.name}' rules", offset + len(rules))
            rules.append(replace(rule, text=text, output=view.name, position=1_000_000 + offset + len(rules)))
    return rules


def with_slice_tolerances(tolerances: Tolerances, slices: Sequence[Any]) -> dict[str, Tolerance]:
    """``tolerances`` plus, for a tolerance only views set, one without a value: asked for, but on the
    views only (:attr:`Tolerance.applies` is False)."""
    found = dict(tolerances)
    for view in slices:
        for name, _ in view.tolerances:
            found.setdefault(name, Tolerance(name, None, f"slice '{view.name}'"))
    return found


def rules_for(rules: Sequence[Rule], pair: str, names: Sequence[str | None], layer: bool) -> dict[str, Rule]:
    """The winning rule per metric for one target: an output (``layer=False``) or a layer whose
    tensor or node name is in ``names``."""
    best: dict[str, Rule] = {}
    for rule in rules:
        if (rule.layer is not None) != layer or not fnmatchcase(pair, rule.pair):
            continue
        if layer and not any(name is not None and fnmatchcase(name, rule.layer or "*") for name in names):
            continue
        if rule.output is not None and rule.output not in names:
            continue
        current = best.get(rule.metric)
        if current is None or rule.specificity >= current.specificity:
            best[rule.metric] = rule
    return best


#: The tolerances a file of pytest settings can set, by key (``qaccuracy_min_cosine``, ...).
INI_PREFIX = "qaccuracy_"
#: Where pytest reads its settings in each kind of file.
INI_SECTIONS = {".ini": "pytest", ".cfg": "tool:pytest"}


def ini_settings(path: Path) -> tuple[dict[str, Tolerance], list[Rule]]:
    """The named tolerances (with :data:`DEFAULTS`) and the ``qaccuracy_tolerances`` rules of a file of
    pytest settings (``pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``), validated as
    the plugin validates them; a ValueError names the file and the key."""
    values = _ini_values(path)
    where = f"ini file {path.name}"
    found = {name: Tolerance(name, value, "default") for name, value in DEFAULTS.items()}
    for name in TOLERANCES:
        key = INI_PREFIX + name
        if key in values:
            try:
                found[name] = Tolerance(name, check_tolerance(name, values[key]), f"{where} ({key})")
            except ValueError as exc:
                raise ValueError(f"{path}: {key}: {getattr(exc, 'reason', exc)}") from None
    key = INI_PREFIX + "task_tolerances"
    for line in _lines(values.get(key, [])):  # max_drop:cer = 0.005, as the plugin reads them
        try:
            name, value = parse_task_line(line)
        except ValueError as exc:
            raise ValueError(f"{path}: {key}: {getattr(exc, 'reason', exc)}") from None
        found[name] = Tolerance(name, value, f"{where} ({key})")
    try:
        rules = parse_rules(_lines(values.get(INI_PREFIX + "tolerances", [])), f"{where} ({INI_PREFIX}tolerances)")
    except ValueError as exc:
        raise ValueError(f"{path}: {INI_PREFIX}tolerances: {exc}") from None
    return found, rules


def ini_task_metrics(path: Path) -> tuple[str, ...]:
    """The ``qaccuracy_task_metrics`` of a file of pytest settings: one per line, or separated by
    commas, as the plugin reads them (imported and checked by the caller)."""
    values = _ini_values(path)
    lines = _lines(values.get(INI_PREFIX + "task_metrics", []))
    return tuple(x.strip() for line in lines for x in line.split(",") if x.strip())


def _lines(value: object) -> list[str]:
    """An ini value's lines (a TOML list's items), blank lines and ``#`` comments left out."""
    lines = value.splitlines() if isinstance(value, str) else [str(line) for line in value or []]
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _read(path: Path) -> str:
    """The text of ``path``; a ValueError names it and why not (no such file, not UTF-8)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: cannot read it ({exc})") from None


def _ini_values(path: Path) -> dict[str, Any]:
    """The pytest section of ``path`` as a mapping: strings from ini files; TOML values from
    ``pyproject.toml``'s ``[tool.pytest]`` (pytest 9's native table) or ``[tool.pytest.ini_options]``,
    and from ``pytest.toml``'s ``[pytest]``, as pytest reads them."""
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib
        try:
            document = tomllib.loads(_read(path))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: cannot read it ({exc})") from None
        if path.name in ("pytest.toml", ".pytest.toml"):
            return dict(document.get("pytest", {}))
        table = document.get("tool", {}).get("pytest", {})
        native = {key: value for key, value in table.items() if key != "ini_options"}
        if native and "ini_options" in table:
            raise ValueError(
                f"{path}: settings in both [tool.pytest] and [tool.pytest.ini_options] (pytest refuses it)"
            )
        return native or dict(table.get("ini_options", {}))
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(_read(path), str(path))
    except configparser.Error as exc:
        raise ValueError(f"{path}: cannot read it ({exc})") from None
    section = INI_SECTIONS.get(path.suffix, "pytest")
    if not parser.has_section(section):
        raise ValueError(f"{path}: no [{section}] section")
    return dict(parser.items(section))
