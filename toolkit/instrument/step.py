"""The measured step: one instrumented forward + backward, then bare memory and steady steps.

The measured step: one instrumented forward + backward (compile happens here), then a bare memory step and bare steady
steps.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
from torch import nn

from .. import compat
from ..compat import tree_leaves
from ..instrument.records import Memory
from . import memory as _memory
from .numerics import grads as _grads
from .probes import ProbeRecord, Probes
from .probes.census import Census


def older_node() -> torch.Tensor:
    """A one-node graph for `no_tasks_left_on_error`, made before the step it guards (made outside the step, it is not
    among the allocations the step's memory figure counts)."""
    with torch.enable_grad():
        return torch.zeros((), requires_grad=True).mul(1.0)


@contextlib.contextmanager
def no_tasks_left_on_error(older: torch.Tensor) -> Any:
    """Around a forward and its backward: when the backward raises, run `older` (from `older_node()`, made before the
    forward), so that no ready node of the failed backward stays in this thread's autograd queue.

    Why (case C59, torch 2.15.0): a backward that raises (a CheckpointError, say) leaves the nodes it had made ready in
    the calling thread's queue. They are freed only by the thread's exit handlers, after Python has shut down, and a
    node holding a tensor packed by a Python saved-tensor hook (checkpoint's own) then takes the GIL: the process dies
    of SIGSEGV on exit, after a Report was already printed. The engine runs higher sequence numbers first, so the
    stale nodes (made after `older`) are popped, and dropped as their graph failed, before `older` runs. One node is
    enough for a whole step: the first failure ends it."""
    try:
        yield
    except BaseException:
        # Best effort: the failure that got here is what the caller reports, never an error of the drain itself.
        with contextlib.suppress(Exception):
            older.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        raise


class Stage:
    """The stage a run is in ("build", "reference" (the eager run gradients are compared with), "ac", "compile",
    "forward", "backward", "measure"), reported on change."""

    def __init__(self, on_change: Callable[[str], None] | None = None):
        self.name = "build"
        self.on_change = on_change

    def __call__(self, name: str) -> None:
        self.name = name
        if self.on_change:
            self.on_change(name)


@dataclass
class StepResult:
    """Everything the step showed, as typed records (the runner assembles the Report from it)."""

    loss: float | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    census: Census | None = None
    probes: ProbeRecord | None = None
    compiled_in_step: int = 0
    graph_breaks: int = 0
    compiled_total: int = 0
    """Graphs compiled by the measured step (step 1), counted from before its settings were entered."""
    compiled_later: int = 0
    """Graphs compiled by the steps after it (the memory step, the steady steps): a later step compiled again."""
    memory_budget: float | None = None
    """torch's `activation_memory_budget` in force while step 1 ran, when below 1 (whoever set it)."""
    aot_autograd: bool | None = None
    """Whether the graphs step 1 compiled went through AOTAutograd (None: it compiled none), read when it fails too."""
    observed_orders: dict[str, str] = field(default_factory=dict)
    observed_selective: tuple[str, ...] = ()
    """How compile and AC met (`StepState.orders`), and the checkpoints with a selective policy
    (`StepState.selective`), as far as step 1 ran: read whether it ends or fails (the probes' record is not
    collected then), so that an error is matched on what the step showed too."""
    memory: Memory | None = None
    timings: dict[str, float] = field(default_factory=dict)
    checkpoints: Any = None
    """When the probed step failed: what the probes kept of its checkpoint regions (`explain.CheckpointView`)."""
    remat_stand_ins: bool = False
    """The step ran with torch_remat's placeholders stood in for (a +cpu build, the toolkit's remat applied: C31)."""


def _output_bytes(out: Any) -> int:
    seen, total = set(), 0
    for t in tree_leaves(out):
        if isinstance(t, torch.Tensor) and not t.is_meta:
            st = t.untyped_storage()
            key = compat.storage_key(st)
            if key not in seen:
                seen.add(key)
                total += st.nbytes()
    return total


def measured_step(
    model: nn.Module,
    forward: Callable[[], Any],
    loss_of: Callable[[Any], torch.Tensor],
    inputs: Any,
    device: torch.device,
    stage: Stage,
    *,
    seed: int | None = None,
    measure_memory: bool = True,
    steady_steps: int = 0,
    snapshot_path: str | None = None,
    result: StepResult | None = None,
    instrument: bool = True,
    settings: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
    remat_stand_ins: bool = False,
) -> StepResult:
    """Step 1 with probes, then a memory step and `steady_steps` bare steps. `result` is filled as the step goes,
    so a failure in a later stage keeps what the earlier ones measured. `instrument=False` runs step 1 with none of
    the probes (no dispatch mode, no saved-tensor hooks, no patches): only its loss, gradients, and the graphs and
    breaks Dynamo's own counters saw — whether a failure happens without the instrument. `settings()` is entered
    around each step (the torch settings the model's transforms need: the caller's, so the instrument knows no
    transform); `remat_stand_ins` says torch_remat's placeholders were stood in for."""
    out = result if result is not None else StepResult()
    out.remat_stand_ins = remat_stand_ins
    older = older_node()  # before anything the step makes or measures (C59)
    before = compat.counters_snapshot()
    probes = Probes(model, inputs) if instrument else None
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    with settings(), no_tasks_left_on_error(older):
        counted = compat.counters_snapshot()
        budget = compat.activation_memory_budget()
        out.memory_budget = budget if budget < 1.0 else None
        try:
            with probes.active() if probes is not None else contextlib.nullcontext():
                stage("forward")
                if seed is not None:
                    torch.manual_seed(seed)  # the same RNG stream as the reference run (router noise, dropout)
                with probes.phase_scope("forward") if probes is not None else contextlib.nullcontext():
                    output = forward()
                t_fwd = time.perf_counter()
                if probes is not None:
                    out.census = probes.census(output)
                loss = loss_of(output)
                del output
                stage("backward")
                t_bwd = time.perf_counter()
                with probes.phase_scope("backward") if probes is not None else contextlib.nullcontext():
                    loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
        except Exception:
            # Kept for the Report (a CheckpointError is explained from it); the step's failure stands.
            if probes is not None:
                out.checkpoints = probes.checkpoint_view(model)
            raise
        finally:
            # Counted whether the step finished or not: a failed step's Report says what compiled before it failed.
            out.aot_autograd = compat.through_aot_autograd(counted)
            out.compiled_in_step, out.graph_breaks = compat.graphs_compiled(counted)
            out.compiled_total = compat.graphs_compiled(before)[0]
            if probes is not None:
                out.observed_orders = dict(sorted(probes.state.orders.items()))
                out.observed_selective = tuple(sorted(probes.state.selective))
    after_first = compat.counters_snapshot()
    out.timings.update(
        first_step_s=time.perf_counter() - t0, first_forward_s=t_fwd - t0, first_backward_s=time.perf_counter() - t_bwd
    )
    out.loss = float(loss.detach().float())
    del loss
    out.grads = _grads(model)
    if probes is not None:
        out.probes = probes.collect()
        del probes
    else:
        return out  # a bare run: nothing else to measure

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    assert out.census is not None  # set by the probed forward, which finished
    output_saved = out.census.output_saved
    output_bytes: dict[str, int] = {}

    def bare_step(
        mark: Callable[[], None] = lambda: None, times: list[tuple[float, float, float]] | None = None
    ) -> None:
        model.zero_grad(set_to_none=True)
        with settings(), no_tasks_left_on_error(older):
            t = time.perf_counter()
            res = forward()
            sync()
            t_f = time.perf_counter()
            # The output is alive at the mark because we hold it; subtract it unless backward needs it too.
            output_bytes.setdefault("v", 0 if output_saved else _output_bytes(res))
            mark()
            loss = loss_of(res)
            del res
            t_b = time.perf_counter()
            loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
            sync()
            if times is not None:
                times.append((t_f - t, time.perf_counter() - t_b, time.perf_counter() - t))

    if measure_memory:
        stage("measure")
        if device.type == "cuda":
            peak, held = _memory.cuda_step(bare_step, device, snapshot_path)
            out.memory = Memory(
                device=str(device),
                peak_bytes=int(peak),
                held_after_forward_bytes=int(held - output_bytes.get("v", 0)),
                method=_memory.CUDA_METHOD,
                snapshot_path=snapshot_path,
            )
        else:
            measured = _memory.cpu_step(bare_step)
            if measured is not None:
                peak, held = measured
                out.memory = Memory(
                    device=str(device),
                    peak_bytes=int(peak),
                    held_after_forward_bytes=int(held - output_bytes.get("v", 0)),
                    method=_memory.CPU_METHOD,
                )
    steady: list[tuple[float, float, float]] = []
    for _ in range(steady_steps):
        bare_step(times=steady)
    for i, name in enumerate(("steady_forward_s", "steady_backward_s", "steady_step_s")):
        out.timings[name] = statistics.median(t[i] for t in steady) if steady else 0.0
    out.compiled_later = compat.graphs_compiled(after_first)[0]
    return out


@contextlib.contextmanager
def restoring_process_state(*, reset_dynamo: bool) -> Any:
    """Restore what a measurement may change in the process: compiler configs, Dynamo's LRU switch (its real
    state, read by experiment, put back if the measurement set it), the RNG, Dynamo's counters; `reset_dynamo` also
    forgets compiled graphs before and after (tk.run: its model's code objects are shared with every earlier run)."""
    configs = [(mod, mod.save_config()) for mod in compat.compiler_configs()]
    counters = compat.counters_snapshot()
    lru = compat.lru_cache_restored(compat.lru_cache_enabled())
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    early_stop = compat.checkpoint_early_stop()
    grad_enabled = torch.is_grad_enabled()
    if reset_dynamo:
        compat.reset_dynamo()
    try:
        with lru:
            yield
    finally:
        if reset_dynamo:
            compat.reset_dynamo()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # load_config warns about deprecated keys it sets back
            for mod, blob in configs:
                mod.load_config(blob)
        compat.counters_restore(counters)
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        compat.set_checkpoint_early_stop(early_stop)
        torch.set_grad_enabled(grad_enabled)


@contextlib.contextmanager
def restoring_model_state(model: nn.Module) -> Any:
    """Restore what a training step changes on the model: each parameter's `.grad` (the same tensor object) and
    every buffer's object and values (MoE token counters, running statistics)."""
    grads = [(p, p.grad) for p in model.parameters()]
    buffers = []
    for m in model.modules():
        for name, b in list(m._buffers.items()):
            if isinstance(b, torch.Tensor) and not b.is_meta:
                buffers.append((m, name, b, b.detach().clone()))
    for p, _ in grads:
        p.grad = None
    try:
        yield
    finally:
        for p, g in grads:
            p.grad = g
        with torch.no_grad():
            for m, name, b, value in buffers:
                m._buffers[name] = b
                if b.shape == value.shape:
                    b.copy_(value)
