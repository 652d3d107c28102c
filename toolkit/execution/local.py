"""`run_here(scenario)`: one training step of a Scenario measured in this process (`toolkit.run`'s in-process half,
and an isolated child's step)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, cast

import torch
from torch import nn

from .. import compat
from ..instrument import numerics as _numerics
from ..instrument.step import StepResult, measured_step
from ..measurement.report import (
    Report,
    ScenarioRecord,
    Transforms,
)
from ..measurement.scenario import Scenario
from ..transforms import ACConfig
from ..transforms.fsdp import process_group
from ..transforms.naming import (
    fsdp_units_inside,
    model_packages,
)
from ..transforms.settings import remat_stand_ins, torch_settings
from .attempt import Attempt
from .build import build, check_ranks_for_ep, transform


def run_here(scenario: Scenario, on_stage: Callable[[str], None] | None = None) -> Report:
    """Build, transform and measure one training step of `scenario` in this process (`toolkit.run` without
    `isolate`; the isolated child's step). Dynamo's compiled graphs are forgotten before and after: the model's
    code objects are shared with every earlier run, whose cache entries would count as recompiles."""
    if scenario.ep > 1:
        check_ranks_for_ep(scenario.ep)
    model = None
    with Attempt(
        ScenarioRecord.of(scenario),
        requested=scenario.recipe is not None or scenario.compile.enabled,
        reset_dynamo=True,
        on_stage=on_stage,
        instrumented=scenario.instrument,
    ) as a:
        stage, group = a.stage, a.stack
        try:
            stage("build")
            t = time.perf_counter()
            world = group.enter_context(process_group())[1] if scenario.fsdp != "none" else 1
            group.enter_context(scenario.stack_impl.step_context(scenario))
            built = build(scenario, sharded=True)
            a.timing["build_s"] = time.perf_counter() - t
            ref_loss = ref_grads = None
            reference = _numerics.reference_for(scenario)
            if scenario.check_numerics and reference.what:
                stage("reference")
                ref = build(scenario, sharded=False)
                if reference.compile is not None:  # compiled the same way by the stack's own code, without AC
                    plain = scenario.replace(ac=ACConfig.of(), compile=reference.compile, fsdp="none", ep=1, name="")
                    transform(plain, ref.model, lambda _stage: None)
                torch.manual_seed(built.seed)
                with torch_settings(ref.model):
                    ref_loss_t = built.loss_of(built.call(ref.model))
                    ref_loss_t.backward()
                ref_loss, ref_grads = float(ref_loss_t.detach().float()), _numerics.grads(ref.model)
                del ref, ref_loss_t
                if reference.compile is not None:
                    compat.reset_dynamo()  # the measured model compiles the same code: no entry of the reference's
            model = built.model
            a.packages = model_packages(model)
            t = time.perf_counter()
            a.orders = transform(scenario, model, stage)
            done = scenario.stack_impl.applied(model)
            if done is not None:
                a.transforms = Transforms(checkpointed=done[0], compiled=done[1])
            a.transforms = replace(a.transforms, **fsdp_units_inside(model, a.transforms.checkpointed))
            a.timing["apply_s"] = time.perf_counter() - t
            a.steps = steps = StepResult()
            called = scenario.stack_impl.called(model)  # torch.compile(model)'s wrapper: no probe hook inside it
            measured_step(
                called,
                lambda: built.call(cast(nn.Module, model)),  # set above; None only after the step, in `finally`
                built.loss_of,
                built.inputs,
                built.device,
                stage,
                seed=built.seed,
                measure_memory=scenario.measure_memory,
                steady_steps=scenario.steady_steps,
                snapshot_path=scenario.memory_snapshot,
                result=steps,
                instrument=scenario.instrument,
                settings=lambda: torch_settings(called),
                remat_stand_ins=remat_stand_ins(called),
            )
            ref_note = "" if ref_loss is None else f"the same model {reference.what}: loss {ref_loss:.4f}"

            def again():
                torch.manual_seed(built.seed)  # the measured forward's RNG stream (router noise, dropout)
                return built.call(model)

            a.check_loss(model, again, built.inputs, built.loss_of, ref_note)
            if not scenario.check_numerics:
                a.numerics = _numerics.not_compared(steps.loss, "check_numerics=False")
            elif ref_grads is None:
                a.numerics = _numerics.not_compared(steps.loss, reference.why)
            elif world > 1:
                a.numerics = _numerics.not_compared(steps.loss, f"FSDP-sharded over {world} ranks: each holds a shard")
            else:
                assert steps.loss is not None and ref_loss is not None  # set by the step and with ref_grads
                a.numerics = _numerics.compare(
                    steps.loss,
                    steps.grads,
                    ref_loss,
                    ref_grads,
                    built.dtype,
                    reference.what + (" or FSDP" if scenario.fsdp != "none" else ""),
                )
                a.numerics = _numerics.unless_the_forward_drew_otherwise(a.numerics, reference, built.dtype)
        finally:
            if model is not None:
                try:
                    scenario.stack_impl.undo(model)
                except Exception as e:  # the step's result stands; say that the model was left transformed
                    a.warn.append(
                        f"could not undo the transforms after the step ({type(e).__name__}: {e}); the "
                        "model was discarded anyway"
                    )
            model = None  # the model (and FSDP's hold on the process group) goes before the group does
    return a.report()


__all__ = ["run_here"]
