"""torchtitan main's activation checkpointing, applied from outside the model: each block's `forward` replaced by `torch_remat.checkpoint`, its weight-holding modules declared as regions that are kept or recomputed by name.

torchtitan main declares its regions in model code (`remat.region(...)` around every `Linear`, grouped matmul and
the routing decision, docs/remat.md). The toolkit's models are plain torch, so the same declarations are made
here, per module: the region of `attention.wq` is that module's call. Nothing in the model's classes changes;
`remove_remat` deletes the instance attributes again.
"""

from __future__ import annotations

import fnmatch
import functools
from typing import Any

import torch
from torch import nn

from .. import compat
from .._config import ConfigError
from .naming import RECOMPUTES_FORWARD, canonical_name

# Always kept, whatever the policy: torchtitan main keeps the routing decision (the `routing_decision` region)
# so that recompute never re-routes tokens (the answer to C11).
ALWAYS_KEPT = ("moe.router",)


def _is_norm(m: nn.Module) -> bool:
    return "norm" in type(m).__name__.lower()


def regions(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """`(name relative to the block, module)` of the regions remat declares in `block`: the router, and every
    module that holds weights itself (Linear layers, expert weight banks) outside it, norms excepted (torchtitan
    declares none for norms: they are cheap to recompute)."""
    out: list[tuple[str, nn.Module]] = []
    for fqn, m in block.named_modules():
        name = canonical_name(fqn)
        if not name:
            continue
        if name in ALWAYS_KEPT:
            out.append((name, m))
            continue
        if any(name.startswith(k + ".") for k in ALWAYS_KEPT):
            continue
        if any(True for _ in m.parameters(recurse=False)) and not _is_norm(m):
            out.append((name, m))
    return out


def kept(name: str, save: tuple[str, ...], recompute: tuple[str, ...]) -> bool:
    """Does the policy keep region `name`? `recompute` patterns win over `save` ones; the router is always kept."""
    if name in ALWAYS_KEPT:
        return True
    if any(fnmatch.fnmatchcase(name, p) for p in recompute):
        return False
    return any(fnmatch.fnmatchcase(name, p) for p in save)


def check_patterns(cfg: Any, names: set[str]) -> None:
    """A pattern without a wildcard that names no region is a typo, not a policy: refuse it, listing the regions."""
    for field in ("save_regions", "recompute_regions"):
        for p in getattr(cfg, field):
            if not any(ch in p for ch in "*?[") and p not in names:
                raise ConfigError("ACConfig", field, f"{p!r} names no region of this model's blocks.",
                                  f"use one of {', '.join(sorted(names)) or '(none)'} or a pattern such as "
                                  "'attention.*'.")


class TorchRNGState:
    """A `torch_remat.RecomputeStateHook` for torch's own generators (CPU, and CUDA where it is used): what
    `preserve_rng_state=True` means under remat."""

    def snapshot(self) -> Any:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda

    def restore(self, state: Any) -> None:
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def _region_call(remat: Any, original: Any, name: str, keep: bool):
    """The module's call inside a region named `name`; a kept region's outputs are marked as needed by recompute,
    since the consumers are bare ops of the parent's forward that no region declares (without the mark they read a
    placeholder in recompute: case C32)."""
    wrapped = remat.region(original, name, recompute=not keep)

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        out = wrapped(*args, **kwargs)
        if keep:
            tensors = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
            if tensors:
                remat.recompute_needs_tensor(*tensors)
        return out
    return call


def apply_remat(block: nn.Module, block_name: str, cfg: Any, undo: list[tuple[str, str]]) -> None:
    """Replace `block.forward` by a torch_remat checkpoint named `block_name` and declare its regions, appending
    `("patched", canonical name)` to `undo` for each module as its `forward` is replaced — so that a failure
    half-way (remat refusing the checkpoint) leaves nothing patched once `undo` is replayed."""
    remat = compat.remat()
    declared = regions(block)
    for name, m in [("", block)] + declared:
        if "forward" in m.__dict__:
            raise RuntimeError(f"{block_name}{'.' + name if name else ''} already has its own `forward` (a remat "
                               "applied by hand?); toolkit.apply_ac would replace it. Remove it first.")
    for name, m in declared:
        m.forward = _region_call(remat, m.forward, name, kept(name, cfg.save_regions, cfg.recompute_regions))
        undo.append(("patched", f"{block_name}.{name}"))
    hooks = (TorchRNGState(),) if cfg.preserve_rng_state else ()
    checkpointed = remat.checkpoint(region_name=block_name, determinism_check=cfg.determinism_check,
                                    recompute_state_hooks=hooks)(block.forward)
    block.forward = checkpointed
    setattr(block, RECOMPUTES_FORWARD, True)
    undo.append(("patched", block_name))


def remove_remat(module: nn.Module) -> None:
    """Undo `apply_remat` on one module (the block or a region): its class's `forward` is used again."""
    module.__dict__.pop("forward", None)
    module.__dict__.pop(RECOMPUTES_FORWARD, None)


def plan(block: nn.Module, cfg: Any) -> dict[str, bool]:
    """Region name → kept, for `block` under `cfg` (what `apply_remat` would declare)."""
    return {name: kept(name, cfg.save_regions, cfg.recompute_regions) for name, _ in regions(block)}


__all__ = ["apply_remat", "remove_remat", "regions", "plan", "kept", "ALWAYS_KEPT", "TorchRNGState"]
