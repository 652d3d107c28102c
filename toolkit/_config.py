"""Shared plumbing for the toolkit's keyword-only config dataclasses: errors that name the field, JSON."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Self, TypeVar

from . import _migrations
from ._escape import UNSAFE, unsafe

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and how to fix it."""

    def __init__(self, owner: str, field: str, problem: str, fix: str):
        self.owner, self.field, self.problem, self.fix = owner, field, problem, fix
        # A problem with the whole value (a JSON file holding a list) has no field to name.
        super().__init__(f"{owner}{'.' + field if field else ''}: {problem} Fix: {fix}")


class InputWarning(UserWarning):
    """An input that runs but does nothing of what it says (a pattern matching no module): a Report lists it among
    its first lines, not with the torch warnings at the end."""


def warn_input(owner: str, field: str, problem: str, fix: str) -> None:
    """Warn about `owner.field` in ConfigError's words (the one spelling of an input warning)."""
    import warnings

    warnings.warn(f"{owner}.{field}: {problem} Fix: {fix}", InputWarning, stacklevel=3)


def check_choice(owner: str, field: str, value: Any, choices: typing.Iterable[Any]) -> None:
    choices = tuple(choices)
    # `True in (1, 2)` holds, and `[] in (…)` would hash nothing: a bool passes only where a bool is a choice.
    if (isinstance(value, bool) and not any(isinstance(c, bool) for c in choices)) or value not in choices:
        raise ConfigError(
            owner,
            field,
            f"{value!r} is not one of {', '.join(map(repr, choices))}.",
            f"pass one of {', '.join(map(repr, choices))}.",
        )


def check_strings(owner: str, field: str, value: Any, example: str, *, non_empty: bool = True) -> tuple[str, ...]:
    """A tuple (or list) of strings, returned as a tuple; a lone string is refused, not split into characters: the
    one home of every such check. `example` is what the fix suggests."""
    if isinstance(value, str):
        raise ConfigError(owner, field, "is a single string, not a tuple of strings.", f"pass ({value!r},).")
    if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) and (v or not non_empty) for v in value):
        kind = "non-empty strings" if non_empty else "strings"
        raise ConfigError(owner, field, f"{value!r} is not a tuple of {kind}.", f"pass e.g. {example}.")
    return tuple(value)


def check_int(
    owner: str, field: str, value: Any, minimum: int | None = None, maximum: int | None = None, why: str = ""
) -> None:
    """A whole number (not a bool), at or above `minimum` and at or below `maximum` (`why`: what the bound is for):
    the one home of every such check. Every size a user gives has its bound, checked before any work starts."""
    at_least = f" >= {minimum}" if minimum is not None else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            owner,
            field,
            f"{_short(value)} is not a whole number{at_least}.",
            f"pass e.g. {field}={max(1, minimum or 0)}.",
        )
    if minimum is not None and value < minimum:
        raise ConfigError(
            owner,
            field,
            f"{_short(value)} is not a whole number{at_least} (it is below {minimum}).",
            f"pass e.g. {field}={max(1, minimum)}.",
        )
    if maximum is not None and value > maximum:
        raise ConfigError(
            owner,
            field,
            f"{_short(value)} is above {maximum}, the most this takes{f' ({why})' if why else ''}.",
            f"pass {field} <= {maximum}.",
        )


def check_instance(
    owner: str, field: str, value: Any, kind: type | tuple[type, ...], fix: str, *, names: str = ""
) -> None:
    """`value` is a `kind` (an API handed a string for a model, None for a Report): a ConfigError naming the field and
    the fix, before anything reads an attribute of it. `names` says what the kinds are where a class's own name would
    not (a protocol the caller never sees)."""
    if not isinstance(value, kind):
        names = names or " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ConfigError(owner, field, f"{_short(value)} ({type(value).__name__}) is not a {names}.", fix)


def check_text(owner: str, field: str, value: Any, limit: int = 200) -> None:
    """A name shown on a terminal line: a string of at most `limit` characters with no control character (a NUL, a
    newline or an ESC colour code would break the line that leads with the classification)."""
    if not isinstance(value, str):
        raise ConfigError(owner, field, f"{_short(value)} is not a string.", f"pass {field} as text.")
    bad = next((c for c in value if unsafe(c)), None)  # controls, bidi overrides, lone surrogates: one rule
    if bad is not None:
        import unicodedata

        raise ConfigError(
            owner,
            field,
            f"holds the {UNSAFE[unicodedata.category(bad)]} character {bad!r}, which a terminal line cannot show.",
            "drop it.",
        )
    if len(value) > limit:
        raise ConfigError(owner, field, f"is {len(value)} characters long, over {limit}.", "pass a shorter name.")


