"""The registry of training stacks a Scenario can drive (`Stack`, stacks/base.py): the toolkit's own, torchtitan's, and
Hugging Face transformers'. A stack's module is imported when first asked for, never by `import toolkit`."""

from __future__ import annotations

import importlib

from .base import Built, Stack

_MODULES: dict[str, str] = {
    "toolkit": "toolkit",
    "torchtitan": "torchtitan",
    "transformers": "transformers",
}
"""Stack name → its module in this package, which defines `STACK`. Adding a stack is a module and a line here."""

STACKS: tuple[str, ...] = tuple(_MODULES)


def get(name: str) -> Stack:
    """The stack called `name` (KeyError for another name: `Scenario` checks the name first)."""
    return importlib.import_module(f"{__name__}.{_MODULES[name]}").STACK


def of_block(block: str) -> str:
    """The stack whose matrix block `block` is (`titan:qwen3_moe` → "torchtitan"; no known prefix → "toolkit")."""
    prefix = block.split(":", 1)[0]
    return next((name for name in STACKS if name != "toolkit" and get(name).cell_prefix == prefix), "toolkit")


__all__ = ["STACKS", "Built", "Stack", "get", "of_block"]
