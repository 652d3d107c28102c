"""Live-storage accounting on fake tensors: each storage an op makes, by module and op, until it dies; the peak."""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import compat
from ..compat import TorchDispatchMode, tree_leaves
from ..instrument.flops import flops
from ..instrument.probes.base import StepState
from ..instrument.probes.compiled import CompiledGraphs

CUDA_BLOCK = 512
"""The CUDA caching allocator rounds every allocation up to a multiple of this many bytes."""


@dataclass
class Storage:
    """One storage followed: its weak reference, its size as counted, the module and op that made it."""

    ref: StorageWeakRef
    nbytes: int
    module: str
    op: str
    dtype: str
    shape: tuple[int, ...]


class LiveStorages(TorchDispatchMode):
    """Follows every storage an op creates, by module and op, and the high-water mark of what is alive."""

    # Without these, Dynamo skips every frame run under the mode (compile silently off, C9) and inductor's
    # `run_and_save_rng_state` raises (see probes/tracker.py).
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, round_to: int, state: StepState, known: set[int]):
        super().__init__()
        self.round_to, self.state, self.known = round_to, state, known  # known: parameters, buffers, inputs
        self.live: dict[int, Storage] = {}
        self.total = self.peak = 0
        self.fake = compat.not_real_tensor_types()
        # When a storage dies, without looking at every storage after every op (that scan made a deep model's
        # estimate quadratic in its layers: 40 layers took 40 s). Each op's output tensors are counted per storage
        # and watched (`weakref.finalize`: a fake tensor's Python object lives as long as the tensor, autograd's
        # saved copies included); a storage whose last watched tensor is gone is a suspect, gone for real once
        # its weak reference expires (an unwatched view may still hold it), which is checked after every op.
        self.holders: dict[int, int] = {}
        self.suspects: set[int] = set()
        self.flops: Counter = Counter()
        self.ops: Counter = Counter()
        self.rng: dict[int, Storage] = {}
        """The RNG states stashed for a recompute: real CPU tensors among the fake ones (a compiled checkpoint's
        `run_and_save_rng_state`, an eager one's `torch.get_rng_state`), host memory, kept apart from the peak."""

    def size(self, nbytes: int) -> int:
        return -(-nbytes // self.round_to) * self.round_to if self.round_to > 1 else nbytes

    def sweep(self) -> None:
        """Forget the storages found dead: the suspects whose weak reference expired."""
        for key in [k for k in self.suspects if self.live[k].ref.expired()]:
            self.suspects.discard(key)
            self.holders.pop(key, None)
            self.total -= self.live.pop(key).nbytes

    def sweep_all(self) -> None:
        """Every storage checked (the end of the forward, before what is alive is read as what is saved)."""
        self.suspects.update(k for k, s in self.live.items() if s.ref.expired())
        self.sweep()

    def _released(self, key: int) -> None:
        n = self.holders.get(key)
        if n is None:
            return
        if n > 1:
            self.holders[key] = n - 1
        elif key in self.live:
            self.holders[key] = 0
            self.suspects.add(key)

    def stash(self, t: torch.Tensor, op: str) -> None:
        """An RNG state a checkpoint stashed (its exact size: host memory, no device rounding)."""
        st = t.untyped_storage()
        ref = StorageWeakRef(st)
        if ref.cdata not in self.rng:
            self.rng[ref.cdata] = Storage(ref, st.nbytes(), self.state.module(), op, "uint8", tuple(t.shape))

    def add(self, t: torch.Tensor, op: str) -> None:
        if not isinstance(t, self.fake):
            if t.dtype == torch.uint8 and self.state.phase == "forward":
                self.stash(t, op)  # a real tensor among fake ones: the RNG state a compiled checkpoint stashes
            return
        st = t.untyped_storage()
        ref = StorageWeakRef(st)
        key = ref.cdata
        if key in self.known or not st.nbytes():
            return
        if key not in self.live:
            n = self.size(st.nbytes())
            self.live[key] = Storage(
                ref, n, self.state.module(), op, str(t.dtype).replace("torch.", ""), tuple(t.shape)
            )
            self.total += n
            self.holders[key] = 0
        self.holders[key] += 1
        self.suspects.discard(key)
        weakref.finalize(t, self._released, key)

    def resized(self, st: torch.UntypedStorage) -> None:
        """A storage resized in place (FSDP2 frees a gathered parameter to 0 bytes and refills it)."""
        ref = StorageWeakRef(st)
        key, n = ref.cdata, self.size(st.nbytes())
        entry = self.live.get(key)
        if entry is not None:
            self.total += n - entry.nbytes
            entry.nbytes = n
        elif n and key not in self.known:
            self.live[key] = Storage(ref, n, self.state.module(), "resize_", "uint8", (st.nbytes(),))
            self.total += n
            self.holders[key] = 0
            self.suspects.add(key)  # no tensor of it is watched: checked by its weak reference
        self.peak = max(self.peak, self.total)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.state.phase in ("forward", "backward"):
            self.ops[self.state.phase] += 1
            self.flops[self.state.phase] += flops(func, args, kwargs or {}, out) or 0
        self.sweep()
        op = None
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.add(t, op or (op := str(func)))
        self.peak = max(self.peak, self.total)
        return out


class CompiledSaves(CompiledGraphs):
    """The probes' partition watch, on fake tensors: each storage a compiled forward saves is renamed after the
    partitioned graph's node that made it (module relative to the compiled region, op)."""

    def __init__(self, state: StepState, known_modules: set[str], live: LiveStorages):
        super().__init__(state, known_modules)
        self.live = live

    def on_save(self, saved_state: Any, ctx: Any, fw_outs: Any) -> None:
        if self.state.phase != "forward":
            return  # AC(compile(x)): the compiled forward re-runs in backward; its saves die with the recompute
        meta = saved_state.metadata
        region = self.state.region()
        self.region_compiled_runs[region] += 1
        self.graphs_run.add(id(meta))
        rec = self.records.get(id(meta))
        saved = [t for sl in compat.saved_slices(meta) for t in fw_outs[sl]]
        for i, t in enumerate(saved):
            if not isinstance(t, torch.Tensor):
                continue
            gs = rec.saved[i] if rec is not None and i < len(rec.saved) else None
            entry = self.live.live.get(StorageWeakRef(t.untyped_storage()).cdata)
            if entry is None or gs is None or gs.op == "input":
                continue  # a graph input keeps the eager op that made it
            entry.module, entry.op = self.resolve(region, gs.module), gs.op
