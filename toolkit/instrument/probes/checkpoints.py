"""Checkpoint regions: the inputs each holds, when it re-runs, its RNG states, what SAC caches.

Checkpoint regions: the inputs each holds to re-run its function, when that re-run happens, the RNG states it stashes,
and what SAC policies cache.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from ... import compat
from ...compat import tree_leaves
from . import checkpoint_hooks
from .base import Produced, StepState, dtype_name, is_real

COMPILED_OP = "compiled graph"
"""The op a saved tensor is attributed to when a compiled graph's runtime saved it (its own ops are not seen)."""


class Packed(NamedTuple):
    """One tensor a checkpoint region packed (forward) or re-packed (recompute): who made it, and its metadata."""

    op: str
    """The op dispatched last before autograd saved it (the op whose backward needs it), or `COMPILED_OP`."""
    module: str
    shape: tuple[int, ...]
    dtype: str
    device: str


@dataclass
class FrameRecord:
    """What the probes saw of one non-reentrant checkpoint region: what it packed in the forward and in each
    recompute, and what could make the two differ (random ops, in-place writes to older tensors, routing
    decisions, compiled code). Plain metadata, except the routing decisions' small index tensors."""

    region: str
    """The module running when the region began (its CheckpointWrapper's name, or the caller of `checkpoint`)."""
    preserve_rng_state: bool | None = None
    owner: str | None = None
    """The module whose call the region's function is (a module, its bound method, or a partial of one), if any."""
    forward: list[Packed] = field(default_factory=list)
    recomputes: dict[Any, list[Packed]] = field(default_factory=dict)
    """Graph-task id → what the recompute packed, in order."""
    random_ops: list[tuple[str, str]] = field(default_factory=list)
    """(module, op) of the ops drawing from torch's global RNG in the forward."""
    mutated: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Storage key → (module, op) of in-place writes in the forward to tensors that existed before the step."""
    reads: list[tuple[str, str, int]] = field(default_factory=list)
    """(module, op, storage key) of recompute ops reading a tensor the forward wrote in place."""
    routing: list[tuple[str, str, torch.Tensor]] = field(default_factory=list)
    """(module, op, indices) of each routing decision (`topk`) and token count the forward made."""
    routing_recompute: dict[Any, list[tuple[str, str, torch.Tensor]]] = field(default_factory=dict)
    compiled_forward: int = 0
    """Compiled graphs that ran inside the region in the forward."""
    compiled_recompute: dict[Any, int] = field(default_factory=dict)


class CheckpointView(NamedTuple):
    """What the probes kept of the step's checkpoint regions when it failed (`Probes.checkpoint_view`)."""

    records: tuple[FrameRecord, ...]
    last_recompute: tuple[FrameRecord, Any] | None
    """The region recomputed last and its graph task: the one the error is about."""
    observing: bool
    """The probes saw the regions' saved tensors (this torch has the hooks they read)."""
    backward_recompiles: tuple[str, ...]
    """Dynamo's recompile reasons for frames compiled while backward ran (recomputes included)."""
    names: dict[int, str]
    """Storage key → name of the model's parameters and buffers (to name state written in place)."""


