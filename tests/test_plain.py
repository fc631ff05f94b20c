"""plain: the one builtins form of the frozen records, from their fields and type hints."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from pytest_qaccuracy.numbers import finite
from pytest_qaccuracy.plain import Plain, empty, fields_form, from_plain, none, plain_field, to_plain


@dataclass(frozen=True, slots=True)
class Point(Plain):
    x: int
    y: float


@dataclass(frozen=True, slots=True)
class Bare:
    """A dataclass without Plain: written by its fields, read by from_plain."""

    name: str
    scale: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Shape(Plain):
    version: int = plain_field(1, first=True, then=("kind",))
    kind: ClassVar[str] = "shape"
    name: str = plain_field(key="label")
    corner: Point
    points: tuple[Point, ...] = ()
    row: tuple[int, str, float] | None = None
    tags: frozenset[str] = frozenset()
    sizes: Mapping[str, list[Point]] = field(default_factory=dict)
    bare: Bare | None = None
    limit: float | None = None
    note: str | None = plain_field(None, omit=none)
    extra: Mapping[str, Any] = plain_field(default_factory=dict, omit=empty)
    values: list[float | None] = plain_field(default_factory=list, dump=lambda v: [finite(x) for x in v])
    hidden: str = plain_field("secret", skip=True)
    area: float = plain_field(0.0, then=("double",))

    @property
    def double(self) -> float:
        return 2 * self.area


@dataclass(frozen=True, slots=True)
class Tagged(Plain):
    test: str
    point: Point = plain_field(inline=True)
    name: str = plain_field(skip=True)


def _shape() -> Shape:
    return Shape(
        name="box",
        corner=Point(1, 2.5),
        points=(Point(0, 0.0), Point(3, 4.0)),
        row=(7, "[0, 1]", 0.5),
        tags=frozenset({"b", "a"}),
        sizes={"s": [Point(1, 1.0)]},
        bare=Bare("w", 0.25),
        limit=3,
        extra={"k": (1, 2)},
        values=[1.0, math.nan, math.inf, None],
        area=1.5,
    )


def test_the_form_follows_the_fields_and_their_hooks() -> None:
    assert _shape().to_dict() == {
        "version": 1,
        "kind": "shape",
        "label": "box",
        "corner": {"x": 1, "y": 2.5},
        "points": [{"x": 0, "y": 0.0}, {"x": 3, "y": 4.0}],
        "row": [7, "[0, 1]", 0.5],
        "tags": ["a", "b"],
        "sizes": {"s": [{"x": 1, "y": 1.0}]},
        "bare": {"name": "w", "scale": 0.25},
        "limit": 3,
        "extra": {"k": [1, 2]},
        "values": [1.0, None, None, None],
        "area": 1.5,
        "double": 3.0,
    }
    # the key order is the fields' order, a ``first`` field and its ``then`` before the others
    assert list(_shape().to_dict())[:4] == ["version", "kind", "label", "corner"]


def test_empty_parts_are_left_out_only_where_the_field_says_so() -> None:
    form = Shape(name="s", corner=Point(0, 0.0)).to_dict()
    assert "note" not in form and "extra" not in form
    assert form["row"] is None and form["bare"] is None and form["points"] == []
    assert Shape(name="s", corner=Point(0, 0.0), note="n").to_dict()["note"] == "n"


def test_a_record_reads_back_its_own_form() -> None:
    shape = _shape()
    again = Shape.from_dict(json.loads(json.dumps(shape.to_dict())))
    # Any stays as JSON gave it (a list for a tuple); NaN and inf were written as null
    expected = {**{f: getattr(shape, f) for f in Shape.__dataclass_fields__}, "values": [1.0, None, None, None]}
    expected["extra"] = {"k": [1, 2]}
    assert {f: getattr(again, f) for f in Shape.__dataclass_fields__} == expected
    assert type(again.points) is tuple and type(again.points[0]) is Point
    assert again.row == (7, "[0, 1]", 0.5) and type(again.row) is tuple
    assert again.tags == frozenset({"a", "b"}) and type(again.tags) is frozenset
    assert type(again.sizes["s"][0]) is Point and again.bare == Bare("w", 0.25)
    assert again.hidden == "secret"  # skipped: neither written nor read, its default


def test_types_are_converted_as_the_hints_say_and_values_in_an_optional_field_are_kept() -> None:
    data = {"label": "b", "corner": {"x": 1, "y": 2}, "limit": 3, "row": [1, "i", 2], "area": 1}
    shape = Shape.from_dict(data)
    assert shape.corner == Point(1, 2.0) and type(shape.corner.y) is float
    assert type(shape.area) is float
    # ``float | None`` keeps an integer as it came (writers print what the check measured)
    assert shape.limit == 3 and type(shape.limit) is int
    assert type(shape.row[2]) is float  # a fixed tuple's items each by their own type


def test_missing_and_null_keys() -> None:
    with pytest.raises(KeyError, match="corner"):
        Shape.from_dict({"label": "b"})
    shape = Shape.from_dict({"label": "b", "corner": {"x": 0, "y": 0}, "points": None, "extra": None, "limit": None})
    assert shape.points == () and shape.extra == {}  # null where the field cannot be None: its default
    assert shape.limit is None and shape.note is None


def test_an_inline_record_shares_its_keys_and_a_skipped_field_is_given() -> None:
    tagged = Tagged("t", Point(1, 2.0), name="n")
    assert tagged.to_dict() == {"test": "t", "x": 1, "y": 2.0}
    assert from_plain(Tagged, tagged.to_dict(), name="n") == tagged


def test_nan_and_infinity_pass_as_they_are_unless_a_hook_says_otherwise() -> None:
    form = fields_form(Point(1, math.nan))
    assert math.isnan(form["y"])
    assert Point.from_dict({"x": 1, "y": math.inf}).y == math.inf


def test_to_plain_of_containers() -> None:
    assert to_plain({"a": (1, Point(2, 3.0)), "b": {"z", "y"}}) == {"a": [1, {"x": 2, "y": 3.0}], "b": ["y", "z"]}
    assert to_plain(Bare("n", 1.0)) == {"name": "n", "scale": 1.0}
