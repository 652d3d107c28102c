"""Named functions of the model compiled on their own, as torchtitan main's `@local_compile`.

Named functions of the model that can be compiled on their own, as torchtitan main's `@local_compile`
(distributed/local_compile.py at 2350f753348e).

Each decorated function calls its reference (eager) implementation unless a block runs under `bound_to` with compiled
ones (`compile_functions`: `torch.compile(fn, fullgraph=True, **kwargs)`; `fullgraph=False` is refused, as main
refuses it). main binds process-wide (its `apply_local_compile` says so); here a model's compiled functions are
its own (kept in its record by `apply_compile`) and bound only while one of its steps runs (`torch_settings`), so
that two models in one process never call each other's.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator


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


def compile_functions(regions: tuple[str, ...], **compile_kwargs: Any) -> dict[str, Callable[..., Any]]:
    """Compile the functions named in `regions` (`compile_kwargs`, e.g. the backend, added to each one's own
    options); returns name → compiled function, bound to nothing yet. Unknown names are refused."""
    import torch

    unknown = [r for r in regions if r not in _REGISTRY]
    if unknown:
        raise ValueError(f"unknown local compile regions {unknown}; registered: {', '.join(names())}")
    return {
        r: torch.compile(_REGISTRY[r].reference, fullgraph=True, **{**_REGISTRY[r].kwargs, **compile_kwargs})
        for r in regions
    }


@contextlib.contextmanager
def bound_to(functions: dict[str, Callable[..., Any]]) -> Iterator[None]:
    """For the block, every call of the named functions runs the compiled one given; what each called before is put
    back when the block ends."""
    before = {name: _REGISTRY[name].fn for name in functions}
    try:
        for name, fn in functions.items():
            _REGISTRY[name].fn = fn
        yield
    finally:
        for name, fn in before.items():
            _REGISTRY[name].fn = fn


def bound() -> tuple[str, ...]:
    """The names whose calls run a compiled function now."""
    return tuple(n for n in names() if _REGISTRY[n].fn is not _REGISTRY[n].reference)


__all__ = ["local_compile", "compile_functions", "bound_to", "bound", "names", "options"]