class FrameObserver(checkpoint_hooks.CheckpointObserver):
    """Keeps a `FrameRecord` per checkpoint region of the step and tells the shared state which region (forward)
    or recompute is running, so that the dispatch tracker attributes what it sees."""

    def __init__(self, state: StepState, last_op: Callable[[], str], last_outputs: Callable[[], frozenset[int]]):
        self.state = state
        self.last_op = last_op
        self.last_outputs = last_outputs
        self.records: list[FrameRecord] = []
        self.by_frame: weakref.WeakKeyDictionary[Any, FrameRecord] = weakref.WeakKeyDictionary()
        self.last_recompute: tuple[FrameRecord, Any] | None = None
        """The region recomputed last, and its graph task: the one a CheckpointError is about."""

    def _pack(self, packs: list[Packed], x: torch.Tensor) -> None:
        """Note `x` packed: the compiled graph's when that graph is saving it, the last op's when `x` is one of its
        outputs, else (an input autograd saves before the op runs) the next op's."""
        state = self.state
        state.in_pack += 1
        key = compat.storage_key(x) if is_real(x) else None
        # Popped: the graph's node packs each once; a later eager op saving the same tensor is that op's save.
        region = state.compiled_saves.pop(key, None) if key is not None else None
        meta = Packed(
            COMPILED_OP if region is not None else "unknown",
            (region or state.module()) if region is not None else state.module(),
            tuple(x.shape),
            dtype_name(x),
            str(x.device),
        )
        if region is None:
            if key is not None and key in self.last_outputs():
                meta = meta._replace(op=self.last_op())
            else:
                state.pending_packs.append((packs, len(packs)))
        packs.append(meta)

    def pack_done(self) -> None:
        self.state.in_pack -= 1

    def frame(self, frame: Any) -> None:
        opts = self.state.checkpoint_options
        region = opts.get("region")
        rec = FrameRecord(
            self.state.module() if region is None else region, opts.get("preserve_rng_state"), owner=region
        )
        self.state.checkpoint_options = {}
        self.by_frame[frame] = rec
        self.records.append(rec)

    def forward_enter(self, frame: Any) -> None:
        state = self.state
        rec = self.by_frame.get(frame)
        state.frames.append(rec)
        # (While compiling, AOT runs a traced checkpoint to trace it: the graph's tags say what it covers.)
        state.checkpoint_begins(rec.owner if rec is not None else None)

    def forward_exit(self, frame: Any) -> None:
        self.state.compiled_saves = {}
        if self.state.frames:
            self.state.frames.pop()

    def forward_pack(self, frame: Any, x: torch.Tensor) -> None:
        rec = self.by_frame.get(frame)
        if rec is not None and self.state.phase == "forward":
            self._pack(rec.forward, x)
        else:
            self.state.in_pack += 1

    def recompute_enter(self, frame: Any, gid: Any) -> None:
        rec = self.by_frame.get(frame) if frame is not None else None
        if rec is not None:
            rec.recomputes.setdefault(gid, [])
            rec.routing_recompute.setdefault(gid, [])
            self.last_recompute = (rec, gid)
        self.state.recomputes.append((rec, gid))

    def recompute_exit(self, frame: Any, gid: Any) -> None:
        self.state.compiled_saves = {}
        if self.state.recomputes:
            self.state.recomputes.pop()

    def recompute_pack(self, frame: Any, gid: Any, x: torch.Tensor) -> None:
        rec = self.by_frame.get(frame) if frame is not None else None
        if rec is not None:
            self._pack(rec.recomputes.setdefault(gid, []), x)
        else:
            self.state.in_pack += 1


