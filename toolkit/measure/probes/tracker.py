"""The dispatch tracker: who made each storage in the forward, and which forward ops run again in backward."""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.multiprocessing.reductions import StorageWeakRef

from ...compat import TorchDispatchMode
from .base import Produced, StepState, dtype_name, is_real, tensors

_op_names: dict[Any, str] = {}
_COLLECTIVE_PREFIXES = ("c10d.", "_c10d_functional.", "c10d_functional.")


def op_name(func) -> str:
    name = _op_names.get(func)
    if name is None:
        name = _op_names[func] = str(func)
    return name


class Tracker(TorchDispatchMode):
    """Records each output storage of an eager op with the module running it (forward), and counts the ops
    dispatched while a recompute runs (backward). Compiled graphs' own ops are not seen (see `compiled.py`)."""

    # Without these two, Dynamo skips every frame run under the mode (compile silently off, C9) and
    # inductor+AC's `run_and_save_rng_state` HOP raises.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, state: StepState):
        super().__init__()
        self.state = state
        self.produced: dict[int, Produced] = {}
        self.recompute_by_op: Counter = Counter()
        self.recompute_by_module: Counter = Counter()
        self.bookkeeping_by_op: Counter = Counter()
        """Ops the recompute machinery dispatches for itself (not the model's forward ops run again)."""
        self.collectives: Counter = Counter()
        """Collective ops dispatched eagerly (FSDP's all-gathers / reduce-scatters, EP's all-to-alls), by phase."""
        self.comm_buffers: set[int] = set()
        """Storages a collective read or wrote in the forward. Once the collective is done, its process group may
        still hold them for a moment (gloo's worker thread drops its reference to a finished work after `wait()`
        returns), so one can be alive at the end of the forward with nothing of the model's holding it."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        state = self.state
        name = op_name(func)
        if name.startswith(_COLLECTIVE_PREFIXES):
            self.collectives[f"{state.phase}: {name}"] += 1
            if state.phase == "forward":
                self.comm_buffers.update(t.untyped_storage()._cdata for t in tensors(args) if is_real(t))
        if state.phase == "forward":
            produced = self.produced
            module = None
            for t in tensors(out):
                if not is_real(t):
                    continue
                st = t.untyped_storage()
                key = st._cdata
                old = produced.get(key)
                if old is None or old.ref.expired():
                    if module is None:
                        stack = state.stack
                        module = stack[-1] if stack else ""
                    produced[key] = Produced(
                        StorageWeakRef(st), module, op_name(func), tuple(t.shape), dtype_name(t), st.nbytes()
                    )
        elif state.in_recompute:
            if state.bookkeeping:
                self.bookkeeping_by_op[name] += 1
            else:
                self.recompute_by_op[name] += 1
                self.recompute_by_module[state.module()] += 1
        return out

    def record(self, key: int, produced: Produced) -> None:
        """A storage made outside the dispatcher's sight (e.g. the RNG state a checkpoint stashes)."""
        self.produced[key] = produced
