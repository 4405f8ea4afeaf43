"""Declared config schemas: one frozen dataclass per table, every value checked before any work.

The study's config (:mod:`probing.study.config`) and pretraining's (:mod:`probing.pretrain`) are both TOML files of
tables. Each table is a frozen dataclass whose fields declare their type, default and range with :func:`setting`;
a :class:`Schema` names the tables and checks a file's values against them, with one wording for every refusal:
the key, the value and what was expected (``config: probes.folds = 'five': expected an integer >= 2``), an unknown
key or table with the closest known one (``unknown key probes.fold; did you mean probes.folds?``). A check across
keys of one table is the dataclass's ``__post_init__`` raising ValueError (:meth:`Schema.build`).

Types a field may declare: ``bool``, ``int``, ``float``, ``str``, a ``Literal`` of choices, ``tuple[T, ...]`` (a
TOML list) of those, ``X | None`` (the key may be left out), and a union of alternatives (``bool |
Literal["auto"]``). An integer is accepted where a number is declared; a boolean is never an integer.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

__all__ = ["Refused", "Schema", "check_value", "device_name", "expected", "field_specs", "optional", "setting",
           "suggestion"]


def setting(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, nonempty: bool = False, choices: Callable[[], Any] | None = None,
            check: Callable[[Any], None] | None = None, expect: str | None = None) -> Any:
    """A config field: its default, and what a value must be beyond its type. ``ge``/``gt``/``le``/``lt``: bounds
    (of each element, for a list); ``nonempty``: a string or list may not be empty; ``choices``: a function giving
    the allowed values (called when checking, so the registries load only then; a ``Literal`` type declares fixed
    choices); ``check``: a function raising ValueError with the reason a (typed) value is refused; ``expect``: what
    to say a value must be, where the type and bounds do not say it."""
    given = {"ge": ge, "gt": gt, "le": le, "lt": lt, "nonempty": nonempty, "choices": choices, "check": check,
             "expect": expect}
    meta = {k: v for k, v in given.items() if v is not None and v is not False}
    return field(default=default, metadata=meta)


def device_name(value: str) -> None:
    """The ``check`` of a ``device`` field: a name :func:`probing.models.pick_device` reads (whether the device is
    there is asked when it is picked, not when the config is read)."""
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", value):
        raise ValueError("expected 'auto', 'cpu', 'cuda' or 'cuda:N' (or 'mps')")


# ---------------------------------------------------------------------------------------------------
# One value against its declared type


class Refused(Exception):
    """A value is not what its field declares; ``reason`` says what was expected."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Wrong(Exception):
    """A value does not fit one alternative of a type (the caller words the refusal)."""


_TYPE_WORDS = {bool: ("true or false", "true or false values"), int: ("an integer", "integers"),
               float: ("a number", "numbers"), str: ("a string", "strings")}
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


