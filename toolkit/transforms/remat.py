"""torchtitan main's AC: each block's `forward` a `torch_remat.checkpoint` over its declared regions.

torchtitan main's activation checkpointing: each block's `forward` replaced by `torch_remat.checkpoint`, choosing among
the remat regions the model's code declares.

As main's `apply_activation_remat` (distributed/activation_checkpoint.py at 03d9819f3416) does: every module of a
block is told its name relative to the block and the save / recompute patterns (`configure_remat_regions`), then
`block.forward = remat.checkpoint(region_name="layers.N", determinism_check=...)(block.forward)`. The regions
themselves are declared where the model computes (`toolkit/models/regions.py`): `<fqn>.linear`,
`<fqn>.grouped_mm`, `<fqn>.inner_attention`, and the fixed kept `routing_decision`, `ffn_residual`,
`moe.shared_add`. A model that declares none is fully recomputed, as in main. `remove_remat` undoes both steps.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch
from torch import nn

from .. import compat
from .._config import ConfigError, warn_input
from ..models import regions
from .naming import RECOMPUTES_FORWARD

# Kept under every policy, whatever the patterns: main declares them `recompute=False` in its code (the routing
# decision, so that recompute never re-routes, C11; the trailing adds, which save nothing and so cost nothing).
FIXED = ("routing_decision", "ffn_residual", "shared_add")
# torchtitan main's fixed policies, unchanged: `SelectiveActivationRematConfig` keeps every declared region but the
# routed experts' w13 grouped projection (its saved activations scale with top-k); `FullActivationRematConfig`
# keeps none but the regions the model code always keeps.
REMAT_SELECTIVE: dict[str, tuple[str, ...]] = {"save_regions": ("*",), "recompute_regions": ("*routed_experts.w13.*",)}
REMAT_FULL: dict[str, tuple[str, ...]] = {"save_regions": (), "recompute_regions": ()}


def is_fixed(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in FIXED


def kept(name: str, save: tuple[str, ...], recompute: tuple[str, ...]) -> bool:
    """Does the policy keep region `name`? main's rule: a recompute pattern beats a save pattern; fixed regions are
    always kept."""
    return is_fixed(name) or not regions.should_recompute(name, save, recompute)


def check_patterns(cfg: Any, names: set[str]) -> None:
    """A pattern without a wildcard that names no region is a typo, not a policy: refuse it, listing the regions. A
    wildcard that matches none is run as main runs it (ignored) but warned about — except the patterns of main's
    own fixed policies, which a dense model legitimately has nothing to match."""
    for field in ("save_regions", "recompute_regions"):
        for p in getattr(cfg, field):
            if not any(ch in p for ch in "*?["):
                if p not in names:
                    raise ConfigError(
                        "ACConfig",
                        field,
                        f"{p!r} names no region of this model's blocks.",
                        f"use one of {', '.join(sorted(names)) or '(none)'} or a pattern such as 'attention.*'.",
                    )
            elif not any(fnmatch.fnmatchcase(n, p) for n in names) and p not in REMAT_SELECTIVE[field]:
                warn_input(
                    "ACConfig",
                    field,
                    f"the pattern {p!r} matches no region of this model's blocks, so it keeps or recomputes nothing.",
                    f"use a pattern matching some of {', '.join(sorted(names)[:6]) or '(none)'}, …, or drop it.",
                )


class TorchRNGState:
    """A `torch_remat.RecomputeStateHook` for torch's own generators (CPU, and CUDA where it is used): what the
    toolkit's `preserve_rng_state=True` means under its generic remat mode (main refuses the flag)."""

    def snapshot(self) -> Any:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
        return torch.get_rng_state(), cuda

    def restore(self, state: Any) -> None:
        cpu, cuda = state
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def apply_remat(block: nn.Module, block_name: str, cfg: Any, undo: list[tuple[str, str]]) -> None:
    """Configure `block`'s declared regions with `cfg`'s patterns and replace `block.forward` by a torch_remat
    checkpoint named `block_name`. `("patched", block_name)` goes into `undo` as soon as the regions are
    configured, so that a failure after it (torch_remat refusing the checkpoint) is rolled back too."""
    remat = compat.remat()
    if "forward" in block.__dict__:
        raise RuntimeError(
            f"{block_name} already has its own `forward` (a remat applied by hand?); "
            "toolkit.apply_ac would replace it. Remove it first."
        )
    regions.configure(block, cfg.save_regions, cfg.recompute_regions)
    undo.append(("patched", block_name))
    hooks = (TorchRNGState(),) if cfg.preserve_rng_state else ()
    block.forward = remat.checkpoint(
        region_name=block_name, determinism_check=cfg.determinism_check, recompute_state_hooks=hooks
    )(block.forward)
    setattr(block, RECOMPUTES_FORWARD, True)


def remove_remat(module: nn.Module) -> None:
    """Undo `apply_remat` on one block: its class's `forward` is used again and its regions are bare calls."""
    module.__dict__.pop("forward", None)
    module.__dict__.pop(RECOMPUTES_FORWARD, None)
    regions.unconfigure(module)


def region_names(block: nn.Module) -> list[str]:
    """The regions `block`'s code declares, relative to the block."""
    return regions.declared(block)


def plan(block: nn.Module, cfg: Any) -> dict[str, bool]:
    """Region name → kept, for `block` under `cfg` (what its declared regions will do once configured)."""
    return {name: kept(name, cfg.save_regions, cfg.recompute_regions) for name in region_names(block)}


__all__ = ["apply_remat", "remove_remat", "region_names", "plan", "kept", "is_fixed", "FIXED", "TorchRNGState"]
