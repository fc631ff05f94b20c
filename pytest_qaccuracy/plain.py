"""The one builtins form of the frozen records: a dataclass as plain dicts, lists and numbers, and back.

:class:`Plain` gives a dataclass ``to_dict`` and ``from_dict`` from its fields and type hints: the
fields in their order, each as :func:`to_plain` makes it (a record as its ``to_dict()``, a mapping as
a dict, a list or tuple as a list, a set sorted), and back as the field's type hint says (a record
by its ``from_dict``, ``tuple[...]``, ``list[...]``, ``dict[...]``, ``frozenset[...]``, and ``int``,
``float``, ``bool``, ``str`` converted; a value inside ``X | None`` is kept as it is). A field that
needs another form says so with :func:`plain_field`. Pure: stdlib only.
"""

from __future__ import annotations

import functools
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any, TypeVar

T = TypeVar("T")

_SCALARS = (int, float, bool, str)


@dataclass(frozen=True, slots=True)
class _Hooks:
    """What :func:`plain_field` says of a field (see there)."""

    key: str | None = None
    omit: Callable[[Any], bool] | None = None
    dump: Callable[[Any], Any] | None = None
    load: Callable[[Any], Any] | None = None
    skip: bool = False
    first: bool = False
    then: tuple[str, ...] = ()
    inline: bool = False


_NO_HOOKS = _Hooks()


def plain_field(
    default: Any = MISSING,
    *,
    default_factory: Any = MISSING,
    key: str | None = None,
    omit: Callable[[Any], bool] | None = None,
    dump: Callable[[Any], Any] | None = None,
    load: Callable[[Any], Any] | None = None,
    skip: bool = False,
    first: bool = False,
    then: tuple[str, ...] = (),
    inline: bool = False,
    **kwargs: Any,
) -> Any:
    """A dataclass field with its own builtins form: written under ``key``; left out when ``omit(value)``;
    written as ``dump(value)`` and read as ``load(data)``; not in the form at all (``skip``); written
    before the other fields (``first``); followed by the attributes named in ``then`` (properties,
    written only); its record's keys written into the enclosing one and read from it (``inline``)."""
    hooks = _Hooks(key, omit, dump, load, skip, first, tuple(then), inline)
    return field(default=default, default_factory=default_factory, metadata={"plain": hooks}, **kwargs)


def none(value: Any) -> bool:
    """``omit=none``: left out when None."""
    return value is None


def empty(value: Any) -> bool:
    """``omit=empty``: left out when None, empty or false."""
    return not value


def to_plain(value: Any) -> Any:
    """``value`` as builtins: a record as its ``to_dict()`` (or its fields' form), a mapping as a dict,
    a list or tuple as a list, a set as a sorted list; anything else as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        return to_dict() if to_dict is not None else fields_form(value)
    if isinstance(value, Mapping):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(to_plain(v) for v in value)
    return value


def fields_form(record: Any) -> dict[str, Any]:
    """The record's fields as builtins, in their order (``first`` ones first), with their hooks."""
    out: dict[str, Any] = {}
    specs = _specs(type(record))
    for f, hooks in sorted(specs, key=lambda spec: not spec[1].first):
        value = getattr(record, f.name)
        if hooks.skip or (hooks.omit is not None and hooks.omit(value)):
            continue
        form = hooks.dump(value) if hooks.dump is not None else to_plain(value)
        if hooks.inline:
            out.update(form)
        else:
            out[hooks.key or f.name] = form
        out.update({name: to_plain(getattr(record, name)) for name in hooks.then})
    return out


def from_plain(cls: type[T], data: Mapping[str, Any], **given: Any) -> T:
    """The record ``cls`` read from its builtins form (``given``: fields the form does not hold). A
    missing key takes the field's default, and so does a null one unless the field may be None; a
    missing key without a default raises KeyError."""
    hints = _hints(cls)
    values = dict(given)
    for f, hooks in _specs(cls):
        if hooks.skip or not f.init or f.name in values:
            continue
        key = hooks.key or f.name
        if not hooks.inline and key not in data and _has_default(f):
            continue
        raw = data if hooks.inline else data[key]
        if raw is None and _has_default(f) and not _optional(hints[f.name]):
            continue
        values[f.name] = _load(hints[f.name], raw) if raw is None or hooks.load is None else hooks.load(raw)
    return cls(**values)


class Plain:
    """A dataclass's ``to_dict`` and ``from_dict`` from its fields (:func:`fields_form`, :func:`from_plain`)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return fields_form(self)

    @classmethod
    def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
        return from_plain(cls, data)


@functools.cache
def _specs(cls: type) -> tuple[tuple[Field[Any], _Hooks], ...]:
    return tuple((f, f.metadata.get("plain", _NO_HOOKS)) for f in fields(cls))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _has_default(f: Field[Any]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _optional(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in typing.get_args(hint)


def _load(hint: Any, value: Any) -> Any:
    """``value`` as ``hint`` says (see the module's docstring)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if value is None:
        return None
    if origin in (typing.Union, types.UnionType):
        kinds = [a for a in args if a is not type(None)]
        return value if len(kinds) != 1 or kinds[0] in _SCALARS else _load(kinds[0], value)
    if is_dataclass(hint):
        return hint.from_dict(value) if hasattr(hint, "from_dict") else from_plain(hint, value)
    if hint in _SCALARS:
        return hint(value)
    item = args[0] if args else Any
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_load(item, v) for v in value)
        return tuple(_load(a, v) for a, v in zip(args, value, strict=True)) if args else tuple(value)
    if origin in (list, abc.Sequence):
        return [_load(item, v) for v in value]
    if origin is frozenset:
        return frozenset(_load(item, v) for v in value)
    if origin in (dict, abc.Mapping):
        return {k: _load(args[1] if args else Any, v) for k, v in value.items()}
    return value
