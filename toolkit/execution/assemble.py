"""A Report assembled from what one attempt at a step showed: the probes' records, its error, warnings, blind spots.

The user-facing notes a Report may carry (a warm model, C31 on a +cpu build, a bare run) are written here once.
"""

from __future__ import annotations

import dataclasses

from .. import compat
from ..instrument.records import Memory, Numerics
from ..instrument.step import Stage, StepResult
from ..measurement.explain import explain, is_checkpoint_error
from ..measurement.report import (
    CompileInfo,
    Distributed,
    ErrorInfo,
    Recompute,
    Report,
    Saved,
    ScenarioRecord,
    Timing,
    Transforms,
)
from .machine import environment


def _saved(census) -> Saved:
    tensors = census.tensors
    by_module: dict[str, int] = {}
    by_op: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    for t in tensors:
        by_module[t.module] = by_module.get(t.module, 0) + t.bytes
        by_op[t.op] = by_op.get(t.op, 0) + t.bytes
        by_kind[t.kind] = by_kind.get(t.kind, 0) + t.bytes
    return Saved(
        tensors=tensors,
        total_bytes=sum(t.bytes for t in tensors),
        by_module=by_module,
        by_op=by_op,
        by_kind=by_kind,
        params_bytes=census.params_bytes,
    )


_WARM_NOTE = (
    "graph breaks and recompiles of graphs compiled before the step: Dynamo reports them only when it "
    "compiles (measure(..., cold=True) recompiles to see them)"
)


_REMAT_PLACEHOLDER_NOTE = (
    "case C31, a CPU-build limit, not your model: torch_remat's placeholder for a kept region's output needs "
    "torch._C._set_storage_data_ptr_access_error_msg, which only CUDA builds of torch have (the 2.14.1 wheel has it "
    "even without a GPU), so on a +cpu build the recompute raises AttributeError. Mark the output with "
    "torch_remat.recompute_needs_tensor(...) (it is then kept instead) or use a CUDA build."
)


_BARE_NOTE = (
    "this was a bare run (Scenario.instrument=False): none of the toolkit's probes ran, so saved tensors, recompute "
    "and memory were not measured; the outcome, gradients, and Dynamo's own count of graphs and breaks were"
)

_REMAT_STAND_IN_NOTE = (
    "on this +cpu torch build the toolkit stands in for torch_remat's placeholders while a step of a model with its "
    "remat applied runs (C31: the build lacks the helper they need): a kept region's output that nothing reads in "
    "replay is a NaN-filled buffer made in backward instead of an AttributeError; saved bytes are unchanged"
)


