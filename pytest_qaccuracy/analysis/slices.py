"""Named views of model outputs: ``boxes = "output0[:, 0:4]"``, ``scores = "output0[:, 4:]"``.

A detector that concatenates box coordinates (0..320 px) and class scores (0..1) into one output gets
one quantization scale for both: the scores collapse while the whole output still looks fine. A view
is compared like an output of its own, with its own metrics, tolerances and rules.

Syntax: ``<output>[<index>, ...]``, numpy basic indexing: ``:``, ``a:b``, ``a:b:c``, an integer or
``...`` per axis; the first index is the record axis and must be ``:`` (every record).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_VIEW = re.compile(r"^(?P<output>.+?)\[(?P<index>[^\[\]]*)\]$")
_INT = r"\s*-?\d+\s*"
_PART = re.compile(rf"^(?:\.\.\.|{_INT}|(?:{_INT})?:(?:{_INT})?(?::(?:{_INT})?)?)$")

Index = tuple[Any, ...]  # slices, ints and Ellipsis
#: Tolerances a view may set for itself (those measured per output by the comparison).
VIEW_TOLERANCES = ("min_cosine", "min_sqnr", "max_lsb", "min_channel_steps")


def parse_view(text: str) -> tuple[str, Index]:
    """``"output0[:, 4:]"`` -> ``("output0", (slice(None), slice(4, None)))``; ValueError says why not."""
    match = _VIEW.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not '<output>[<index>, ...]' (e.g. 'output0[:, 4:]')")
    parts = [p.strip() for p in match["index"].split(",")]
    if not all(_PART.match(p) for p in parts):
        raise ValueError(f"{text!r}: each index is ':', 'a:b', 'a:b:c', an integer or '...'")
    if parts[0] != ":":
        raise ValueError(f"{text!r}: the first index is the record axis and must be ':'")
    index = tuple(_index(p) for p in parts)
    return match["output"].strip(), index


def _index(part: str) -> Any:
    if part == "...":
        return Ellipsis
    if ":" not in part:
        return int(part)
    bounds = [int(x) if x.strip() else None for x in part.split(":")]
    return slice(*bounds)


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """One named view with its own tolerances (``(name, value)``) and output rules (``"sqnr>=10"``)."""

    name: str
    view: str
    tolerances: tuple[tuple[str, float], ...] = ()
    rules: tuple[str, ...] = ()

    @property
    def output(self) -> str:
        return parse_view(self.view)[0]

    @property
    def index(self) -> Index:
        return parse_view(self.view)[1]

    def take(self, array: Any) -> Any:
        """The view of one batch of the output (records first)."""
        try:
            return array[self.index]
        except IndexError as exc:
            raise ValueError(f"slice '{self.name}' ({self.view}) does not fit shape {array.shape}: {exc}") from None


def check_slices(value: Mapping[str, Any], check_tolerance=None) -> dict[str, SliceSpec]:
    """Validate ``slices`` (a table of name -> view, or name -> ``{view = ..., <tolerance> = ...,
    rules = [...]}``); ValueError names the slice and the problem."""
    if not isinstance(value, Mapping):
        raise ValueError('slices: expected a table of name = "<output>[<index>, ...]"')
    found = {}
    for name, entry in value.items():
        where = f"slices.{name}"
        table = {"view": entry} if isinstance(entry, str) else entry
        if not isinstance(table, Mapping) or not isinstance(table.get("view"), str):
            raise ValueError(f'{where}: expected a view string or a table with view = "<output>[...]"')
        try:
            parse_view(table["view"])
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        rules = table.get("rules", [])
        if not isinstance(rules, list) or not all(isinstance(r, str) for r in rules):
            raise ValueError(f"{where}.rules: expected a list of '<metric><op><value>' strings")
        tolerances = []
        for key, number in table.items():
            if key in ("view", "rules"):
                continue
            if check_tolerance is None or key not in VIEW_TOLERANCES:
                known = ", ".join(("view", "rules", *VIEW_TOLERANCES))
                raise ValueError(f"{where}: unknown key '{key}' (known: {known})")
            try:
                tolerances.append((key, check_tolerance(key, number)))
            except ValueError as exc:
                raise ValueError(f"{where}.{exc}") from None
        found[str(name)] = SliceSpec(str(name), table["view"].strip(), tuple(tolerances), tuple(rules))
    return found


def check_outputs(slices: tuple[SliceSpec, ...] | list[SliceSpec], outputs: list[str]) -> None:
    """Every view names an existing output, and no view takes an output's name (ValueError)."""
    for spec in slices:
        if spec.output not in outputs:
            raise ValueError(f"slice '{spec.name}': no output '{spec.output}' (outputs: {', '.join(outputs)})")
        if spec.name in outputs:
            raise ValueError(f"slice '{spec.name}': an output has this name; name the view differently")