class Checkpoints:
    """Observes every non-reentrant checkpoint of the step, the function form included (each patch calls the
    original unchanged, except that a SAC region under the toolkit's own saved-tensor hooks is told explicitly to
    keep its legacy behaviour, which is what it does by default, so torch >= 2.14 does not warn about our hooks)."""

    def __init__(
        self,
        state: StepState,
        names: dict[int, str],
        record: Callable[[int, Produced], None],
        own_pack: Callable[..., Any],
    ):
        self.state = state
        self.names = names
        self.record = record
        self.own_pack = own_pack
        self.sac_storages: list[Any] = []
        self.saw_checkpoint = False
        self.blind: set[str] = set()
        self.observer = FrameObserver(state, lambda: "unknown", frozenset)
        self.observing = False

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
            cls: type[Any] | None = compat.sac_mode_class()
            if cls is not None:
                stack.enter_context(compat.patched(cls, "__init__", self._sac_init(cls.__init__)))
            else:
                self.blind.add("sac_mode")
            reentrant: type[Any] | None = compat.reentrant_checkpoint_class()
            if reentrant is not None:
                forward = staticmethod(self._reentrant_forward(reentrant.forward))
                stack.enter_context(compat.patched(reentrant, "forward", forward))
            else:
                self.blind.add("reentrant_checkpoint")
            stack.enter_context(compat.patched(torch, "get_rng_state", self._get_rng_state(torch.get_rng_state)))
            self.observing = stack.enter_context(checkpoint_hooks.observed_checkpoint_hooks(self.observer))
            yield

    def _generator(self, original: Callable[..., Any], sig: inspect.Signature) -> Callable[..., Any]:
        probes = self

        def generator(*args: Any, **kwargs: Any) -> Any:
            call = checkpoint_hooks.CheckpointCall(sig, args, kwargs)
            if probes.state.phase == "forward":
                # The function form included: its inputs are held to re-run it, and backward must be watched.
                probes.saw_checkpoint = True
                for t in [*tree_leaves(call.inputs), *_bound_tensors(call.fn)]:
                    probes.state.hold(t)
                checkpoint_hooks.keep_sac_legacy_under(call, probes.own_pack)
                # Read by the frame the generator makes next (the options a CheckpointError explanation weighs).
                region = probes._region_of(call.fn)
                probes.state.checkpoint_options = {
                    "preserve_rng_state": call.option("preserve_rng_state"),
                    "region": region,
                }
                context_fn = call.option("context_fn")
                if context_fn is not None and context_fn is not torch.utils.checkpoint.noop_context_fn:
                    probes.state.selective.add(region if region is not None else probes.state.module())
            # The generator calls `fn` only to recompute: a call of the wrapper means backward is re-running it.
            call.fn = probes._recompute_wrapper(call.fn)
            return (yield from call.call(original))

        return generator

    def _reentrant_forward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        probes = self

        def forward(ctx: Any, run_function: Callable[..., Any], preserve_rng_state: bool, *args: Any) -> Any:
            # Under Dynamo this is traced, not run: the original alone, so the graph is the one a user gets.
            if torch.compiler.is_compiling():
                return original(ctx, run_function, preserve_rng_state, *args)
            call = functools.partial(original, ctx, probes._recompute_wrapper(run_function), preserve_rng_state, *args)
            if probes.state.phase != "forward":
                return call()
            # A reentrant checkpoint (transformers' use_reentrant=True) saves its inputs with ctx.save_for_backward and
            # re-runs `run_function` inside its backward: its inputs are held to re-run it, and backward must be
            # watched, as for the generator form.
            probes.saw_checkpoint = True
            for t in [*args, *_bound_tensors(run_function)]:
                if isinstance(t, torch.Tensor):
                    probes.state.hold(t)
            probes.state.checkpoint_begins(probes._region_of(run_function))
            probes.state.reentrant += 1  # the modules its forward runs run under it (`StepState.push`)
            try:
                return call()
            finally:
                probes.state.reentrant -= 1

        return forward

    def _region_of(self, fn: Any) -> str | None:
        """The canonical name of the module a checkpoint call runs (a module, or one's bound method), if any."""
        bound = None
        while isinstance(fn, functools.partial):  # transformers 5.x: `partial(forward, layer, **kwargs)`
            if fn.args and isinstance(fn.args[0], nn.Module):
                bound = fn.args[0]
            fn = fn.func
        owner = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", bound)
        return self.names.get(id(owner)) if isinstance(owner, nn.Module) else None

    def _recompute_wrapper(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        owner = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", None)
        name = self.names.get(id(owner)) if isinstance(owner, nn.Module) else None
        return functools.partial(_recompute, self.state, fn, name)

    def _sac_init(self, original: Callable[..., None]) -> Callable[..., None]:
        probes = self

        def sac_init(mode: Any, *args: Any, **kwargs: Any) -> None:
            original(mode, *args, **kwargs)
            if probes.state.phase == "forward":
                probes.sac_storages.append(mode.storage)

        return sac_init

    def _get_rng_state(self, original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        probes = self

        def get_rng_state(*args: Any, **kwargs: Any) -> torch.Tensor:
            # Checkpoint regions stash the RNG state to replay it in recompute; no dispatch mode sees it made.
            out = original(*args, **kwargs)
            if probes.state.phase == "forward":
                st = out.untyped_storage()
                key = compat.storage_key(st)
                probes.record(
                    key,
                    Produced(
                        StorageWeakRef(st),  # type: ignore[no-untyped-call]  # unannotated in torch
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
                    keys.add(compat.storage_key(t))
        return keys


def _bound_tensors(fn: Any) -> list[torch.Tensor]:
    """Tensors a checkpointed function carries bound in a `functools.partial` (transformers checkpoints
    `partial(forward, layer, **kwargs)`: its position embeddings and mask travel there, held to re-run it)."""
    if not isinstance(fn, functools.partial):
        return []
    return [t for t in tree_leaves((fn.args, fn.keywords)) if isinstance(t, torch.Tensor)]


def _recompute(state: StepState, fn: Callable[..., Any], name: str | None, /, *args: Any, **kwargs: Any) -> Any:
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
