"""Named functions of the model compiled on their own, as torchtitan main's `@local_compile`.

Named functions of the model that can be compiled on their own, as torchtitan main's `@local_compile`
(distributed/local_compile.py at 2350f753348e).

Each decorated function calls its reference (eager) implementation until `bind` swaps in a compiled one
(`torch.compile(fn, fullgraph=True, **kwargs)`; `fullgraph=False` is refused, as main refuses it); `unbind` puts
the reference back. The binding is process-wide, as in main (its `apply_local_compile` says so): every model of
the toolkit calls the same `swiglu`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable


class _Slot:
    """One registered function: its reference implementation, its compile options and what it calls now."""

    def __init__(self, name: str, reference: Callable[..., Any], kwargs: dict[str, Any]):
        self.name, self.reference, self.kwargs = name, reference, kwargs
        self.fn = reference


_REGISTRY: dict[str, _Slot] = {}


def local_compile(name: str, **compile_kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn` under `name`; `compile_kwargs` (e.g. `recompile_limit=16`) go to its torch.compile."""
    if compile_kwargs.pop("fullgraph", True) is not True:
        raise ValueError("local_compile requires fullgraph=True: each function is one complete compiled region.")

    def decorate(reference: Callable[..., Any]) -> Callable[..., Any]:
        slot = _REGISTRY[name] = _Slot(name, reference, compile_kwargs)

        @functools.wraps(reference)
        def call(*args: Any, **kwargs: Any) -> Any:
            return slot.fn(*args, **kwargs)

        call.local_compile_name = name  # type: ignore[attr-defined]
        return call

    return decorate


def names() -> tuple[str, ...]:
    """Every registered name."""
    return tuple(sorted(_REGISTRY))


def options(name: str) -> dict[str, Any]:
    """The torch.compile options `name` was registered with (beyond fullgraph=True)."""
    return dict(_REGISTRY[name].kwargs)


def bind(regions: tuple[str, ...], **compile_kwargs: Any) -> dict[str, Callable[..., Any]]:
    """Compile the functions named in `regions` (`compile_kwargs`, e.g. the backend, added to each one's own
    options) and make every call use them; returns name → compiled function. Unknown names are refused."""
    import torch

    unknown = [r for r in regions if r not in _REGISTRY]
    if unknown:
        raise ValueError(f"unknown local compile regions {unknown}; registered: {', '.join(names())}")
    out = {}
    for r in regions:
        slot = _REGISTRY[r]
        slot.fn = out[r] = torch.compile(slot.reference, fullgraph=True, **{**slot.kwargs, **compile_kwargs})
    return out


def unbind(regions: tuple[str, ...] | None = None) -> None:
    """Every call of the named functions (all when None) runs the reference implementation again."""
    for r in regions if regions is not None else names():
        if r in _REGISTRY:
            _REGISTRY[r].fn = _REGISTRY[r].reference


def bound() -> tuple[str, ...]:
    """The names whose calls run a compiled function now."""
    return tuple(n for n in names() if _REGISTRY[n].fn is not _REGISTRY[n].reference)


__all__ = ["local_compile", "bind", "unbind", "bound", "names", "options"]
