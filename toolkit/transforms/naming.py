"""Stable module names: see through CheckpointWrapper and OptimizedModule, the wrapper checks' home.

Stable module names and the one home of wrapper checks: see through `CheckpointWrapper` and `OptimizedModule` so
`layers.0.moe.router.gate` never changes.
"""

from __future__ import annotations

from typing import Iterator, cast

from torch import nn

from .. import compat
from .._config import check_instance

# Path segments that wrappers insert into `named_modules()` names.
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod")

# torchtitan's marker for modules whose forward recomputes in backward without a CheckpointWrapper (torch_remat
# replaces `forward` in place, PR #4159); the toolkit sets the same attribute when it applies remat.
RECOMPUTES_FORWARD = "_torchtitan_recomputes_forward"


def within(name: str, outer: str) -> bool:
    """`name` is the module `outer` or lies inside it, by canonical names ("" is the whole model): the one home of
    that rule (an AC region, a compile target, a probe's region, the experts a target covers)."""
    return outer == "" or name == outer or name.startswith(outer + ".")


def inside(name: str, outer: str) -> bool:
    """`name` lies strictly inside the module `outer` (not `outer` itself)."""
    return name != outer and within(name, outer)


def is_wrapper(m: nn.Module) -> bool:
    """True for the wrappers whose presence must not change a module's name or type test."""
    activation_wrapper, _ = compat.checkpoint_wrapper_classes()
    return isinstance(m, (activation_wrapper, compat.optimized_module_class()))


def is_checkpoint_wrapper(m: nn.Module) -> bool:
    return isinstance(m, compat.checkpoint_wrapper_classes()[1])


def recomputes_forward(m: nn.Module) -> bool:
    """The module's forward is re-run in backward: a CheckpointWrapper, or a module marked by remat."""
    return is_checkpoint_wrapper(m) or bool(getattr(m, RECOMPUTES_FORWARD, False))


def has_checkpoint(model: nn.Module) -> bool:
    """Any module of `model` recomputes its forward in backward (AC applied, by the toolkit or anyone)."""
    return any(recomputes_forward(m) for m in model.modules())


def is_compiled(m: nn.Module) -> bool:
    """`m` is a compile target: an OptimizedModule wrapper, compiled in place with `Module.compile()`, or with its
    `forward` compiled as a function."""
    return isinstance(m, compat.optimized_module_class()) or compat.in_place_compiled(m) or compat.forward_compiled(m)


def has_compiled(model: nn.Module) -> bool:
    return any(is_compiled(m) for m in model.modules())


def fsdp_units_inside(model: nn.Module, checkpointed: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """FSDP2 units lying strictly inside a compiled region or a checkpointed module (a checkpoint wrapper, a module
    remat marked, or one named in `checkpointed`), read off the model whoever built it: their hooks then run inside
    the region — Dynamo meets them while tracing it (C53), a recompute runs them again (C54). Keys
    `fsdp_in_compiled` and `fsdp_in_checkpoint` (the units' canonical names)."""
    names = module_names(model)
    units = [names[id(m)] for m in model.modules() if compat.is_fsdp_module(m)]
    compiled = {names[id(m)] for m in model.modules() if is_compiled(m)}
    ckpt = {names[id(m)] for m in model.modules() if recomputes_forward(m)} | set(checkpointed)
    return {
        "fsdp_in_compiled": tuple(u for u in units if any(inside(u, r) for r in compiled)),
        "fsdp_in_checkpoint": tuple(u for u in units if any(inside(u, c) for c in ckpt)),
    }


def wrapped_child(m: nn.Module) -> nn.Module:
    for seg in WRAPPER_SEGMENTS:
        inner = m._modules.get(seg)
        if inner is not None:
            return inner
    raise TypeError(f"{type(m).__name__} is not a known wrapper")


def unwrap(m: nn.Module) -> nn.Module:
    """The module under any stack of checkpoint / torch.compile wrappers."""
    while is_wrapper(m):
        m = wrapped_child(m)
    return m


def canonical_name(fqn: str) -> str:
    """`layers.0._checkpoint_wrapped_module.moe._orig_mod.router` → `layers.0.moe.router`."""
    return ".".join(p for p in fqn.split(".") if p and p not in WRAPPER_SEGMENTS)


def named_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """`(canonical name, unwrapped module)` for every real module, each once, wrappers skipped."""
    check_instance("named_modules", "model", model, nn.Module, "pass a torch.nn.Module.")
    seen: set[int] = set()
    for fqn, m in model.named_modules():
        if is_wrapper(m) or id(m) in seen:
            continue
        seen.add(id(m))
        yield canonical_name(fqn), m


def module_names(model: nn.Module) -> dict[int, str]:
    """`id(module) → canonical name`, for attributing work to modules (wrappers map to their inner module's name)."""
    names: dict[int, str] = {}
    for fqn, m in model.named_modules():
        names.setdefault(id(m), canonical_name(fqn))
    return names


def get_module(model: nn.Module, name: str) -> nn.Module:
    """Look a module up by canonical name; the result is unwrapped."""
    m = unwrap(model)
    if not name:
        return m
    for part in name.split("."):
        child = m._modules.get(part)
        if child is None:
            raise KeyError(
                f"no module named {name!r} (stopped at {part!r}); known children: {', '.join(k for k in m._modules)}"
            )
        m = unwrap(child)
    return m


def get_slot(model: nn.Module, name: str) -> tuple[nn.Module, str, nn.Module]:
    """`(parent, attribute, current occupant)` for a canonical name: the occupant may be a wrapper.

    The parent is the innermost real module holding the attribute, so replacing the occupant keeps the
    canonical name of everything below it.
    """
    if not name:
        raise KeyError("the root module has no parent slot")
    *head, last = name.split(".")
    parent = get_module(model, ".".join(head))
    if last not in parent._modules:
        raise KeyError(
            f"no module named {name!r}; {'.'.join(head) or 'the model'} has children {', '.join(parent._modules)}"
        )
    # `_modules` allows None (`register_module(name, None)`), which no slot the toolkit names holds.
    return parent, last, cast(nn.Module, parent._modules[last])


def wrapper_chain(m: nn.Module) -> list[str]:
    """Names of the wrappers around a module, outermost first (e.g. `['OptimizedModule', 'CheckpointWrapper']`)."""
    chain = []
    while is_wrapper(m):
        chain.append(type(m).__name__)
        m = wrapped_child(m)
    return chain


def model_packages(model: nn.Module) -> tuple[str, ...]:
    """The top-level packages whose classes make up `model`, torch's own left out: `("transformers",)` for a model
    transformers built, whoever built and called it; what a case about one package's code is matched by."""
    return tuple(sorted({type(m).__module__.split(".")[0] for m in model.modules()} - {"torch"}))
