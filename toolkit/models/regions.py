"""Remat regions declared in the model code, as torchtitan main declares them.

Remat regions declared in the model code, as torchtitan main declares them: plain calls unless a torch_remat policy is
configured on the module.

torchtitan main (`docs/remat.md` and `protocols/module.py` at 03d9819f3416) wraps each Linear's projection, each
grouped matmul and each attention kernel in `torch_remat.region(fn, "<fqn>.<local>", recompute=...)`, where
`<fqn>` is the module's name relative to its transformer block and `recompute` is decided by fnmatch on the save
and recompute patterns that `configure_remat_regions` wrote on every module (a recompute pattern wins). The
toolkit's modules do the same through the functions below. Models stay torch only: torch_remat is imported when a
block is configured, and until `configure` runs on a block every call here is the bare call (no torch_remat code runs,
so AC modes other than remat, compile and the tests' exact byte and op counts see the model as it always was).
"""

from __future__ import annotations

import fnmatch
from typing import Any, Callable

import torch
from torch import nn

from .. import compat

# Per-module settings `configure` writes (instance attributes, so a model that is never configured has none), and the
# torch_remat functions a configured module calls: found by `compat`'s one rule for a usable torch_remat when the model
# is configured and kept on the model, not in a process-wide cache (functions: a model's deep copy calls the same).
_FQN, _SAVE, _RECOMPUTE, _API = "_remat_module_fqn", "_remat_save_patterns", "_remat_recompute_patterns", "_remat_api"
# name → recompute for every region the block declares, worked out once by `configure`: Dynamo traces a dict
# look-up, not fnmatch's regex cache (a whole compiled remat block would graph-break on it).
_DECISIONS = "_remat_decisions"


def active(module: nn.Module) -> bool:
    """A policy is configured on `module` (by `configure`, i.e. ACConfig.of(mode="remat"))."""
    return _SAVE in module.__dict__


def region_name(module: nn.Module, local: str) -> str:
    """`<fqn>.<local>`, the fqn relative to the configured block (main's `remat_region_name`)."""
    fqn = module.__dict__.get(_FQN, "")
    return qualified(fqn, local)


def should_recompute(name: str, save: tuple[str, ...], recompute: tuple[str, ...]) -> bool:
    """Main's rule (`Module.remat_should_recompute`): recomputed unless a save pattern matches, and whenever a
    recompute pattern matches."""
    return not any(fnmatch.fnmatchcase(name, p) for p in save) or any(fnmatch.fnmatchcase(name, p) for p in recompute)


def region(module: nn.Module, name: str | Callable[[str], str], fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as the region `<fqn>.<name>`, saved or recomputed as the module's patterns say. `name` may be a
    function of the module's fqn instead (a module that names its regions after its parent)."""
    if not active(module):
        return fn(*args)
    full = name(module.__dict__.get(_FQN, "")) if callable(name) else region_name(module, name)
    recompute = module.__dict__[_DECISIONS].get(full)
    if recompute is None:  # a name the module did not list in `remat_regions`
        recompute = should_recompute(full, module.__dict__[_SAVE], module.__dict__[_RECOMPUTE])
    return module.__dict__[_API]["region"](fn, full, recompute=recompute)(*args)


def kept(module: nn.Module, name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` as a fixed `recompute=False` region called `name` as given (main's `routing_decision`,
    `ffn_residual`, `moe.shared_add`): saved under every policy, skipped in replay."""
    if not active(module):
        return fn(*args)
    return module.__dict__[_API]["region"](fn, name, recompute=False)(*args)


def needs(module: nn.Module, *tensors: torch.Tensor) -> None:
    """`torch_remat.recompute_needs_tensor`: a bare op is about to read these region outputs, so a kept region
    must keep them for replay (main puts the call on the consumer side, right before the bare op)."""
    if active(module):
        module.__dict__[_API]["needs"](*tensors)


def replaying(module: nn.Module) -> bool:
    """torch_remat is replaying the block in backward. Eager only: a compiled function has no eager replay, and
    torch 2.13's Dynamo cannot trace the phase read."""
    return active(module) and not torch.compiler.is_compiling() and module.__dict__[_API]["recomputing"]()


def qualified(fqn: str, local: str) -> str:
    return f"{fqn}.{local}" if fqn else local


def declared(block: nn.Module) -> list[str]:
    """Every region name `block` declares, modules in `named_modules` order (each module that declares regions
    lists them with `remat_regions(fqn)`, given its fqn relative to `block`)."""
    out: list[str] = []
    for fqn, m in block.named_modules():
        own = getattr(m, "remat_regions", None)
        if callable(own):
            out.extend(own(fqn))
    return out


def configure(block: nn.Module, save: tuple[str, ...], recompute: tuple[str, ...]) -> None:
    """Main's `configure_remat_regions`: every module of `block` gets its fqn relative to `block` and the
    patterns (and the torch_remat module its regions call: `compat.remat()`, None refused)."""
    api = compat.remat()
    if api is None:
        raise RuntimeError(compat.blind_spot("torch_remat"))
    calls = {"region": api.region, "needs": api.recompute_needs_tensor, "recomputing": api.is_recomputing}
    decisions = {name: should_recompute(name, tuple(save), tuple(recompute)) for name in declared(block)}
    for fqn, m in block.named_modules():
        m.__dict__[_FQN] = fqn
        m.__dict__[_SAVE] = tuple(save)
        m.__dict__[_RECOMPUTE] = tuple(recompute)
        m.__dict__[_DECISIONS] = decisions
        m.__dict__[_API] = calls


def unconfigure(block: nn.Module) -> None:
    """Undo `configure`: every region is a bare call again."""
    for m in block.modules():
        for key in (_FQN, _SAVE, _RECOMPUTE, _DECISIONS, _API):
            m.__dict__.pop(key, None)


__all__ = [
    "active",
    "region",
    "kept",
    "needs",
    "replaying",
    "declared",
    "configure",
    "unconfigure",
    "region_name",
    "should_recompute",
]