def _alternatives(hint: Any) -> tuple[list[Any], bool]:
    """The alternatives of a union but ``None``, and whether ``None`` is one of them."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        return [a for a in args if a is not type(None)], type(None) in args
    return [hint], False


def optional(hint: Any) -> Any | None:
    """The ``X`` of ``X | None``, else None."""
    alts, none = _alternatives(hint)
    if not none:
        return None
    return alts[0] if len(alts) == 1 else typing.Union[tuple(alts)]


def _is_literal(hint: Any) -> bool:
    return typing.get_origin(hint) is Literal


def _bounds(meta: Mapping[str, Any]) -> str:
    return " and".join(f" {op} {meta[k]:g}" for k, op in _BOUNDS if k in meta)


def _choices(hint: Any, meta: Mapping[str, Any]) -> tuple | None:
    if _is_literal(hint):
        return typing.get_args(hint)
    return tuple(meta["choices"]()) if "choices" in meta else None


def expected(hint: Any, meta: Mapping[str, Any]) -> str:
    """What a value of a field must be, in words: ``'an integer >= 100'``, ``'a non-empty list of numbers > 0'``,
    ``"one of 'mlm', 'mlm+nsp'"``."""
    if "expect" in meta:
        return meta["expect"]
    alts, none = _alternatives(hint)
    if len(alts) > 1:
        said = " or ".join(expected(a, meta) for a in alts)
        return said + (" (or leave the key out)" if none else "")
    hint = alts[0]
    if none:
        return expected(hint, meta) + " (or leave the key out)"
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        choices = _choices(item, meta)
        among = f" among {', '.join(map(repr, choices))}" if choices is not None else ""
        kind = type(choices[0]) if _is_literal(item) else item
        return (f"a {'non-empty ' if meta.get('nonempty') else ''}list of {_TYPE_WORDS[kind][1]}{_bounds(meta)}"
                f"{among}")
    choices = _choices(hint, meta)
    if choices is not None:
        return repr(choices[0]) if len(choices) == 1 else f"one of {', '.join(map(repr, choices))}"
    word = _TYPE_WORDS[hint][0]
    if hint is str and meta.get("nonempty"):
        word = "a non-empty string"
    return word + _bounds(meta)


def _scalar(value: Any, hint: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` as a scalar of ``hint`` (bool, int, float, str or a Literal), else :class:`_Wrong`."""
    choices = _choices(hint, meta)
    if _is_literal(hint):
        ok = any(type(value) is type(c) and value == c for c in choices)
    elif hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        value = int(value) if ok else value
    elif hint is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, str)
    if ok and hint in (int, float):
        ok = (value >= meta.get("ge", -math.inf) and value > meta.get("gt", -math.inf)
              and value <= meta.get("le", math.inf) and value < meta.get("lt", math.inf))
    if ok and choices is not None:
        ok = value in choices
    if not ok:
        raise _Wrong
    return value


