"""One training step measured in this process: `run_here(scenario)` and `measure(module, *args)`.

One training step measured in this process — `run_here(scenario)` for a Scenario (`toolkit.run`'s in-process half, and
an isolated child's step) and `measure(module, *args)` for any module as the user built it — each Report assembled the
same way, with no side effects on the user's model or process.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import replace
from typing import Any, Callable, cast

import torch
from torch import nn

from .. import compat
from .._config import MAX_STEADY_STEPS, ConfigError, check_bool, check_int, check_strings, check_text
from ..compat import tree_leaves
from ..instrument import numerics as _numerics
from ..instrument.capture import capture_warnings
from ..instrument.records import Numerics
from ..instrument.step import Stage, StepResult, measured_step, restoring_model_state, restoring_process_state
from ..measurement.report import (
    Report,
    ScenarioRecord,
    Transforms,
)
from ..measurement.scenario import Scenario
from ..stacks.user import default_loss
from ..transforms import ACConfig
from ..transforms.fsdp import process_group
from ..transforms.naming import (
    canonical_name,
    fsdp_units_inside,
    has_compiled,
    model_packages,
    module_names,
    unwrap,
)
from ..transforms.settings import remat_stand_ins, torch_settings
from .assemble import assemble
from .build import build, check_ranks_for_ep, transform


class Refused(ConfigError):
    """A ConfigError that only the step could find (what a `loss_fn` returns): raised to the caller, not kept as the
    Report's error."""


class _Attempt:
    """The skeleton `run_here` and `measure` share: the process state restored and warnings captured around the
    step, an exception in it kept as the result (a failing step is a Report, not a crash), and the Report
    assembled from whatever got that far."""

    def __init__(
        self,
        record: ScenarioRecord,
        *,
        requested: bool,
        reset_dynamo: bool,
        on_stage: Callable[[str], None] | None = None,
        instrumented: bool = True,
    ):
        self.record, self.requested, self.reset_dynamo = record, requested, reset_dynamo
        self.instrumented = instrumented
        self.stage = Stage(on_stage)
        self.warn: list[str] = []
        self.timing: dict[str, float] = {}
        self.orders: dict[str, str] = {}
        self.transforms = Transforms()
        self.packages: tuple[str, ...] = ()
        """What the model is made of (`naming.model_packages`), set once it is built."""
        self.steps: StepResult | None = None
        self.numerics: Numerics | None = None
        self.err: BaseException | None = None
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> "_Attempt":
        self.stack.enter_context(restoring_process_state(reset_dynamo=self.reset_dynamo))
        self.stack.enter_context(capture_warnings(self.warn))
        return self

    def __exit__(self, kind, err, tb) -> bool:
        # The scenario failing is a result; KeyboardInterrupt & co. are not, and neither is an input refused
        # once the step showed it bad (a loss_fn returning a float): that goes to the caller as the ConfigError it is.
        caught = isinstance(err, Exception) and not isinstance(err, Refused)
        if caught:
            self.err = err
            if self.steps is not None and self.steps.loss is not None:
                self.numerics = Numerics(loss=self.steps.loss)
        self.stack.close()
        return caught

    def check_loss(self, model: nn.Module, forward: Callable[[], Any], inputs: Any, loss_of, reference: str) -> None:
        """A NaN or infinite loss: raise NonFiniteLoss naming where the first non-finite value appears (an eager
        re-run with hooks), so the Report says that instead of a gradient mismatch."""
        loss = self.steps.loss if self.steps is not None else None
        if loss is None or math.isfinite(loss):
            return
        self.stage.name = "forward"  # where the value came from; the stage line is not told again
        where = _numerics.first_non_finite(model, forward, inputs, loss_of)
        raise _numerics.NonFiniteLoss(_numerics.non_finite_message(loss, where, reference))

    def report(self) -> Report:
        return assemble(
            instrumented=self.instrumented,
            record=self.record,
            stage=self.stage,
            steps=self.steps,
            err=self.err,
            warn=self.warn,
            timing=self.timing,
            packages=self.packages,
            requested=self.requested,
            orders=self.orders,
            numerics=self.numerics,
            transforms=self.transforms,
        )


