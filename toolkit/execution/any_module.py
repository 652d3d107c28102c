"""`measure(module, *args)`: one training step of any module as the user built it — their AC, their compile, their
FSDP2 — measured in this process with no side effects on the model or the process."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from .. import compat
from .._config import MAX_STEADY_STEPS, ConfigError, check_bool, check_int, check_strings, check_text
from ..compat import tree_leaves
from ..instrument import numerics as _numerics
from ..instrument.step import StepResult, measured_step, restoring_model_state
from ..measurement.report import (
    Report,
    ScenarioRecord,
    Transforms,
)
from ..stacks.user import default_loss
from ..transforms.naming import (
    canonical_name,
    fsdp_units_inside,
    has_compiled,
    model_packages,
    module_names,
    unwrap,
)
from ..transforms.settings import torch_settings
from .attempt import Attempt, Refused


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

    with Attempt(record, requested=requested, reset_dynamo=False) as a:
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


__all__ = ["measure"]
