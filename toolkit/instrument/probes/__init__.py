"""Probes that see what a step holds for backward through AC, SAC and compiled graphs.

Probes that see what a training step holds for backward through eager AC, SAC caches and compiled graphs, without
turning compile off.

How each thing is seen (each method checked against an independent count in tests/_truth.py):
- eager ops (`tracker.py`): a TorchDispatchMode that declares `ignore_compile_internals` (a plain mode silently
  disables compile, C9) records each output storage with the module running it (`modules.py`'s hooks outside
  compiled regions); whatever is still alive at the end of the forward is held for backward (`census.py`);
- checkpoint regions (`checkpoints.py`): the inputs each holds, its RNG stash, when its function re-runs in
  backward, and the storage dict of every selective-checkpoint caching mode created during the step;
- compiled graphs (`compiled.py`): AOTAutograd's partition (what each graph saves, with `nn_module_stack`, and
  the forward ops its backward recomputes) and its runtime save call (the real tensors each invocation saves);
  graphs compiled before the step are read from the forward graph the backend kept;
- torch's checkpoint from inside (`checkpoint_hooks.py`): its pack hooks in the forward and each recompute, the
  recompute machinery's own work counted apart, SAC kept out of the probes' own saved-tensor hooks;
- graph breaks and recompiles (`trace.py`): torch's structured trace (the events tlparse reads).
Every private torch API sits in `toolkit.compat`; what is missing becomes a blind spot of the record.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Callable, Iterator, cast

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from ... import compat
from ...instrument.records import GraphBreak, Kind
from ...transforms.naming import has_checkpoint
from . import census as _census
from . import checkpoint_hooks
from .base import Held, StepState, dtype_name, is_real
from .checkpoints import Checkpoints, CheckpointView
from .compiled import CompiledGraphs
from .modules import Modules
from .trace import TraceEvents
from .tracker import Tracker


@dataclass(frozen=True)
class ProbeRecord:
    """What the probes saw of one step, beyond the census (plain data for the Report)."""

    recompute_by_op: dict[str, int]
    recompute_by_module: dict[str, int]
    bookkeeping_by_op: dict[str, int]
    """Ops the recompute machinery dispatched for itself (checkpoint's detaches, torch_remat's replays)."""
    compiled_reruns: dict[str, int]
    in_compiled_backward: int
    forward_flops: int
    """FLOPs of the forward: its eager ops and its compiled graphs' (each graph's times its runs)."""
    recompute_flops: int
    """FLOPs of the forward ops run again in backward: eager recomputes' and compiled backward graphs'."""
    breaks: tuple[GraphBreak, ...]
    recompiles: tuple[str, ...]
    compile_s: float
    regions: tuple[str, ...]
    """Compiled regions (canonical names) of the model."""
    regions_without_graphs: tuple[str, ...]
    """Compiled regions that ran in the forward without any compiled graph running inside them."""
    graphs_run: int
    """Distinct compiled autograd graphs that ran in the forward."""
    warm_graphs: int
    """Of those, graphs compiled before the step."""
    unknown_age_graphs: int
    """Of those, graphs that may have been compiled before the step or in it (the partition was not watched)."""
    blind_spots: tuple[str, ...]
    """Names of the `toolkit.compat` features this step needed and torch lacked, then sentences saying what a probe
    failed to see in this step."""
    collectives: dict[str, int]
    """"phase: op" → calls of collective ops dispatched eagerly during the step."""
    redrawn: tuple[str, ...] = ()
    """"module (op)" of each random op whose recompute drew other numbers than its forward (the RNG not restored)."""
    under_checkpoint: tuple[str, ...] = ()
    """Modules whose forward ran inside a checkpoint region (eagerly, or as ops a compiled graph tagged)."""
    checkpoint_unresolved: tuple[str, ...] = ()
    """Compiled regions in which a checkpoint ran that the probes cannot place around modules."""
    eager_checkpoints: tuple[str, ...] = ()
    """Checkpointed modules (else the compiled region around them) whose checkpoint Dynamo gave up and ran eagerly
    inside a compiled region (`StepState.eager_checkpoints`)."""
    draws_compiled: bool | None = False
    """A compiled graph of the step drew random numbers, which eager code draws otherwise (None: unknown, a graph
    whose forward could not be read)."""


class Probes:
    """`with probes.active():` then `with probes.phase_scope("forward")` / `("backward")`; `census()` at the end of
    the forward; `collect()` after the backward."""

    def __init__(self, model: nn.Module, inputs: Any = ()):
        self.model = model
        self.inputs = inputs
        self.state = StepState()
        self.modules = Modules(model, self.state)
        self.tracker = Tracker(self.state)
        self.compiled = CompiledGraphs(self.state, set(self.modules.names.values()))
        self.checkpoints = Checkpoints(self.state, self.modules.names, self.tracker.record, own_pack=Probes._pack)
        self.checkpoints.observer.last_op = lambda: self.tracker.last_op
        self.checkpoints.observer.last_outputs = lambda: self.tracker.last_outputs
        self.trace = TraceEvents(self.state)
        self.packed: dict[int, Held] = {}
        self.packed_keys: set[int] = set()
        self.pack_kinds: dict[int, Kind] = {}
        """Storage key → why it was packed, where not by autograd alone: torch_remat's "checkpoint_input" /
        "remat_save", or "offloaded" (the host copy `save_on_cpu` keeps: transformers' offload=True)."""

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        # Plain Python hooks: AOTAutograd only inlines GraphModule hooks, so compiled graphs are unchanged.
        if self.state.phase == "forward":
            st = t.untyped_storage()
            key = compat.storage_key(st)
            why = compat.remat_saved_kind()
            if why is not None:
                self.pack_kinds.setdefault(key, cast("Kind", why))  # torch_remat's two kinds
            self._held(t, st)
        return t

    def _held(self, t: torch.Tensor, st: torch.UntypedStorage) -> None:
        """`t` (storage `st`) is kept for backward: counted once, with a record of its own where no op probe saw it
        made (the step's inputs, tensors made before the step)."""
        key = compat.storage_key(st)
        if key not in self.packed_keys:
            self.packed_keys.add(key)
            if key not in self.tracker.produced and is_real(t):
                self.packed[key] = Held(
                    StorageWeakRef(st),  # type: ignore[no-untyped-call]  # unannotated in torch
                    self.state.module(),
                    tuple(t.shape),
                    dtype_name(t),
                    st.nbytes(),
                )

    def _offload_init(self, init: Callable[..., None]) -> Callable[..., Any]:
        """`save_on_cpu.__init__`, its pack hook wrapped to record each host copy as kept for backward ("offloaded"):
        a save_on_cpu inside the step is the innermost saved-tensor hook, so `_pack` never sees what it packs."""
        probes = self

        @compat.dynamo_disabled
        def record(host: Any) -> None:
            if probes.state.phase == "forward" and torch.is_tensor(host) and is_real(host):
                st = host.untyped_storage()
                probes.pack_kinds[compat.storage_key(st)] = "offloaded"
                probes._held(host, st)

        def __init__(hooks: Any, *args: Any, **kwargs: Any) -> None:
            init(hooks, *args, **kwargs)
            pack = hooks.pack_hook

            def pack_to_host(t: torch.Tensor) -> Any:
                packed = pack(t)
                record(packed[1] if isinstance(packed, tuple) else packed)
                return packed

            hooks.pack_hook = compat.traced_as(pack_to_host, pack)

        # Dynamo never traces save_on_cpu's constructor (a graph break, or fullgraph's error): the stand-in must meet
        # the same rule, or Dynamo inlines it and reports the probes it cannot wrap instead of the user's error.
        return compat.traced_as(__init__, init)

    def _enter_bookkeeping(self) -> None:
        self.state.bookkeeping += 1

    def _leave_bookkeeping(self) -> None:
        self.state.bookkeeping -= 1

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Patches, hooks, saved-tensor hooks and the trace listener; the tracker runs only inside `phase_scope`."""
        compat.apply_skips()
        with contextlib.ExitStack() as stack:
            stack.enter_context(_older_objects_frozen())
            stack.enter_context(self.compiled.patches())
            stack.enter_context(self.checkpoints.patches())
            stack.enter_context(
                checkpoint_hooks.recompute_bookkeeping(self._enter_bookkeeping, self._leave_bookkeeping)
            )
            stack.enter_context(self.trace.listening())
            stack.enter_context(self.modules.hooks())
            # Autograd calls the pack hook from inside frames Dynamo is running (a compiled model that fell back to
            # eager included): disabled recursively, so that neither the hook nor what it calls (`is_real`, …) is
            # compiled — a skipped code object alone still let Dynamo compile its callees, and the instrument's own
            # graphs and recompiles were counted as the model's ('model' scope: 2 graphs, 1 recompile on `is_real`).
            offload: type[Any] | None = compat.save_on_cpu_class()
            if offload is not None:
                stack.enter_context(compat.patched(offload, "__init__", self._offload_init(offload.__init__)))
            else:
                self.checkpoints.blind.add("save_on_cpu")
            pack = compat.dynamo_disabled(self._pack)
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(pack, _identity))
            # A warm AOTAutograd cache skips the partition we read; the graphs themselves are unchanged.
            stack.enter_context(compat.compiler_configs().functorch.patch(enable_autograd_cache=False))
            yield

    @contextlib.contextmanager
    def phase_scope(self, phase: str) -> Iterator[None]:
        """Run the forward or the backward under the probes. The tracker watches the backward only where
        something can be recomputed (a checkpoint region): elsewhere it would only cost time."""
        # FSDP's reduce-scatters happen in backward: watch it for collectives too.
        track = (
            phase == "forward"
            or self.checkpoints.saw_checkpoint
            or has_checkpoint(self.model)
            or any(compat.is_fsdp_module(m) for m in self.model.modules())
        )
        self.state.phase = phase
        try:
            if track:
                with self.tracker:
                    yield
            else:
                yield
        finally:
            self.state.phase = "idle"

    def census(self, output: Any) -> _census.Census:
        """Storages held for backward right now (call at the end of the forward, with the step's output).

        Cyclic garbage is collected first: a tensor that only a reference cycle keeps (a frame left behind by a
        graph break, say) is not held for backward, and whether the collector had run yet would otherwise decide
        whether it is counted (C13's for-loop run flipped between two totals)."""
        gc.collect()
        return _census.take(
            self.model,
            inputs=[self.inputs],
            output=output,
            produced=self.tracker.produced,
            comm_buffers=self.tracker.comm_buffers,
            compiled=self.compiled.saves,
            packed=self.packed,
            packed_keys=self.packed_keys,
            held_inputs=self.state.held_inputs,
            sac_keys=self.checkpoints.sac_cached_keys(),
            pack_kinds=self.pack_kinds,
        )

    def checkpoint_view(self, model: nn.Module) -> CheckpointView:
        """What the probes kept of the step's checkpoint regions, for explaining a CheckpointError (plain records;
        call it after the failing step)."""
        names: dict[int, str] = {}
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            t = compat.local_tensor(t)
            if is_real(t):
                names.setdefault(compat.storage_key(t), name)
        obs = self.checkpoints.observer
        return CheckpointView(
            records=tuple(obs.records),
            last_recompute=obs.last_recompute,
            observing=self.checkpoints.observing,
            backward_recompiles=tuple(self.trace.backward_recompiles),
            names=names,
        )

    def collect(self) -> ProbeRecord:
        self.compiled.finish()
        ran = self.modules.ran_forward()
        # A region ran compiled when an AOT graph saved in it (compiled.py) or a Dynamo graph's code ran in it (the
        # `eager` backend, which has no AOT step: tracker.py).
        without = sorted(
            n for n in ran if self.compiled.region_compiled_runs[n] == 0 and n not in self.state.graph_regions
        )
        blind = self.compiled.blind | self.checkpoints.blind | self.trace.blind
        if self.checkpoints.saw_checkpoint and not compat.available("checkpoint_recompute_hook"):
            blind.add("checkpoint_recompute_hook")
        if self.compiled.recompute_unknown():
            blind.add("compiled_fw_graph")
        compiled_flops = self.compiled.flops()
        return ProbeRecord(
            recompute_by_op=dict(sorted(self.tracker.recompute_by_op.items())),
            recompute_by_module=dict(sorted(self.tracker.recompute_by_module.items())),
            bookkeeping_by_op=dict(sorted(self.tracker.bookkeeping_by_op.items())),
            compiled_reruns=dict(sorted(self.modules.compiled_reruns.items())),
            in_compiled_backward=int(self.compiled.in_compiled_backward()),
            forward_flops=self.tracker.forward_flops + compiled_flops[0],
            recompute_flops=self.tracker.recompute_flops + compiled_flops[1],
            breaks=tuple(GraphBreak(reason=r, file=f, line=ln) for r, f, ln in self.trace.breaks),
            recompiles=tuple(self.trace.recompiles),
            compile_s=self.trace.compile_s,
            regions=tuple(self.modules.region_names),
            regions_without_graphs=tuple(without),
            graphs_run=len(self.compiled.graphs_run),
            warm_graphs=sum(1 for k in self.compiled.graphs_run if self.compiled.records[k].warm is True),
            unknown_age_graphs=sum(1 for k in self.compiled.graphs_run if self.compiled.records[k].warm is None),
            blind_spots=tuple(sorted(blind)) + tuple(dict.fromkeys(self.compiled.failures)),
            collectives=dict(sorted(self.tracker.collectives.items())),
            redrawn=tuple(
                dict.fromkeys(
                    [f"{m or '<model>'} ({op})" for m, op in self.tracker.redrawn] + self.compiled.random_recomputed()
                )
            ),
            draws_compiled=self.compiled.draws(),
            under_checkpoint=tuple(sorted(self.state.under_checkpoint)),
            checkpoint_unresolved=tuple(sorted(self.state.checkpoint_unresolved)),
            eager_checkpoints=tuple(sorted(self.state.eager_checkpoints)),
        )


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


@contextlib.contextmanager
def _older_objects_frozen() -> Iterator[None]:
    """Every object alive before the step out of the collector's sight while it runs (`gc.freeze`), so the census's
    `gc.collect()` walks only what the step made — the cycles it looks for (a frame a graph break left) are all
    new — instead of the million objects torch keeps alive (most of a measured step's time otherwise). Where
    something froze them already (the warm pool's server, before forking this child) that freeze stands."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


# Autograd calls the saved-tensor hooks from inside frames Dynamo is running; it then tries to compile the hook's
# own frame, fails on `untyped_storage()` and reports a "graph break" in the probes. Never trace our own hooks (the
# pack hook is also disabled recursively where it is installed, `Probes.active`).
for _code in (Probes._pack.__code__, _identity.__code__):
    compat.skip_code(_code)

__all__ = ["Probes", "ProbeRecord"]
