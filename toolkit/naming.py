"""Stable module names: see through `CheckpointWrapper` and `OptimizedModule` so `layers.0.moe.router.gate` never changes."""

from __future__ import annotations

from typing import Iterator

from torch import nn

# Path segments that wrappers insert into `named_modules()` names.
WRAPPER_SEGMENTS = ("_checkpoint_wrapped_module", "_orig_mod")


def is_wrapper(m: nn.Module) -> bool:
    """True for the wrappers whose presence must not change a module's name or type test."""
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import ActivationWrapper

    return isinstance(m, (ActivationWrapper, OptimizedModule))


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
            raise KeyError(f"no module named {name!r} (stopped at {part!r}); known children: "
                           f"{', '.join(k for k in m._modules)}")
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
        raise KeyError(f"no module named {name!r}; {'.'.join(head) or 'the model'} has children "
                       f"{', '.join(parent._modules)}")
    return parent, last, parent._modules[last]


def wrapper_chain(m: nn.Module) -> list[str]:
    """Names of the wrappers around a module, outermost first (e.g. `['OptimizedModule', 'CheckpointWrapper']`)."""
    chain = []
    while is_wrapper(m):
        chain.append(type(m).__name__)
        m = wrapped_child(m)
    return chain
