"""The kind of value each field of an argument dataclass holds, checked before any range check.

A field's annotation is the one place that says what it holds (SamplingParams, EngineConfig);
`check_field_types` reads it and refuses a value of another kind with a ValueError naming the
field, the value and the kind. Without it a str meets `>=` as a raw TypeError, 1.5 reaches
`range()` or `torch.topk` deep in the engine or is truncated, True counts as 1, and "no" is a
truthy flag. The kinds:

    int              an integer: int or numpy's (numbers.Integral); never bool, never float
    float            a finite real number: int, float or numpy's (numbers.Real); never bool or str
    bool             True or False only
    str              a string
    list[int|str]    a list or tuple of those
    X | None         X, or None

An accepted value is stored as Python's own type (np.int64(5) as 5, a tuple as a list), so it
prints, compares and serialises as the number the user meant; an int given for a float stays an
int, so a job's fingerprint of `temperature = 1` does not change. Other annotations (dicts) are
left to the class's own checks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types
import typing
from collections.abc import Callable
from typing import Any


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError
    return int(value)


def _real(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError
    if isinstance(value, numbers.Integral):
        return int(value)
    out = float(value)
    if not math.isfinite(out):  # NaN compares false with every bound; inf is no setting either
        raise ValueError
    return out


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError
    return value


def _list_of(item: Callable[[Any], Any]) -> Callable[[Any], list[Any]]:
    def convert(value: Any) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise TypeError
        return [item(v) for v in value]

    return convert


@dataclasses.dataclass(frozen=True)
class Kind:
    what: str  # for the message: "must be {what}"
    # The value as Python's own type; raises TypeError or ValueError for a value not of this kind.
    convert: Callable[[Any], Any]
    # Types taken as they are without calling convert (the common case, kept cheap: LLM.generate
    # builds one SamplingParams per sample).
    exact: tuple[type, ...] = ()


KINDS: dict[Any, Kind] = {
    int: Kind("an integer", _integer, (int,)),
    float: Kind("a finite number", _real, (int,)),  # a float may be NaN or infinite: convert checks it
    bool: Kind("True or False", _flag, (bool,)),
    str: Kind("a string", _string, (str,)),
    list[int]: Kind("a list of integers", _list_of(_integer)),
    list[str]: Kind("a list of strings", _list_of(_string)),
}


@dataclasses.dataclass(frozen=True, slots=True)
class FieldKind:
    name: str
    kind: Kind
    optional: bool  # None is allowed
    default: Any  # dataclasses.MISSING where the field has no plain default
    as_is: tuple[type, ...]  # taken without a conversion: the kind's exact types (and NoneType if optional)


@functools.cache
def field_kinds(cls: type) -> tuple[FieldKind, ...]:
    """The fields of dataclass `cls` whose annotation is a known kind (read once per class)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        annotation = hints[f.name]
        optional = False
        if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
            args = typing.get_args(annotation)
            rest = [a for a in args if a is not type(None)]
            optional = len(rest) < len(args)
            if len(rest) != 1:
                continue
            annotation = rest[0]
        kind = KINDS.get(annotation)
        if kind is not None:
            as_is = (*kind.exact, type(None)) if optional else kind.exact
            out.append(FieldKind(f.name, kind, optional, f.default, as_is))
    return tuple(out)


def shown(value: Any, limit: int = 120) -> str:
    """A value for an error message: its repr, cut to `limit` characters (a list may be huge)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_field_types(obj: Any, label: str = "") -> None:
    """Check every field of the dataclass `obj` against its annotation's kind and store the
    accepted value as Python's own type. `label` prefixes the field in messages
    ("SamplingParams." gives "SamplingParams.n='2': must be an integer")."""
    cls: type = type(obj)
    values = vars(obj)
    for field in field_kinds(cls):
        value = values[field.name]
        if type(value) in field.as_is:
            continue
        try:
            converted = field.kind.convert(value)
        except (TypeError, ValueError, OverflowError):
            need = f"{field.kind.what}, or None" if field.optional else field.kind.what
            if value is None and field.default is not dataclasses.MISSING:
                need += f" (leave it unset for the default, {field.default!r})"
            raise ValueError(f"{label}{field.name}={shown(value)}: must be {need}") from None
        if converted is not value:
            object.__setattr__(obj, field.name, converted)  # the classes may be frozen