def assemble(
    *,
    instrumented: bool = True,
    record: ScenarioRecord,
    stage: Stage,
    steps: StepResult | None,
    err: BaseException | None,
    warn: list[str],
    timing: dict,
    requested: bool,
    orders: dict,
    numerics: Numerics | None,
    transforms: Transforms,
    packages: tuple[str, ...] = (),
) -> Report:
    """The Report of one attempt at a step: what the probes saw (nothing, when it failed before they ran), its
    error, warnings and blind spots."""
    error = None
    if err is not None:
        msg = str(err).strip() or repr(err)
        error = ErrorInfo(
            type=f"{type(err).__module__}.{type(err).__qualname__}".replace("builtins.", ""),
            message=msg[:4000],
            stage=stage.name,
        )
    if steps is not None and (steps.aot_autograd or steps.compiled_in_step):
        # The step ran compiled code: compile was asked for, whoever asked (a function compiled inside a user's
        # module, which no look at the model finds, C8's expert).
        requested = True
    saved, recompute, comp, memory = Saved(), Recompute(), CompileInfo(requested=requested, orders=orders), Memory()
    blind: list[str] = []
    if steps is not None:
        if steps.census is not None:
            saved = _saved(steps.census)
        p = steps.probes
        if p is not None:
            transforms = dataclasses.replace(
                transforms,
                under_checkpoint=p.under_checkpoint,
                unresolved=p.checkpoint_unresolved,
            )
            recompute = Recompute(
                ops=sum(p.recompute_by_op.values()),
                by_op=p.recompute_by_op,
                by_module=p.recompute_by_module,
                bookkeeping=sum(p.bookkeeping_by_op.values()),
                bookkeeping_by_op=p.bookkeeping_by_op,
                compiled_reruns=p.compiled_reruns,
                in_compiled_backward=p.in_compiled_backward,
                flops=p.recompute_flops,
                forward_flops=p.forward_flops,
                redrawn=p.redrawn,
            )
            graphs = max(p.graphs_run, steps.compiled_total)
            without = p.regions_without_graphs if requested else ()
            eager_checkpoints = p.eager_checkpoints if requested else ()
            warm = p.warm_graphs + (p.unknown_age_graphs if not steps.compiled_in_step else 0)
            comp = CompileInfo(
                requested=requested,
                graphs=graphs,
                compiled_in_step=steps.compiled_in_step,
                warm_graphs=warm,
                compiled_later=steps.compiled_later,
                graph_breaks=steps.graph_breaks,
                breaks=p.breaks,
                recompiles=p.recompiles,
                fell_back_to_eager=bool(requested and (without or eager_checkpoints or graphs == 0)),
                regions_without_graphs=tuple(without),
                eager_checkpoints=tuple(eager_checkpoints),
                orders=orders,
            )
            names = list(p.blind_spots) + list(steps.census.blind if steps.census is not None else ())
            # A feature this torch lacks is named by its `compat` entry; what a probe failed to read in this step
            # comes as its own sentence.
            blind = [compat.blind_spot(name) if name in compat.FEATURES else name for name in dict.fromkeys(names)]
            if warm and not steps.compiled_in_step:
                blind.append(_WARM_NOTE)
            unplaced = transforms.unplaced
            if unplaced:
                where = ", ".join(r or "<model>" for r in transforms.unresolved)
                blind.append(
                    f"whether {', '.join(unplaced[:6])}{' …' if len(unplaced) > 6 else ''} ran under a checkpoint, as "
                    f"AC was asked: checkpoints ran inside compiled {where}, where no module hook is (the `eager` "
                    "backend runs them there eagerly), or in a graph whose forward was not read"
                )
        elif not instrumented:
            # A bare run: Dynamo's own counters give the graphs and breaks; nothing else was watched.
            graphs = steps.compiled_total
            comp = CompileInfo(
                requested=requested,
                graphs=graphs,
                compiled_in_step=steps.compiled_in_step,
                graph_breaks=steps.graph_breaks,
                fell_back_to_eager=bool(requested and graphs == 0),
                orders=orders,
            )
            blind.append(_BARE_NOTE)
        if steps.memory is not None:
            memory = steps.memory
        elif steps.census is not None and not compat.available("profiler_allocations") and err is None:
            blind.append(compat.blind_spot("profiler_allocations"))
    if steps is not None and steps.probes is None and instrumented and (steps.compiled_total or steps.graph_breaks):
        # A step that failed before its probes were read: what Dynamo's own counters saw up to the failure.
        comp = dataclasses.replace(
            comp, graphs=steps.compiled_total, compiled_in_step=steps.compiled_in_step, graph_breaks=steps.graph_breaks
        )
    if steps is not None and steps.memory_budget is not None:
        # Read as the step began: a step that failed while compiling (C58) ran under it too.
        comp = dataclasses.replace(comp, memory_budget=steps.memory_budget)
    if steps is not None and steps.aot_autograd is not None:
        comp = dataclasses.replace(comp, aot_autograd=steps.aot_autograd)
    if steps is not None:
        # What the step showed, up to where it ended (a failed step included), for the regions the transforms named
        # none (a model the toolkit did not build); configured orders stand where both exist.
        if requested:
            comp = dataclasses.replace(comp, orders={**steps.observed_orders, **comp.orders})
        transforms = dataclasses.replace(transforms, selective=steps.observed_selective)
    if error is not None and "_set_storage_data_ptr_access_error_msg" in error.message:
        warn.insert(0, _REMAT_PLACEHOLDER_NOTE)
    divergence = None
    if is_checkpoint_error(err):
        divergence = explain(err, steps.checkpoints if steps is not None else None)
        warn[:0] = divergence.warnings()  # the first warning lines say what diverged and why
    if steps is not None and steps.remat_stand_ins:
        warn.append(_REMAT_STAND_IN_NOTE)
    t = steps.timings if steps is not None else {}
    import torch.distributed as dist

    # The rank is known even when the step failed (a rank's error row must say which rank it is).
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    calls = steps.probes.collectives if steps is not None and steps.probes is not None else {}
    dist_info = Distributed(rank=rank, world_size=world, collectives=calls)
    return Report(
        outcome="ok" if err is None else "error",
        error=error,
        warnings=tuple(dict.fromkeys(warn)),
        scenario=record,
        environment=environment(),
        saved=saved,
        recompute=recompute,
        compile=comp,
        memory=memory,
        numerics=numerics or Numerics(),
        blind_spots=tuple(dict.fromkeys(blind)),
        distributed=dist_info,
        transforms=transforms,
        checkpoint_error=divergence,
        packages=packages,
        timing=Timing(
            build_s=round(timing.get("build_s", 0.0), 4),
            apply_s=round(timing.get("apply_s", 0.0), 4),
            compile_s=round(steps.probes.compile_s, 4) if steps and steps.probes else 0.0,
            **{
                k: round(t.get(k, 0.0), 4)
                for k in (
                    "first_step_s",
                    "first_forward_s",
                    "first_backward_s",
                    "steady_step_s",
                    "steady_forward_s",
                    "steady_backward_s",
                )
            },
        ),
    )