def _short(value: Any) -> str:
    """A value as an error message shows it: a huge integer (5001 digits) by its size, not its digits."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 100:
        return f"a number of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


MAX_STEADY_STEPS = 1000
"""The most timing steps a measurement takes after its measured one (a median needs a few, not a billion)."""
MAX_RANKS = 64
"""The most ranks one machine runs under torchrun (each a process with torch imported: gloo on one host)."""
MAX_THREADS = 1024
"""The most intra-op threads a measurement asks torch for (more than any machine has cores; 10**6 crashed torch)."""
MAX_SECONDS = 7 * 24 * 3600
"""The longest time limit anything takes (a week): a longer one is no limit, and 1e300 overflows a deadline."""


def check_seconds(owner: str, field: str, value: Any) -> None:
    """A time limit: None (no limit) or a finite number of seconds above 0 — never NaN, inf or a bool."""
    import math

    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(
            owner,
            field,
            f"{_short(value)} is not a positive number of seconds.",
            f"pass e.g. {field}=600, or None for no limit.",
        )
    if value > MAX_SECONDS:
        raise ConfigError(
            owner,
            field,
            f"{value:g} s is longer than {MAX_SECONDS} s (a week), the longest limit this takes.",
            f"pass {field} <= {MAX_SECONDS}, or None for no limit.",
        )


def check_bool(owner: str, field: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(owner, field, f"{value!r} is not a bool.", "pass True or False.")


_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def check_bytes(owner: str, field: str, value: Any) -> int:
    """A memory size as bytes: a positive whole number, or a number and a unit as text (`"80GiB"`, `"80 GB"`,
    `"1.5 TiB"`; GiB = 2**30 bytes, GB = 10**9). Returns the bytes."""
    import math
    import re

    example = "pass e.g. budget='80GiB', '141 GB' or 85899345920 (bytes)."
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**62:
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]{0,3})\s*", value) if isinstance(value, str) else None
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ConfigError(owner, field, f"{_short(value)} is not a memory size.", example)
    n = float(m.group(1)) * _UNITS[unit]
    if not (math.isfinite(n) and 1 <= n < 2**62):
        raise ConfigError(owner, field, f"{_short(value)} is not a memory size between 1 B and 4 EiB.", example)
    return int(n)


def check_number(
    owner: str,
    field: str,
    value: Any,
    *,
    minimum: float,
    maximum: float | None = None,
    inclusive: bool = True,
    example: str = "1.0",
) -> None:
    """A finite real number at or above `minimum` (above it when not `inclusive`) and, given one, at or below
    `maximum`: NaN and inf never pass, since every comparison with NaN is False and a check written as
    `value < 0` would let it through."""
    import math

    within = f" between {minimum} and {maximum}" if maximum is not None else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(owner, field, f"{value!r} is not a finite number{within}.", f"pass e.g. {example}.")
    if maximum is not None and not minimum <= value <= maximum:
        raise ConfigError(owner, field, f"{value!r} is not between {minimum} and {maximum}.", f"pass e.g. {example}.")
    if value < minimum or (not inclusive and value == minimum):
        bound = f">= {minimum}" if inclusive else f"> {minimum}"
        raise ConfigError(owner, field, f"{value!r} is not {bound}.", f"pass e.g. {example}.")


def arg_type(
    check: Callable[[Any], None], *, convert: Callable[[str], Any] = float, example: str = ""
) -> Callable[[str], Any]:
    """An argparse `type=` made of a config check, so a flag and the API refuse the same values with the same
    words: the text is converted, checked, and a failure names the text as typed (`-1 is not a positive number
    of seconds (e.g. --timeout-s 600)`)."""
    import argparse

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            kind = "whole number" if convert is int else "number"
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a {kind}" + (f" (e.g. {example})" if example else "")
            ) from None
        try:
            check(value)
        except ConfigError as e:
            problem = e.problem.replace(repr(value), text, 1).rstrip(".")
            raise argparse.ArgumentTypeError(problem + (f" (e.g. {example})" if example else "")) from None
        return value

    return parse


@functools.cache
def literal_choices(cls: type, field: str) -> tuple[Any, ...]:
    """The allowed values of a `Literal[...]`-annotated dataclass field (used by validation and widgets); for
    `Literal[...] | None` (an option that may be left unset) the Literal's values, without None."""
    hints = typing.get_type_hints(cls)
    tp = hints[field]
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    out: list[Any] = []
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is typing.Literal:
            out += typing.get_args(arg)
    return tuple(out)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-safe dict of a config dataclass; callables become their qualified name (not restorable)."""
    return {f.name: plain_value(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def plain_value(v: Any) -> Any:
    """One field's value as a record holds it: a nested config as its dict, a callable as its name, a tuple as a list,
    a set as a sorted list of names."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return to_dict(v)
    if callable(v):
        return f"<callable {getattr(v, '__module__', '?')}.{getattr(v, '__qualname__', repr(v))}>"
    if isinstance(v, (frozenset, set)):
        return sorted(map(str, v))
    if isinstance(v, tuple):
        return [str(x) if not isinstance(x, (int, float, str, bool)) else x for x in v]
    return v


