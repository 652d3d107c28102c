"""The dispatch tracker: who made each storage in the forward, and which forward ops run again in backward."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ... import compat
from ...compat import TorchDispatchMode
from ..flops import flops
from .base import Produced, StepState, dtype_name, from_graph_code, is_real, tensors

_op_names: dict[Any, str] = {}
_COLLECTIVE_PREFIXES = ("c10d.", "_c10d_functional.", "c10d_functional.")
# The ops whose outputs are a routing decision or a token count: compared between a region's forward and its
# recompute when a CheckpointError needs explaining.
ROUTING_OPS = ("aten.topk.default",)
COUNT_OPS = ("aten.bincount.default", "aten.histc.default")


def op_name(func: Any) -> str:
    name = _op_names.get(func)
    if name is None:
        name = _op_names[func] = str(func)
    return name


class _OpInfo(NamedTuple):
    random: bool
    """Tagged `nondeterministic_seeded`: may draw from the global RNG (`compat.draws_random` says if a call does)."""
    written: tuple[Any, ...]
    """The arguments it writes in place (`compat.written_arguments`)."""
    routing: int
    """Which output holds a routing decision or a count (-1: none)."""


_infos: dict[Any, _OpInfo] = {}


def _info(func: Any, name: str) -> _OpInfo:
    info = _infos.get(func)
    if info is None:
        tags = getattr(func, "tags", ()) or ()
        routing = 1 if name in ROUTING_OPS else 0 if name in COUNT_OPS else -1
        info = _infos[func] = _OpInfo(
            torch.Tag.nondeterministic_seeded in tags, compat.written_arguments(func), routing
        )
    return info


def _fingerprint(out: Any) -> int:
    """A checksum of an op's output numbers (its bytes), computed out of sight of every dispatch mode: the probes'
    own work must be no op of the step's (a SAC region's caching mode would take it for one)."""
    import zlib

    crc = 0
    with compat.disable_current_modes():
        for t in tensors(out):
            if is_real(t) and t.numel():
                data = t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()
                crc = zlib.crc32(data, crc)  # type: ignore[arg-type]  # numpy's stubs give ndarray no buffer below 3.12
    return crc


def _keys(value: Any) -> list[int]:
    """Storage keys of the real tensors in an op argument (a tensor, or a list of them)."""
    if isinstance(value, torch.Tensor):
        return [compat.storage_key(value)] if is_real(value) else []
    if isinstance(value, (list, tuple)):
        return [k for v in value for k in _keys(v)]
    return []


class Tracker(TorchDispatchMode):  # type: ignore[no-untyped-call]  # unannotated in torch
    """Records each output storage of an eager op with the module running it (forward), and counts the ops
    dispatched while a recompute runs (backward). Compiled graphs' own ops are not seen (see `compiled.py`)."""

    # Without these two, Dynamo skips every frame run under the mode (compile silently off, C9) and
    # inductor+AC's `run_and_save_rng_state` HOP raises.
    supports_higher_order_operators = True

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __init__(self, state: StepState):
        super().__init__()  # type: ignore[no-untyped-call]  # unannotated in torch
        self.state = state
        self.produced: dict[int, Produced] = {}
        self.recompute_by_op: Counter[str] = Counter()
        self.recompute_by_module: Counter[str] = Counter()
        self.bookkeeping_by_op: Counter[str] = Counter()
        """Ops the recompute machinery dispatches for itself (not the model's forward ops run again)."""
        self.forward_flops = 0
        """FLOPs of the eager forward ops (matmuls, attention, convolutions: `instrument.flops`)."""
        self.recompute_flops = 0
        """FLOPs of the forward ops an eager recompute ran again."""
        self.collectives: Counter[str] = Counter()
        """Collective ops dispatched eagerly (FSDP's all-gathers / reduce-scatters, EP's all-to-alls), by phase."""
        self.comm_buffers: set[int] = set()
        """Storages a collective read or wrote in the forward. Once the collective is done, its process group may
        still hold them for a moment (gloo's worker thread drops its reference to a finished work after `wait()`
        returns), so one can be alive at the end of the forward with nothing of the model's holding it."""
        self.last_op = "unknown"
        """The op dispatched last (a saved-tensor hook packing one of its outputs is packing for it)."""
        self.last_outputs: frozenset[int] = frozenset()
        """Storage keys of the last op's outputs."""
        self.watched: set[int] = set()
        """Older tensors a checkpoint region wrote in place in the forward: reads of them in a recompute are noted."""
        self.draws: Counter[tuple[str, int]] = Counter()
        """(op, fingerprint) of every random draw the forward made eagerly, counted (not by module: torch_remat
        replays a block with no module hooks running, so a recompute's module is not the forward's)."""
        self.redrawn: list[tuple[str, str]] = []
        """(module, op) of each draw a recompute made that no forward draw of that op matches: new randomness."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        state = self.state
        name = op_name(func)
        # A checkpoint pack hook's own ops (a recompute's detach) make nobody's saved tensor and decide nothing: left
        # out of what explains a CheckpointError, still counted below like every op (recompute counts included).
        if not state.in_pack:
            self.last_op = name
            # Storage keys, not the tensors: a reference would keep the op's outputs alive past their use and change
            # what autograd and torch_remat do with them (what is measured).
            self.last_outputs = frozenset(_keys(out))
            if state.pending_packs:
                # Autograd saves an op's inputs before running it: packs noted since the last op are this op's.
                for packs, i in state.pending_packs:
                    packs[i] = packs[i]._replace(op=name)
                state.pending_packs.clear()
            if state.frames or state.recomputes:
                self._in_checkpoint(func, name, args, kwargs or {}, out)
        if name.startswith(_COLLECTIVE_PREFIXES):
            self.collectives[f"{state.phase}: {name}"] += 1
            if state.phase == "forward":
                self.comm_buffers.update(compat.storage_key(t) for t in tensors(args) if is_real(t))
        info = _info(func, name)
        if info.random and not state.in_pack and not state.bookkeeping:
            self._draw(func, name, args, kwargs or {}, out)
        if state.phase == "forward":
            self.forward_flops += flops(func, args, kwargs or {}, out) or 0
            if state.regions and state.regions[-1] not in state.graph_regions and from_graph_code():
                state.graph_regions.add(state.regions[-1])
            produced = self.produced
            module = None
            for t in tensors(out):
                if not is_real(t):
                    continue
                st = t.untyped_storage()
                key = compat.storage_key(st)
                old = produced.get(key)
                if old is None or old.ref.expired():  # type: ignore[no-untyped-call]  # unannotated in torch
                    if module is None:
                        stack = state.stack
                        module = stack[-1] if stack else ""
                    produced[key] = Produced(
                        StorageWeakRef(st),  # type: ignore[no-untyped-call]  # unannotated in torch
                        module,
                        op_name(func),
                        tuple(t.shape),
                        dtype_name(t),
                        st.nbytes(),
                    )
        elif state.in_recompute:
            if state.bookkeeping:
                self.bookkeeping_by_op[name] += 1
            else:
                self.recompute_by_op[name] += 1
                self.recompute_by_module[state.module()] += 1
                self.recompute_flops += flops(func, args, kwargs or {}, out) or 0
        return out

    def _draw(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """A random op's draw, fingerprinted: remembered in the forward, checked against those in a recompute (the
        same module, op and numbers: the RNG was restored; other numbers: the recompute drew new randomness)."""
        state = self.state
        if state.phase == "forward":
            if compat.draws_random(func, args, kwargs):
                self.draws[(name, _fingerprint(out))] += 1
        elif state.in_recompute and compat.draws_random(func, args, kwargs):
            key = (name, _fingerprint(out))
            if self.draws[key] > 0:
                self.draws[key] -= 1  # matched: each forward draw answers one recompute
            else:
                self.redrawn.append((state.module(), name))

    def _in_checkpoint(self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """What could make a region's recompute differ from its forward, as the ops go by (`FrameRecord`)."""
        state, info = self.state, _info(func, name)
        module = state.module()
        routing = None
        if info.routing >= 0:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if info.routing < len(outs) and is_real(outs[info.routing]):
                routing = (module, name, outs[info.routing].detach().clone())
        if state.phase == "forward" and state.frames and state.frames[-1] is not None:
            rec = state.frames[-1]
            if info.random and compat.draws_random(func, args, kwargs):
                rec.random_ops.append((module, name))
            for w in info.written:
                value = (
                    args[w] if isinstance(w, int) and w < len(args) else kwargs.get(w) if isinstance(w, str) else None
                )
                for key in _keys(value):
                    old = self.produced.get(key)
                    # It existed before the step: state, not an activation (StorageWeakRef is unannotated in torch).
                    if old is None or old.ref.expired():  # type: ignore[no-untyped-call]
                        rec.mutated.setdefault(key, (module, name))
                        self.watched.add(key)
            if routing is not None:
                rec.routing.append(routing)
        elif state.phase == "backward" and state.recomputes:
            rec, gid = state.recomputes[-1]
            if rec is None:
                return
            if routing is not None:
                rec.routing_recompute.setdefault(gid, []).append(routing)
            if self.watched and not info.written:
                for key in _keys(list(args) + list(kwargs.values())):
                    if key in self.watched:
                        rec.reads.append((module, name, key))

    def record(self, key: int, produced: Produced) -> None:
        """A storage made outside the dispatcher's sight (e.g. the RNG state a checkpoint stashes)."""
        self.produced[key] = produced
