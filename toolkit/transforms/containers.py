"""Where a model's repeated blocks are: the unit AC and per-block compile work on, whoever built the model."""

from __future__ import annotations

import weakref

from torch import nn

from .._config import ConfigError
from .naming import get_module, named_modules, unwrap

_NAMED_BLOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Model (unwrapped) → the canonical name of its blocks' container, where a stack said it (`name_blocks`)."""


def name_blocks(model: nn.Module, container: str | None) -> None:
    """Say where `model`'s blocks are (the canonical name of their ModuleList / ModuleDict), for a model whose blocks
    `block_container`'s own rule would not pick (a user's `--blocks CLASS`); None forgets it."""
    root = unwrap(model)
    if container is None:
        _NAMED_BLOCKS.pop(root, None)
        return
    found = get_module(root, container)
    if not isinstance(found, (nn.ModuleDict, nn.ModuleList)):
        raise ConfigError(
            "model",
            "blocks",
            f"{container!r} is a {type(found).__name__}, not a ModuleList / ModuleDict of blocks.",
            "name the container of the repeated blocks.",
        )
    _NAMED_BLOCKS[root] = container


def repeated_containers(model: nn.Module, cls_name: str | None = None) -> list[tuple[str, nn.Module]]:
    """`(canonical name, container)` of each ModuleList / ModuleDict of `model` whose children are all one class
    (`cls_name` when given), the most parameters first: the first is where FSDP's auto-wrap would find the blocks
    (transformers' `model.layers`, not the experts inside each layer)."""
    found = []
    for name, m in named_modules(model):
        if isinstance(m, (nn.ModuleDict, nn.ModuleList)) and len(m):
            kinds = {type(unwrap(c)).__name__ for c in m.children()}
            if len(kinds) == 1 and (cls_name is None or kinds == {cls_name}):
                found.append((name, m))
    return sorted(found, key=lambda nm: -sum(p.numel() for p in nm[1].parameters()))


def block_container(model: nn.Module) -> tuple[str, nn.Module]:
    """`(canonical name, container)` of the model's repeated blocks, the unit AC and per-block compile work on:
    `model.layers` (the toolkit's and torchtitan's models), the container a stack named (`name_blocks`), else the
    first of `repeated_containers`."""
    root = unwrap(model)
    named = _NAMED_BLOCKS.get(root)
    if named is not None:
        return named, get_module(root, named)
    layers = getattr(root, "layers", None)
    if isinstance(layers, (nn.ModuleDict, nn.ModuleList)):
        return "layers", layers
    found = repeated_containers(root)
    if not found:
        raise ConfigError(
            "model",
            "layers",
            f"{type(root).__name__} has no ModuleList / ModuleDict of repeated blocks (and no `layers`).",
            "keep the blocks in an nn.ModuleList (as `model.layers` or anywhere), or build the model with "
            "toolkit.build_model.",
        )
    return found[0]


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """`(key, block)` of the model's blocks (`block_container`), blocks unwrapped; each one's canonical name is
    `f"{block_container(model)[0]}.{key}"`."""
    return [(k, unwrap(b)) for k, b in block_container(model)[1].named_children()]