def check_object(owner: str, data: Any, example: str) -> None:
    """`data` (read from JSON) is an object of fields, not a list, a string or null."""
    if not isinstance(data, dict):
        raise ConfigError(owner, "", f"{data!r} is not an object of {owner} fields.", f"write e.g. {example}.")


def check_known(cls: type, data: dict[str, Any]) -> None:
    """Every key of `data` is a field of the dataclass `cls`: the first that is not is a ConfigError naming it."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            cls.__name__, unknown[0], f"is not a field of {cls.__name__}.", f"use one of {', '.join(sorted(names))}."
        )


def refuse_callables(cls: type, data: dict[str, Any]) -> None:
    """No value of `data` is a callable's mark (`to_dict` writes a callable as its name: not restorable)."""
    for k, v in data.items():
        if isinstance(v, str) and v.startswith("<callable "):
            raise ConfigError(
                cls.__name__,
                k,
                "holds a callable, which JSON cannot carry.",
                "set the callable again in Python after loading.",
            )


def from_dict(cls: type[_T], data: dict[str, Any]) -> _T:
    """Rebuild a config from `to_dict` output: unknown keys and callables' marks are an error naming the key; JSON
    lists become the field's tuple or frozenset."""
    check_object(cls.__name__, data, "{...} as to_dict() writes it")
    check_known(cls, data)
    refuse_callables(cls, data)
    kwargs = {}
    hints = typing.get_type_hints(cls)
    for k, v in data.items():
        if isinstance(v, list):
            origin = typing.get_origin(hints[k])
            args = typing.get_args(hints[k])
            if origin is frozenset or frozenset in [typing.get_origin(a) for a in args]:
                v = frozenset(v)
            else:
                v = tuple(v)
        kwargs[k] = v
    return cls(**kwargs)


def field_default(cls: type, name: str) -> Any:
    """The default of field `name` of the dataclass `cls` (its factory's value, for a field that has one)."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


class PlainData:
    """The one base of the toolkit's frozen config dataclasses: `replace` (a copy with changes), `to_dict` and
    `from_dict` (its JSON record). The record's history — fields added later, older shapes — is `_migrations`' table,
    applied here for every config alike; a config says only how its own fields are written and read (`_record`,
    `_from_record`)."""

    RECORD: ClassVar[str] = ""
    """The record's kind in `_migrations` (a family's classes share their base's: every AC mode is "ACConfig");
    "" for the class's own name."""
    RECORD_EXAMPLE: ClassVar[str] = "{...} as to_dict() writes it"
    """A record to show in the error for something that is not one."""

    def replace(self, **changes: Any) -> Self:
        # Every subclass is a dataclass, which PlainData itself is not.
        return typing.cast(Self, dataclasses.replace(typing.cast("DataclassInstance", self), **changes))

    def to_dict(self) -> dict[str, Any]:
        kind = self._kind()
        data = _migrations.shape(kind, self._record())
        for name in _migrations.added(kind):  # absent while unset, as before they existed: records keep their keys
            if name in data and data[name] == self._unset(name):
                data.pop(name)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        check_object(cls._kind(), data, cls.RECORD_EXAMPLE)
        return cls._from_record(_migrations.upgrade(cls._kind(), dict(data)))

    @classmethod
    def _kind(cls) -> str:
        return cls.RECORD or cls.__name__

    def _record(self) -> dict[str, Any]:
        """This config's fields as a record holds them, before the table's rules."""
        return to_dict(self)

    def _unset(self, name: str) -> Any:
        """The value a field added later holds while unset, as its record writes it: its default."""
        return plain_value(field_default(type(self), name))

    @classmethod
    def _from_record(cls, data: dict[str, Any]) -> Any:
        """The config from its record, after the table's rules."""
        return from_dict(cls, data)
