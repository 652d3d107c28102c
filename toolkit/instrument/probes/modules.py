"""Module bookkeeping: forward hooks that keep the module stack, and the compiled regions' entries and exits."""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator, cast

from torch import nn

from ... import compat
from ...compat import tree_leaves
from ...transforms.naming import is_checkpoint_wrapper, is_compiled, is_wrapper, module_names
from .base import StepState


class Modules:
    """Hooks on every real module outside compiled regions (Dynamo traces hooks inside them, so none go there)."""

    def __init__(self, model: nn.Module, state: StepState):
        self.model = model
        self.state = state
        self.names = module_names(model)
        self.region_names: list[str] = []
        self.region_runs: Counter[tuple[str, str]] = Counter()
        """(region, phase) → calls."""
        self.compiled_reruns: Counter[str] = Counter()
        """Compiled regions whose forward ran again in backward (AC(compile(x)))."""

    def regions(self) -> dict[str, nn.Module]:
        return {self.names[id(m)]: m for m in self.model.modules() if is_compiled(m)}

    @contextlib.contextmanager
    def hooks(self) -> Iterator[None]:
        regions = self.regions()
        self.region_names = sorted(regions)
        handles, undo = [], []

        # Inside a region by object, not by name: a submodule that is also an attribute outside the region
        # (`self.mlp` beside `self.compiled = torch.compile(self.mlp)`) has a name outside it, yet Dynamo traces its
        # hooks, guards on the probes' state and compiles again in a recompute (a SAC cache key then misses: C7's
        # user model failed in backward under `tk.measure` alone).
        inside = {id(rm): {id(sub) for sub in rm.modules() if sub is not rm} for rm in regions.values()}

        def inside_region(m: nn.Module) -> bool:
            return any(id(m) in inside[id(rm)] for rm in regions.values() if rm is not m)

        for m in self.model.modules():
            name = self.names[id(m)]
            if is_compiled(m):
                if inside_region(m):
                    continue
                if compat.in_place_compiled(m):
                    # The cast types the lambda: mypy cannot infer one with a bound default against its context.
                    undo.append(
                        compat.wrap_in_place_compiled_call(
                            m,
                            cast(
                                "Callable[[Callable[..., Any]], Callable[..., Any]]",
                                lambda fn, _n=name: self._region_call(_n, fn),
                            ),
                        )
                    )
                else:
                    handles.append(m.register_forward_pre_hook(lambda mod, args, _n=name: self._enter(_n)))
                    handles.append(
                        m.register_forward_hook(lambda mod, args, out, _n=name: self._exit(_n), always_call=True)
                    )
                continue
            if inside_region(m) or (is_wrapper(m) and not is_checkpoint_wrapper(m)):
                continue
            if is_checkpoint_wrapper(m):
                handles.append(m.register_forward_pre_hook(lambda mod, args, _n=name: self._checkpoint_pre(_n, args)))
            else:
                handles.append(m.register_forward_pre_hook(lambda mod, args, _n=name: self.state.push(_n)))
            handles.append(
                m.register_forward_hook(lambda mod, args, out, _n=name: self.state.pop(_n), always_call=True)
            )
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            for u in undo:
                u()

    def _enter(self, name: str) -> None:
        state = self.state
        state.push(name)
        state.regions.append(name)
        if state.phase == "forward" and (state.frames or state.reentrant):
            state.orders.setdefault(name, "AC(compile(x))")  # entered inside a checkpoint's forward
        self.region_runs[(name, state.phase)] += 1
        if state.phase == "backward":
            self.compiled_reruns[name] += 1

    def _exit(self, name: str) -> None:
        state = self.state
        state.pop(name)
        if state.regions and state.regions[-1] == name:
            state.regions.pop()

    def _region_call(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self._exit(name)

        return call

    def _checkpoint_pre(self, name: str, args: Any) -> None:
        self.state.push(name)
        if self.state.phase == "forward":
            for t in tree_leaves(args):
                self.state.hold(t)

    def ran_forward(self) -> set[str]:
        return {name for (name, phase) in self.region_runs if phase == "forward"}