def run_here(scenario: Scenario, on_stage: Callable[[str], None] | None = None) -> Report:
    """Build, transform and measure one training step of `scenario` in this process (`toolkit.run` without
    `isolate`; the isolated child's step). Dynamo's compiled graphs are forgotten before and after: the model's
    code objects are shared with every earlier run, whose cache entries would count as recompiles."""
    if scenario.ep > 1:
        check_ranks_for_ep(scenario.ep)
    model = None
    with _Attempt(
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
                    plain = scenario.replace(ac=ACConfig(), compile=reference.compile, fsdp="none", ep=1, name="")
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


def measure(
    module_or_fn: nn.Module | Callable,
    *args: Any,
    loss_fn: Callable[[Any], torch.Tensor] | None = None,
    name: str = "",
    reference: str | None = "auto",
    cold: bool = False,
    measure_memory: bool = True,
    steady_steps: int = 0,
    forward_kwargs: dict[str, Any] | None = None,
    checkpointed: tuple[str, ...] | list[str] = (),
    **kwargs: Any,
) -> Report:
    """Measure one training step of any module or callable exactly as given (your own AC / compile / FSDP included):
    `measure(model, *args, **kwargs)` calls `model(*args, **kwargs)` (`forward_kwargs=` carries keyword inputs whose
    names clash with the options here).

    `loss_fn(output)` makes the scalar to differentiate; by default a `loss` the output carries is used
    (transformers' `ModelOutput` given `labels=`), a scalar output as is, and any other output `o` becomes
    `o.float().square().mean()` (a dense gradient, unlike `sum()`). Saved tensors are counted
    at the end of the forward, before the loss, so the loss's own saved tensors are not included.

    Side effects: none on your model or process — gradients, buffers (token counters), RNG, compiler configs,
    Dynamo's LRU switch and counters are as before, and compiled code stays (a warm model is measured warm).
    `cold=True` forgets Dynamo's compiled graphs first, so the step compiles afresh and graph breaks and
    recompiles are seen (your next step then compiles again). `reference="auto"` compares gradients with a deep
    copy run eagerly without checkpoint wrappers (`None` skips it; FSDP-sharded models are not compared).

    `checkpointed` names the modules your code asked AC to checkpoint (names as `model.named_modules()` gives them;
    wrapper segments such as `_checkpoint_wrapped_module` and `_orig_mod` may be left out). Any that runs in the
    step with no checkpoint around it is a silent failure, `module_left_unwrapped`, named on the first line: a
    compile path that skipped a module when it wrapped the others (NVIDIA-NeMo/Automodel#3213's class).
    """
    own = "measure"
    if loss_fn is not None and not callable(loss_fn):
        raise ConfigError(own, "loss_fn", f"{loss_fn!r} is not callable.", "pass a function output -> scalar tensor.")
    if reference not in ("auto", None):
        raise ConfigError(own, "reference", f"{reference!r} is not 'auto' or None.", "pass 'auto' or None.")
    if not callable(module_or_fn):
        raise ConfigError(
            own,
            "module_or_fn",
            f"{type(module_or_fn).__name__} is not callable.",
            "pass an nn.Module or a function of the inputs.",
        )
    for opt, value in (("cold", cold), ("measure_memory", measure_memory)):
        check_bool(own, opt, value)
    check_text(own, "name", name)
    check_int(own, "steady_steps", steady_steps, 0, MAX_STEADY_STEPS, "timing steps after the measured one")
    if forward_kwargs is not None and (
        not isinstance(forward_kwargs, dict) or not all(isinstance(k, str) for k in forward_kwargs)
    ):
        raise ConfigError(
            own,
            "forward_kwargs",
            f"{type(forward_kwargs).__name__} is not a dict of keyword inputs.",
            "pass e.g. forward_kwargs={'attention_mask': mask}, or None.",
        )
    asked = _asked_modules(module_or_fn, checkpointed)
    call_kwargs = {**(forward_kwargs or {}), **kwargs}
    model = module_or_fn if isinstance(module_or_fn, nn.Module) else nn.Module()
    leaves = [t for t in tree_leaves((args, call_kwargs)) if isinstance(t, torch.Tensor)]
    _check_inputs(module_or_fn, model, leaves)
    loss_of = _checked_loss(loss_fn) if loss_fn is not None else default_loss
    device = next((t.device for t in leaves), None) or next((p.device for p in model.parameters()), torch.device("cpu"))
    requested = has_compiled(model) or hasattr(module_or_fn, "_torchdynamo_orig_callable")
    label = name or type(module_or_fn).__name__
    record = ScenarioRecord(
        name=label,
        measured="module",
        ac_mode="unknown",
        stack="user",
        compile_scope="user" if requested else "none",
        backend="user" if requested else "eager",
    )

    def forward():
        return module_or_fn(*args, **call_kwargs)

    with _Attempt(record, requested=requested, reset_dynamo=False) as a:
        a.transforms = Transforms(checkpointed=asked, **fsdp_units_inside(model, asked))
        a.packages = model_packages(model)
        a.stack.enter_context(restoring_model_state(model))
        if cold:
            compat.reset_dynamo()
        rng = torch.random.get_rng_state()
        ref_result, why = None, "reference=None"
        if reference == "auto" and isinstance(module_or_fn, nn.Module):
            ref, why = _numerics.eager_copy(module_or_fn)
            if ref is not None:
                a.stage("reference")  # the model's own forward runs first here: an error in it is not the build's
                ref_result = _numerics.reference_run(ref, lambda: ref(*args, **call_kwargs), loss_of)
                del ref
        elif reference == "auto":
            why = "a callable, not a module: nothing to copy as a reference"
        torch.random.set_rng_state(rng)  # the measured step sees the same RNG stream as the reference
        a.steps = steps = StepResult()
        measured_step(
            model,
            forward,
            loss_of,
            (args, call_kwargs),
            device,
            a.stage,
            measure_memory=measure_memory,
            steady_steps=steady_steps,
            result=steps,
            settings=lambda: torch_settings(model),
        )
        if ref_result is not None:
            ref_note = f"the reference ({ref_result[2]}): loss {ref_result[0]:.4f}"
        else:
            ref_note = ""
        a.check_loss(model, forward, (args, call_kwargs), loss_of, ref_note)
        draws = steps.probes.draws_compiled if steps.probes is not None else False
        if ref_result is not None and draws is not False:
            # Compiled code draws its random numbers otherwise than the eager copy: not a mismatch, and not a match
            # either. A recompute's new draws are still found (Recompute.redrawn), which is the failure that matters.
            a.numerics = _numerics.not_compared(
                steps.loss,
                "the step draws random numbers inside compiled code, which the eager copy draws otherwise"
                if draws
                else "a compiled graph compiled before the step may draw random numbers, which the eager copy would "
                "draw otherwise (cold=True reads every graph)",
            )
        elif ref_result is not None:
            assert steps.loss is not None  # measured_step sets it before it returns
            a.numerics = _numerics.compare(
                steps.loss, steps.grads, ref_result[0], ref_result[1], _numerics.param_dtype(model), ref_result[2]
            )
        else:
            a.numerics = _numerics.not_compared(steps.loss, why)
    return a.report()


def _asked_modules(module_or_fn: Any, checkpointed: Any) -> tuple[str, ...]:
    """`measure(checkpointed=...)` as canonical names, each one a module of the model, refused before anything runs."""
    names = check_strings("measure", "checkpointed", checkpointed, "('layers.0', 'layers.1')", non_empty=False)
    if not names:
        return ()
    if not isinstance(module_or_fn, nn.Module):
        raise ConfigError(
            "measure",
            "checkpointed",
            "names modules, but what is measured is a function, not an nn.Module.",
            "measure the module itself, or leave checkpointed out.",
        )
    known = set(module_names(module_or_fn).values())
    asked = tuple(dict.fromkeys(canonical_name(n) for n in names))
    unknown = [n for n in asked if n not in known]
    if unknown:
        near = sorted(k for k in known if k.count(".") <= 1 and k)[:6]
        raise ConfigError(
            "measure",
            "checkpointed",
            f"names {', '.join(repr(n) for n in unknown[:4])}, which {'is' if len(unknown) == 1 else 'are'} not a "
            f"module of this model.",
            f"pass names as model.named_modules() gives them (e.g. {', '.join(near) or 'its submodules'}).",
        )
    return asked


def _check_inputs(module_or_fn: Any, model: nn.Module, leaves: list[torch.Tensor]) -> None:
    """Inputs that would measure nothing true, refused before anything runs: tensors on another device than the
    parameters (meta tokens for a CPU model ran "ok" with a NaN loss and meta memory), a step with nothing to
    differentiate (no parameter, no input requiring grad), token ids outside the toolkit model's vocabulary."""
    own = "measure"
    params = list(model.parameters())
    devices = {p.device for p in params}
    for i, t in enumerate(leaves):
        if devices and t.device not in devices and not (t.dim() == 0 and t.device.type == "cpu"):
            where = ", ".join(sorted(map(str, devices)))
            raise ConfigError(
                own,
                "args",
                f"input tensor {i} is on {t.device}, the model's parameters on {where}: the step would measure "
                f"{t.device} tensors against {where} weights.",
                f"move the inputs with .to({where.split(', ')[0]!r}), or the model to {str(t.device)!r}.",
            )
    # A callable's parameters are its closure's, out of sight: only a module is known to have none.
    is_module = isinstance(module_or_fn, nn.Module)
    if is_module and not any(p.requires_grad for p in params) and not any(t.requires_grad for t in leaves):
        what = type(module_or_fn).__name__
        has = "has no parameters" if not params else "has no parameter that requires grad"
        raise ConfigError(
            own,
            "module_or_fn",
            f"{what} {has} and no input requires grad, so a training step has nothing to differentiate.",
            "pass a module with trainable parameters, or inputs with requires_grad=True.",
        )
    from ..models import Transformer
    from ..models.transformer import check_tokens

    inner = unwrap(model)
    if isinstance(inner, Transformer):
        for t in leaves:
            if not t.is_floating_point():
                check_tokens(inner.config, t, own)


def _checked_loss(loss_fn: Callable[[Any], Any]) -> Callable[[Any], torch.Tensor]:
    """`loss_fn` with what it returns checked: a scalar tensor that requires grad, or a Refused naming it."""
    name = getattr(loss_fn, "__name__", None) or type(loss_fn).__name__

    def loss_of(output: Any) -> torch.Tensor:
        loss = loss_fn(output)
        if not isinstance(loss, torch.Tensor):
            problem = f"returned a {type(loss).__name__} ({str(loss)[:40]}), not a tensor"
        elif loss.numel() != 1:
            problem = f"returned a tensor of shape {tuple(loss.shape)}, not a scalar"
        elif not loss.requires_grad:
            problem = "returned a tensor that does not require grad (detached from the output, or made by .item())"
        else:
            return loss
        raise Refused(
            "measure",
            "loss_fn",
            f"loss_fn ({name}) {problem}: backward needs one number that depends on the output.",
            "return a scalar tensor made from the output, e.g. loss_fn=lambda out: out.float().square().mean().",
        )

    return loss_of


__all__ = ["run_here", "measure", "Refused"]