def _typed(value: Any, hint: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` as one alternative of ``hint`` holds it (a list as a tuple), else :class:`_Wrong`."""
    alts, none = _alternatives(hint)
    if none and value is None:
        return None
    for alt in alts:
        try:
            if typing.get_origin(alt) is tuple:
                if not isinstance(value, (list, tuple)) or (meta.get("nonempty") and not value):
                    raise _Wrong
                return tuple(_scalar(v, typing.get_args(alt)[0], meta) for v in value)
            out = _scalar(value, alt, meta)
            if alt is str and meta.get("nonempty") and not out.strip():
                raise _Wrong
            return out
        except _Wrong:
            continue
    raise _Wrong


def check_value(value: Any, hint: Any, meta: Mapping[str, Any]) -> Any:
    """``value`` as the field of type ``hint`` holds it (a list as a tuple, an integer as a float where a number
    is declared), or :class:`Refused` with the reason."""
    try:
        value = _typed(value, hint, meta)
    except _Wrong:
        raise Refused("expected " + expected(hint, meta)) from None
    if "check" in meta:
        try:
            meta["check"](value)
        except ValueError as err:
            raise Refused(str(err)) from None
    return value


def field_specs(cls: type) -> dict[str, tuple[Any, Mapping[str, Any]]]:
    """A table's fields: name -> (type, what :func:`setting` declared)."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata) for f in fields(cls)}


def suggestion(dotted: str, keys: list[str]) -> str:
    """``'; did you mean probes.folds?'`` for ``probes.fold`` among ``keys`` (dotted), or ``''``. Tried in turn: a
    key of the same table that differs by a letter or two, the same key in another table (``extract.device`` ->
    ``study.device``), a less close key of the same table, a close key anywhere."""
    section, _, key = dotted.rpartition(".")
    own = [k for k in keys if k.startswith(f"{section}.")]
    close = (difflib.get_close_matches(dotted, own, n=1, cutoff=0.8)
             or [k for k in keys if k.endswith(f".{key}")][:1]
             or difflib.get_close_matches(dotted, own, n=1) or difflib.get_close_matches(dotted, keys, n=1))
    return f"; did you mean {close[0]}?" if close else ""


# ---------------------------------------------------------------------------------------------------
# A file of tables


@dataclass(frozen=True)
class Schema:
    """The tables of a config file (name -> dataclass) and how its refusals are said: ``error``, the exception
    type (a ValueError the command lines map to ``error: ...``), each message starting ``source: `` (the file, or
    ``config``). ``also``: tables the file may hold that the caller reads itself (named among the known ones)."""

    tables: Mapping[str, type]
    error: type[ValueError] = ValueError
    source: str = "config"
    also: tuple[str, ...] = ()

    def at(self, source: str) -> Schema:
        """This schema, its messages naming ``source``."""
        return replace(self, source=source)

    def keys(self) -> list[str]:
        """Every ``table.key``."""
        return [f"{s}.{f.name}" for s, cls in self.tables.items() for f in fields(cls)]

    def unknown_key(self, dotted: str, where: str = "", keys: list[str] | None = None) -> ValueError:
        """The refusal of ``dotted``: the closest known key, else the table's keys."""
        hint = suggestion(dotted, self.keys() if keys is None else keys)
        section = dotted.partition(".")[0]
        if not hint and section in self.tables:
            hint = f"; known: {', '.join(field_specs(self.tables[section]))}"
        return self.error(f"{self.source}: {where}unknown key {dotted}{hint}")

    def checked(self, section: str, key: str, value: Any, where: str = "", name: str | None = None) -> Any:
        """``value`` of ``section.key`` as the field holds it, or the error naming the key (as ``name.key``), the
        value and what was expected."""
        hint, meta = field_specs(self.tables[section])[key]
        try:
            return check_value(value, hint, meta)
        except Refused as refused:
            raise self.error(f"{self.source}: {where}{name or section}.{key} = {value!r}: {refused.reason}") from None

    def table(self, section: str, values: Any, where: str = "", name: str | None = None) -> dict[str, Any]:
        """One table's values, each key and value checked (the table named ``name``, default ``section``, as an
        entry of an array of tables is named by its array)."""
        name = name or section
        if not isinstance(values, dict):
            raise self.error(f"{self.source}: {where}{name} = {values!r}: expected a table [{name}]")
        own = list(field_specs(self.tables[section]))
        out = {}
        for key, value in values.items():
            if key not in own:
                keys = [f"{name}.{k}" for k in own] + [k for k in self.keys() if not k.startswith(f"{section}.")]
                raise self.unknown_key(f"{name}.{key}", where, keys)
            out[key] = self.checked(section, key, value, where, name)
        return out

    def read(self, raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """A parsed file's tables, every table, key and value checked; an unknown table is refused with the
        closest known name (:attr:`also` among them: the caller pops those before)."""
        out: dict[str, dict[str, Any]] = {}
        known = [*self.tables, *self.also]
        for section, values in raw.items():
            if section not in self.tables:
                close = difflib.get_close_matches(section, known, n=1)
                raise self.error(f"{self.source}: unknown section [{section}]"
                                 + (f"; did you mean [{close[0]}]?" if close else "") + f"; known: {', '.join(known)}")
            out[section] = self.table(section, values)
        return out

    def dotted(self, values: Mapping[str, Any], where: str) -> dict[tuple[str, str], Any]:
        """Dotted ``table.key`` values (a ``[quick]`` table, the command line's overrides), each key and value
        checked as a file's; ``where`` names them in a refusal (``"override "``)."""
        out = {}
        for dotted, value in values.items():
            section, _, key = str(dotted).partition(".")
            if section not in self.tables or key not in field_specs(self.tables[section]):
                raise self.unknown_key(str(dotted), where)
            out[(section, key)] = self.checked(section, key, value, where)
        return out

    def rebuilt(self, section: str, obj: Any, where: str = "") -> Any:
        """A table built in code rather than read from a file (``RunConfig(seeds=[1, 1])``: a dataclass checks
        nothing when constructed), each field checked as a file's value, rebuilt from the checked values."""
        values = {key: getattr(obj, key) for key in field_specs(self.tables[section])}
        return self.build(self.tables[section], self.table(section, values, where))

    def build(self, cls: type, values: Mapping[str, Any], where: str = "") -> Any:
        """``cls(**values)`` of checked values; a check across keys (the dataclass's ``__post_init__`` raising
        ValueError, whose message names the keys and values) becomes the error."""
        try:
            return cls(**values)
        except ValueError as err:
            raise self.error(f"{self.source}: {where}{err}") from None
