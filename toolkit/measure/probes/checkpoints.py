"""Checkpoint regions: the inputs each holds, when it re-runs, its RNG states, what SAC caches.

Checkpoint regions: the inputs each holds to re-run its function, when that re-run happens, the RNG states it stashes,
and what SAC policies cache.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from ... import compat
from ...compat import tree_leaves
from .base import Produced, StepState, dtype_name, is_real, storage_key


class Checkpoints:
    """Observes every non-reentrant checkpoint of the step, the function form included (each patch calls the
    original unchanged, except that a SAC region under the toolkit's own saved-tensor hooks is told explicitly to
    keep its legacy behaviour, which is what it does by default, so torch >= 2.14 does not warn about our hooks)."""

    def __init__(
        self, state: StepState, names: dict[int, str], record: Callable[[int, Produced], None], own_pack: Callable
    ):
        self.state = state
        self.names = names
        self.record = record
        self.own_pack = own_pack
        self.sac_storages: list[Any] = []
        self.saw_checkpoint = False
        self.blind: set[str] = set()

    @contextlib.contextmanager
    def patches(self) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            target = compat.checkpoint_generator_target()
            if target is not None:
                owner, name, sig = target
                original = getattr(owner, name)
                stack.enter_context(compat.patched(owner, name, self._generator(original, sig)))
            else:
                self.blind.add("checkpoint_generator")
            cls = compat.sac_mode_class()
            if cls is not None:
                stack.enter_context(compat.patched(cls, "__init__", self._sac_init(cls.__init__)))
            else:
                self.blind.add("sac_mode")
            stack.enter_context(compat.patched(torch, "get_rng_state", self._get_rng_state(torch.get_rng_state)))
            yield

    def _generator(self, original, sig):
        probes = self

        def generator(*args, **kwargs):
            call = compat.CheckpointCall(sig, args, kwargs)
            if probes.state.phase == "forward":
                # The function form included: its inputs are held to re-run it, and backward must be watched.
                probes.saw_checkpoint = True
                for t in tree_leaves(call.inputs):
                    probes.state.hold(t)
                compat.keep_sac_legacy_under(call, probes.own_pack)
            # The generator calls `fn` only to recompute: a call of the wrapper means backward is re-running it.
            call.fn = probes._recompute_wrapper(call.fn)
            return (yield from call.call(original))

        return generator

    def _recompute_wrapper(self, fn):
        owner = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", None)
        name = self.names.get(id(owner)) if isinstance(owner, nn.Module) else None
        return functools.partial(_recompute, self.state, fn, name)

    def _sac_init(self, original):
        probes = self

        def sac_init(mode, *args, **kwargs):
            original(mode, *args, **kwargs)
            if probes.state.phase == "forward":
                probes.sac_storages.append(mode.storage)

        return sac_init

    def _get_rng_state(self, original):
        probes = self

        def get_rng_state(*args, **kwargs):
            # Checkpoint regions stash the RNG state to replay it in recompute; no dispatch mode sees it made.
            out = original(*args, **kwargs)
            if probes.state.phase == "forward":
                st = out.untyped_storage()
                key = st._cdata
                probes.record(
                    key,
                    Produced(
                        StorageWeakRef(st),
                        probes.state.module(),
                        "torch.get_rng_state",
                        tuple(out.shape),
                        dtype_name(out),
                        st.nbytes(),
                    ),
                )
                probes.state.hold(out)
            return out

        return get_rng_state

    def sac_cached_keys(self) -> set[int]:
        keys = set()
        for storage in self.sac_storages:
            for t in compat.sac_storage_tensors(storage):
                if is_real(t):
                    keys.add(storage_key(t))
        return keys


def _recompute(state: StepState, fn: Callable, name: str | None, /, *args: Any, **kwargs: Any) -> Any:
    state.recomputing += 1
    if name is not None:
        state.push(name)
    try:
        return fn(*args, **kwargs)
    finally:
        if name is not None:
            state.pop(name)
        state.recomputing -= 1


# Dynamo must never trace the recompute wrapper (backward may run it under a compiled frame's callback).
compat.skip_code(_recompute.__code__)
