"""plain: the one builtins form of the frozen records, from their fields and type hints."""

from __future__ import annotations

import json
import math
import typing
from collections import abc
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


# --- records made inside the tests: plain_field, _specs and _hints run under the test ---------------
# (their type hints name module-level types only: get_type_hints reads this module's globals)


@dataclass(frozen=True, slots=True)
class Inner(Plain):
    a: int
    b: int = 0


def test_a_field_made_here_carries_every_hook_and_its_defaults() -> None:
    """Every hook of plain_field on a record made inside the test, key order included: ``first`` fields
    lead, ``then`` attributes follow their field, an ``inline`` record's keys join the enclosing ones."""

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Local(Plain):
        plain: int = plain_field(5)
        keyed: str = plain_field("k", key="K")
        gone: str | None = plain_field(None, omit=none)
        doubled: int = plain_field(1, dump=lambda v: 2 * v, load=lambda v: v // 2)
        secret: str = plain_field("s", skip=True)
        head: int = plain_field(0, first=True)
        listed: list[int] = plain_field(default_factory=list, then=("total",))
        inner: Inner = plain_field(default_factory=lambda: Inner(1, 2), inline=True)

        @property
        def total(self) -> int:
            return sum(self.listed)

    record = Local(listed=[1, 2])
    form = record.to_dict()
    assert list(form.items()) == [
        ("head", 0),
        ("plain", 5),
        ("K", "k"),
        ("doubled", 2),
        ("listed", [1, 2]),
        ("total", 3),
        ("a", 1),
        ("b", 2),
    ]
    assert Local.from_dict(form) == record
    assert Local.from_dict({**form, "doubled": 8, "gone": "here", "secret": "x"}) == Local(
        listed=[1, 2], doubled=4, gone="here"
    )  # a skipped field is never read
    assert Local().listed == [] and Local().listed is not Local().listed  # a new list each time
    assert Local().plain == 5 and Local().secret == "s"


def test_from_plain_takes_defaults_given_fields_and_refuses_a_missing_required_key() -> None:
    @dataclass(frozen=True, slots=True)
    class Local:
        name: str
        count: int = 3
        limit: float | None = 1.5
        derived: int = field(init=False, default=7)

    assert from_plain(Local, {"name": "n"}) == Local("n")  # missing keys: their defaults
    assert from_plain(Local, {"name": "n", "count": None, "limit": None}) == Local("n", 3, None)
    assert from_plain(Local, {"count": 4}, name="given") == Local("given", 4)  # given wins
    assert from_plain(Local, {"name": "n", "derived": 1}).derived == 7  # not an init field
    with pytest.raises(KeyError, match="name"):
        from_plain(Local, {"count": 1})


def test_values_are_read_as_their_type_hints_say() -> None:
    @dataclass(frozen=True, slots=True)
    class Local:
        whole: int
        real: float
        flag: bool
        text: str
        point: Point | None
        bare: Bare | None
        either: int | str
        maybe: int | None
        many: tuple[Point, ...]
        fixed: tuple[int, str]
        loose: typing.Tuple  # noqa: UP006  (typing's bare Tuple: origin tuple, no arguments)
        bare_tuple: tuple  # the builtin: no origin, kept as it is
        seq: abc.Sequence[int]
        items: list[Point]
        group: frozenset[int]
        table: dict[str, Point]
        mapping: abc.Mapping[str, int]
        anything: dict
        untyped: Any

    data = {
        "whole": 3.0,
        "real": 2,
        "flag": 1,
        "text": 5,
        "point": {"x": 1, "y": 2},
        "bare": {"name": "w", "scale": 1},
        "either": 2.5,
        "maybe": 4.0,
        "many": [{"x": 0, "y": 1}],
        "fixed": [1.0, 2],
        "loose": [1, "a"],
        "bare_tuple": [1],
        "seq": [1, 2],
        "items": [{"x": 2, "y": 3}],
        "group": [2, 1, 2],
        "table": {"p": {"x": 5, "y": 6}},
        "mapping": {"m": 1},
        "anything": {"k": [1]},
        "untyped": {"k": (1,)},
    }
    got = from_plain(Local, data)
    assert type(got.whole) is int and got.whole == 3 and type(got.real) is float and got.real == 2.0
    assert got.flag is True and got.text == "5"
    assert got.point == Point(1, 2.0) and got.bare == Bare("w", 1)
    assert got.either == 2.5 and got.maybe == 4.0  # inside a union of scalars: kept as it is
    assert got.many == (Point(0, 1.0),) and got.fixed == (1, "2") and got.loose == (1, "a") and got.bare_tuple == [1]
    assert got.seq == [1, 2] and got.items == [Point(2, 3.0)] and got.group == frozenset({1, 2})
    assert got.table == {"p": Point(5, 6.0)} and got.mapping == {"m": 1} and got.anything == {"k": [1]}
    assert got.untyped == {"k": (1,)}
    assert from_plain(Local, {**data, "point": None, "bare": None}).point is None


def test_to_plain_of_records_classes_and_containers() -> None:
    assert to_plain(Bare("w", 0.5)) == {"name": "w", "scale": 0.5}  # no to_dict: its fields
    assert to_plain(Point(1, 2.0)) == {"x": 1, "y": 2.0}
    assert to_plain(Point) is Point  # a dataclass type is not a record
    assert to_plain({"a": (1, {2, 1}), "b": frozenset({"y", "x"})}) == {"a": [1, [1, 2]], "b": ["x", "y"]}
    assert to_plain("text") == "text" and to_plain(None) is None


@dataclass(frozen=True, slots=True)
class Custom:
    """A record with its own builtins form, which to_plain and the loader must use."""

    value: int

    def to_dict(self) -> dict[str, int]:
        return {"v": self.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, int]) -> Custom:
        return cls(data["v"])


def test_a_records_own_form_and_the_rest_of_the_hints() -> None:
    @dataclass(frozen=True, slots=True)
    class Local:
        custom: Custom
        tags: frozenset[str]
        pair: tuple[int, int]
        loose: typing.Dict  # noqa: UP006  (typing's bare Dict: origin dict, no arguments)
        either: int | str = 3
        weight: int = plain_field(0, compare=False)  # dataclasses.field's own arguments pass through

    assert to_plain(Custom(4)) == {"v": 4}
    got = from_plain(Local, {"custom": {"v": 4}, "tags": [5], "pair": [1, 2], "loose": {"k": 1}, "either": None})
    assert got.custom == Custom(4) and got.tags == frozenset({"5"}) and got.loose == {"k": 1}
    assert got.either == 3  # null, a default, and no None in the union: the default
    with pytest.raises(ValueError, match="zip"):
        from_plain(Local, {"custom": {"v": 1}, "tags": [], "pair": [1, 2, 3], "loose": {}})
    assert got == Local(Custom(4), frozenset({"5"}), (1, 2), {"k": 1}, 3, weight=9)
