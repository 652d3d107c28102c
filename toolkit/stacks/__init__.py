"""The registry of training stacks a Scenario can drive (`Stack`, stacks/base.py): the toolkit's own, torchtitan's,
Hugging Face transformers', and a user's own model (`user`: its build(), the toolkit's transforms). A stack's module is
imported when first asked for, never by `import toolkit`."""

from __future__ import annotations

import importlib
from typing import Literal, overload

from .. import _extras
from .._extras import Extra
from .base import Built, Stack, StackConfig

_MODULES: dict[str, tuple[str, Extra | None]] = {
    "toolkit": ("toolkit", None),
    "torchtitan": (
        "torchtitan",
        Extra(
            "torchtitan",
            'pip install -e ".[torchtitan]"  (or .ci/run\'s --no-deps route, README)',
            "torchtitan 0.3.0's own models and transforms (Scenario(stack='torchtitan'), notebook 08)",
        ),
    ),
    "transformers": (
        "transformers",
        Extra(
            "transformers",
            'pip install -e ".[transformers]"',
            "Hugging Face transformers' own models, activation checkpointing and compile "
            "(Scenario(stack='transformers'), matrix --stack transformers)",
        ),
    ),
    "user": ("user", None),
}
"""Stack name → (its module in this package, which defines `STACK`; the optional package that brings it, with its
install line, or None). Adding a stack is a module and a line here (docs/stacks.md: and, for its models in the matrix
and the Explorer, a line in each of `analysis/blocks.py`, `analysis/grids.py` and `notebook/models.py`). Read without
importing torch (the CLI's stamp)."""

STACKS: tuple[str, ...] = tuple(_MODULES)


def get(name: str) -> Stack:
    """The stack called `name` (KeyError for another name: `Scenario` checks the name first)."""
    return importlib.import_module(f"{__name__}.{_MODULES[name][0]}").STACK


@overload
def extra_of(name: Literal["torchtitan", "transformers"]) -> Extra: ...  # stacks `_MODULES` lists with an Extra
@overload
def extra_of(name: str) -> Extra | None: ...
def extra_of(name: str) -> Extra | None:
    """The optional package that brings stack `name`, with its install line (its registry line), or None for the
    toolkit's own. Kept here, not in `_extras.EXTRAS`, so that adding a stack touches `stacks/` alone."""
    return _MODULES[name][1]


def extras() -> dict[str, Extra]:
    """Every optional package the toolkit can use: `_extras.EXTRAS` and each stack's own (`extra_of`)."""
    own = {e.module: e for e in (extra_of(name) for name in STACKS) if e is not None}
    return {**_extras.EXTRAS, **own}


def reason(module: str) -> str:
    """`_extras.reason` for any optional package, a stack's included."""
    return _extras.reason(module, extras())


def missing(modules: tuple[str, ...] | list[str]) -> str | None:
    """`_extras.missing` for any optional package, a stack's included."""
    return _extras.missing(modules, extras())


__all__ = [
    "STACKS",
    "Built",
    "Stack",
    "StackConfig",
    "extra_of",
    "extras",
    "get",
    "missing",
    "reason",
]
