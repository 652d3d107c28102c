"""A Report's JSON: written as plain data, read back field by field against its types, and older records migrated."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import TYPE_CHECKING, Any, Literal

from .. import _migrations
from .._config import ConfigError, check_object

if TYPE_CHECKING:
    from .report import Report

SCHEMA_VERSION = 3
Outcome = Literal["ok", "error", "crashed", "timeout"]
OUTCOMES: tuple[str, ...] = typing.get_args(Outcome)


def recipe_ac_mode(recipe: str) -> str:
    """The AC mode a recipe applies ("recipe" for a name this toolkit does not know)."""
    from ..transforms.recipes import RECIPES

    return RECIPES[recipe].ac_mode if recipe in RECIPES else "recipe"


def read(cls: type[Report], data: dict[str, Any]) -> Report:
    """Rebuild from `to_dict` output: a record that is not one (no outcome, an unknown outcome, no saved or
    environment section, a schema newer than this toolkit's) is a ConfigError naming the field, never a Report
    that reads as ok with zeros."""
    check_object("Report", data, '{"outcome": "ok", "saved": {...}, ...} as Report.to_json() writes it')
    for key in ("outcome", "saved", "environment"):
        if key not in data:
            raise ConfigError(
                "Report", key, "is missing: this is not a Report record.", "pass Report.to_json()'s output."
            )
    if data["outcome"] not in OUTCOMES:
        raise ConfigError(
            "Report",
            "outcome",
            f"{data['outcome']!r} is not one of {', '.join(OUTCOMES)}.",
            "pass a Report record.",
        )
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ConfigError(
            "Report",
            "schema_version",
            f"{version!r} is not a schema this toolkit reads (1 to {SCHEMA_VERSION}).",
            "read it with the toolkit that wrote it, or measure again.",
        )
    for key in ("saved", "environment"):
        if not isinstance(data[key], dict):
            raise ConfigError("Report", key, f"is {data[key]!r}, not an object.", "pass a Report record.")
    if data["outcome"] != "ok" and not isinstance(data.get("error"), dict):
        raise ConfigError(
            "Report",
            "error",
            f"is {data.get('error')!r}, but outcome {data['outcome']!r} needs the error it ended on.",
            "pass a Report record as Report.to_json() writes it.",
        )
    data = {**_migrations.upgrade("Report", dict(data), version), "schema_version": SCHEMA_VERSION}  # now of today's
    return typing.cast("Report", _build(cls, data))  # not None: data is a dict


def scenario_of_schema_1(data: dict[str, Any]) -> dict[str, Any]:
    """A schema-1 Report (`_migrations`, Report 2), whose `scenario` was the Scenario's own dict, with the
    ScenarioRecord schema 2 reads in its place."""
    scen = data.get("scenario")
    if isinstance(scen, dict) and "measured" not in scen and "config" not in scen:
        data["scenario"] = _record_of(scen)
    return data


# The AC modes that put blocks into checkpoints (a memory budget and remat's regions do not).
_WRAPPING_MODES = ("full", "reentrant", "selective_op", "selective_layer", "per_submodule", "custom", "policy_dict")


def observations_of_schema_2(data: dict[str, Any]) -> dict[str, Any]:
    """A Report written before the step recorded what the cases are now matched by (`_migrations`, Report 3), with
    each such observation read off what the record does hold — its outcome, graphs and the configuration it ran:
    the packages its stack's model is made of; whether its graphs went through AOTAutograd (its backend); the
    activation budget its AC mode set; the checkpoints that ran eagerly (a fallback to eager of a wrapping AC mode's
    compile(AC(x)) cells: the regions without graphs). A record that has a field keeps it."""
    scen, comp = data.get("scenario"), data.get("compile")
    config = scen.get("config") if isinstance(scen, dict) else None
    if not isinstance(scen, dict) or not isinstance(config, dict) or not isinstance(comp, dict):
        return data  # measured as it came (no configuration to read), or not a record: nothing to infer
    comp = dict(comp)
    ac: dict[str, Any] = config["ac"] if isinstance(config.get("ac"), dict) else {}
    stack = config.get("stack", "toolkit")
    data = {**data, "compile": comp}
    data.setdefault("packages", [stack] if isinstance(stack, str) else [])
    if "aot_autograd" not in comp:
        backend = scen.get("backend")  # the eager backend never goes through AOTAutograd, compiled or failed
        eager = comp.get("requested") and backend == "eager"
        comp["aot_autograd"] = False if eager else (backend != "eager") if comp.get("graphs") else None
    if "memory_budget" not in comp:
        budget = ac.get("memory_budget") if ac.get("mode") == "memory_budget" else None
        comp["memory_budget"] = budget if isinstance(budget, (int, float)) and budget < 1.0 else None
    if "eager_checkpoints" not in comp:
        wraps = ac.get("mode") in _WRAPPING_MODES
        compiled_outside = "compile(AC(x))" in (comp.get("orders") or {}).values()
        fell_back = bool(comp.get("fell_back_to_eager")) and wraps and compiled_outside
        comp["eager_checkpoints"] = list(comp.get("regions_without_graphs") or ()) if fell_back else []
    return data


def _record_of(d: dict[str, Any]) -> dict[str, Any]:
    if d.get("measured") == "user module" or "model" not in d:
        return {"name": d.get("name", ""), "measured": "module", "ac_mode": "unknown"}
    comp = d.get("compile") or {}
    scope = comp.get("scope", "none")
    scope = scope if isinstance(scope, str) else ",".join(scope)
    recipe = d.get("recipe")
    return {
        "name": d.get("name", ""),
        "measured": "scenario",
        "recipe": recipe,
        "ac_mode": recipe_ac_mode(recipe) if recipe else (d.get("ac") or {}).get("mode", "none"),
        "compile_scope": "recipe" if recipe else scope,
        "backend": d.get("recipe_backend", "aot_eager")
        if recipe
        else (comp.get("backend", "aot_eager") if scope != "none" else "eager"),
        "config": d,
    }


def plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (tuple, list)):
        return [plain(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and obj != obj:
        return None  # NaN is not JSON
    return obj


@functools.cache
def _hints(cls: type) -> tuple[dict[str, Any], tuple[dataclasses.Field[Any], ...]]:
    """A Report class's resolved field types and fields, once per class (resolving them is most of reading a
    results.jsonl)."""
    return typing.get_type_hints(cls), dataclasses.fields(cls)


def _build(cls: type, data: Any, where: str = "") -> Any:
    if data is None:
        return None
    where = where or cls.__name__
    if not isinstance(data, dict):
        raise _not_schema(where, data, "an object")
    hints, fields = _hints(cls)
    kwargs = {}
    for f in fields:
        if f.name not in data:
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


_MAX_COUNT = 1 << 63
"""Every integer a Report holds is a count, a size in bytes, a rank or a line: from 0 to what an int64 holds."""


def _not_schema(where: str, value: Any, what: str) -> ConfigError:
    owner, _, field_ = where.partition(".")
    shown = repr(value) if not isinstance(value, int) or abs(value) < 10**20 else f"a {len(str(value))}-digit number"
    return ConfigError(owner, field_, f"{shown[:80]} is not {what}.", "pass a record as Report.to_json() writes it.")


def _convert(tp: Any, value: Any, where: str) -> Any:
    """`value` read as type `tp`, or a ConfigError naming the field (`Saved.total_bytes`): the one check of a
    Report's schema, so that a record read from a file is what a measurement would have written (a string where bytes
    belong, a negative or 300-digit count, a list where a table belongs, a kind or outcome that is none of its type's
    values are refused, not shown as if measured)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if value is None:
        if tp is float:
            return float("nan")  # NaN is written as null (JSON has no NaN)
        if (origin is typing.Union or origin is types.UnionType) and type(None) in args or tp is Any:
            return None
        raise _not_schema(where, value, "a value (this field is never null in a record)")
    if dataclasses.is_dataclass(tp):
        return _build(typing.cast(type, tp), value, where)  # a field's type: a class, never an instance
    if origin is typing.Union or origin is types.UnionType:
        for a in args:
            if a is type(None):
                continue
            return _convert(a, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise _not_schema(where, value, "a list")
        inner = args[0] if args else Any
        return tuple(_convert(inner, v, f"{where}[]") for v in value)
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise _not_schema(where, value, "an object")
        return {k: _convert(args[1], v, f"{where}[]") for k, v in value.items()} if args else dict(value)
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in args):  # 1 == True, but 1 is no such value
            raise _not_schema(where, value, f"one of {', '.join(map(repr, args))}")
        return value
    if tp is bool and not isinstance(value, bool):
        raise _not_schema(where, value, "true or false")
    if tp is int and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < _MAX_COUNT):
        raise _not_schema(where, value, f"a count from 0 to {_MAX_COUNT - 1}")
    if tp is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise _not_schema(where, value, "a number")
    if tp is str and not isinstance(value, str):
        raise _not_schema(where, value, "text")
    return value
