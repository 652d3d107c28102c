"""Controls made from a frozen config dataclass: a widget per field from its annotation and default, read back into
the values its constructor takes, so that validation stays the config's own (a bad value is its ConfigError).

The annotation picks the widget: a `Literal[...]` a Dropdown of `literal_choices` (`Literal[...] | None` with a
choice standing for None), bool a Checkbox, int an IntText, float a FloatText, a tuple of strings a Text of
comma-separated names. A `Look` says how one field is shown where its annotation alone would not do: its label, a
slider's bounds, the choices of a field typed wider (`str | Callable`), each choice's label, more widget keywords.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable, Mapping
from typing import Any

import ipywidgets as W

from .._config import field_default, literal_choices


@dataclasses.dataclass(frozen=True)
class Look:
    """How one field is shown; every part is optional."""

    label: str | None = None
    """The control's description; default: the field's name, spaced (`experts_impl` → "experts impl")."""
    slider: tuple[float, float] | tuple[float, float, float] | None = None
    """(min, max) or (min, max, step): an int or float field as a slider instead of a text box."""
    choices: tuple[Any, ...] | None = None
    """The values offered (a Dropdown), in place of the annotation's: for a field typed wider than its choices."""
    names: Mapping[Any, str] = dataclasses.field(default_factory=dict)
    """A label for each choice (default: the choice itself)."""
    unset: tuple[str, str] | None = None
    """(label, value) of the choice standing for None, first of the choices (default: "(not set)") where the field
    may be None: ipywidgets shows a blank for an option whose value is None."""
    widget: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """More keywords of the widget (`style`, `indent`, …); a `layout` given as a dict becomes a `W.Layout`."""


def presentable(cls: type, name: str) -> bool:
    """A control can show field `name` of `cls` (a callable, a tuple of ops or an optional number cannot)."""
    return _kind(cls, name, Look()) is not None


def make(cls: type, name: str, value: Any, look: Look = Look()) -> W.ValueWidget:
    """The widget of field `name` of `cls` holding `value` (the field's default where the choices lack it)."""
    kind = _kind(cls, name, look)
    more = {"description": look.label or name.replace("_", " "), **look.widget}
    if isinstance(more.get("layout"), Mapping):
        more["layout"] = W.Layout(**more["layout"])
    if kind == "choice":
        choices = _choices(cls, name, look)
        unset = _unset(cls, name, look)
        if value not in choices and (value is not None or unset is None):
            value = field_default(cls, name)  # one the choices lack: a tuple scope, a backend callable, a custom mode
        if unset is not None and value is None:
            value = unset[1]
        if not look.names and unset is None:  # the values are their own labels, as `Dropdown.options` shows them
            return W.Dropdown(options=list(choices), value=value, **more)
        options = [(look.names.get(c, str(c)), c) for c in choices]
        return W.Dropdown(options=[unset, *options] if unset else options, value=value, **more)
    if kind == "bool":
        return W.Checkbox(value=value, **more)
    if kind == "names":
        return W.Text(value=", ".join(value), **more)
    if look.slider is not None:
        lo, hi, *step = look.slider
        slider = W.IntSlider if kind == "int" else W.FloatSlider
        more = {"continuous_update": False, **({"step": step[0]} if step else {}), **more}
        return slider(value=value, min=lo, max=hi, **more)
    if kind in ("int", "float"):
        return (W.IntText if kind == "int" else W.FloatText)(value=value, **more)
    raise TypeError(f"{cls.__name__}.{name}: no control shows {typing.get_type_hints(cls)[name]}")


def read(cls: type, name: str, widget: W.ValueWidget, look: Look = Look()) -> Any:
    """The value of field `name` that `widget` (made by `make`) holds: the unset choice is None, names a tuple."""
    kind = _kind(cls, name, look)
    unset = _unset(cls, name, look) if kind == "choice" else None
    if unset is not None and widget.value == unset[1]:
        return None
    if kind == "names":
        return tuple(part.strip() for part in widget.value.split(",") if part.strip())
    return widget.value


def fields(
    cls: type, controls: Mapping[str, W.ValueWidget], looks: Mapping[str, Look], names: Iterable[str]
) -> dict[str, Any]:
    """Field name → value of each of `names`, read from `controls` (`cls(**fields(...))` builds the config)."""
    return {name: read(cls, name, controls[name], looks.get(name, Look())) for name in names}


def _choices(cls: type, name: str, look: Look) -> tuple[Any, ...]:
    return look.choices if look.choices is not None else literal_choices(cls, name)


def _unset(cls: type, name: str, look: Look) -> tuple[str, str] | None:
    """The choice standing for None, where the field may be None (`Literal[...] | None`)."""
    if look.unset is not None or type(None) not in typing.get_args(_hints(cls)[name]):
        return look.unset
    return ("(not set)", "(not set)")


def _kind(cls: type, name: str, look: Look) -> str | None:
    """ "choice", "bool", "int", "float" or "names" (a tuple of strings): the widget the field gets; None: none."""
    if look.choices is not None or literal_choices(cls, name):
        return "choice"
    tp = _hints(cls)[name]
    if tp in (bool, int, float):
        return tp.__name__
    if typing.get_origin(tp) is tuple and typing.get_args(tp) == (str, ...):
        return "names"
    return None  # a union (`int | None`, `str | Callable`) or any other type: no control says it


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
