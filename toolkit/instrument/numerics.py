"""Gradients against a reference: the same model eager without AC, or an eager copy of a user's module.

Gradients against a reference: the same model eager without AC (`tk.run`), or a deep copy of a user's module run eagerly
with its checkpoint wrappers removed (`tk.measure`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from .. import compat
from ..instrument.records import Numerics
from ..transforms.naming import RECOMPUTES_FORWARD, canonical_name, is_compiled, is_wrapper, named_modules, unwrap


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Canonical parameter name → a float copy of its gradient (DTensor gradients as their local shard)."""
    return {
        canonical_name(n): compat.local_tensor(p.grad).detach().float().clone()
        for n, p in model.named_parameters()
        if p.grad is not None
    }


def tolerance(dtype: torch.dtype) -> tuple[float, float]:
    return (1e-4, 1e-5) if dtype == torch.float32 else (5e-2, 5e-2)


def compare(
    loss: float,
    got: dict[str, torch.Tensor],
    ref_loss: float,
    ref_grads: dict[str, torch.Tensor],
    dtype: torch.dtype,
    reference: str,
) -> Numerics:
    rtol, atol = tolerance(dtype)
    worst, worst_diff, ok = "", 0.0, True
    for name, ref in ref_grads.items():
        g = got.get(name)
        if g is None or g.shape != ref.shape:
            ok = False
            continue
        diff = (g - ref).abs()
        d = diff.max().item() if diff.numel() else 0.0
        if d > worst_diff or not worst:
            worst, worst_diff = name, d
        if not bool((diff <= atol + rtol * ref.abs()).all()):
            ok = False
    missing = tuple(sorted(set(ref_grads) - set(got)))
    loss_diff = abs(loss - ref_loss)
    ok = ok and loss_diff <= atol + rtol * abs(ref_loss)
    return Numerics(
        loss=loss,
        reference_loss=ref_loss,
        loss_diff=loss_diff,
        max_grad_diff=worst_diff,
        worst_param=worst,
        grads_match=ok and not missing,
        missing_grads=missing,
        reference=reference,
    )


def _class_forward_under(m: nn.Module) -> bool:
    """Is the instance's `forward` a chain of `functools.wraps` wrappers around its class's forward (what
    `torch_remat.checkpoint(...)(module.forward)`, the toolkit's regions and `torch.compile(module.forward)`
    make)?"""
    f, seen, own = m.__dict__["forward"], 0, getattr(type(m), "forward", None)
    while f is not None and seen < 16:
        if f is own or getattr(f, "__func__", None) is own:  # torch.compile keeps the plain function
            return True
        f, seen = getattr(f, "__wrapped__", None), seen + 1
    return False


class Reference(NamedTuple):
    """What a scenario's gradients are compared with: `compile`, the compile the reference model gets (None: eager),
    and `what` the Report says it was; `why` instead when there is none (`compile` None and `what` "")."""

    compile: Any
    what: str
    why: str = ""


def reference_for(scenario: Any) -> Reference:
    """The run a scenario's gradients are compared with.

    The same model eager without AC, when that draws the same numbers: always, unless the step draws random numbers
    (dropout, router noise) inside compiled code, which draws them otherwise than eager does (a benign difference,
    never a mismatch). Then the same model compiled the same way without AC, whose compiled code draws as the
    measured step's does; a recompute that draws new numbers is found either way (`Recompute.redrawn`). A compiled
    recipe, or compile with no AC, has no such reference."""
    compiled = bool(scenario.recipe) or scenario.compile.enabled
    draws = scenario.stack_impl.draws_random(scenario.config)
    if not (compiled and draws):
        return Reference(None, "eager without AC")  # the words every Report has always shown
    if scenario.recipe or scenario.ac.mode == "none":
        return Reference(
            None,
            "",
            "the step draws random numbers inside compiled code, which an eager run draws otherwise, and it has no AC "
            "to take away for a compiled reference; a recompute's new draws are still checked",
        )
    return Reference(
        scenario.compile.replace(order=None),
        "compiled the same way without AC (the compiled code draws random numbers, which eager draws otherwise)",
    )


def unless_the_forward_drew_otherwise(n: Numerics, reference: Reference, dtype: torch.dtype) -> Numerics:
    """A compiled reference is exact only while the step's compiled code draws the numbers it draws: a recompute that
    draws again leaves the forward, so the loss, as it was. Where the losses differ, the compiled checkpoint itself
    drew otherwise (inductor functionalizes the RNG of a checkpointed region, from torch 2.14): a benign difference,
    so not compared, saying by how much; a recompute's new draws are named apart (`Recompute.redrawn`)."""
    if reference.compile is None or n.grads_match is not False:
        return n
    rtol, atol = tolerance(dtype)
    if n.loss_diff is None or n.loss_diff <= atol + rtol * abs(n.reference_loss or 0.0):
        return n
    return not_compared(
        n.loss,
        f"the compiled code with AC draws its random numbers otherwise than the same compile without AC (the losses "
        f"differ by {n.loss_diff:.1e}), so no run draws what this one drew; a recompute's new draws are still checked",
    )


def not_compared(loss: float | None, why: str) -> Numerics:
    return Numerics(loss=loss, grads_match=None, reference=why)


def param_dtype(model: nn.Module) -> torch.dtype:
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    return torch.float32 if dtypes <= {torch.float32} else min(dtypes, key=lambda d: torch.finfo(d).bits)


def eager_copy(model: nn.Module) -> tuple[nn.Module | None, str]:
    """A deep copy of `model` with its compile and checkpoint wrappers removed, to run as the reference; or None
    and why it cannot be made (FSDP-sharded modules, copies that fail)."""
    if any(compat.is_fsdp_module(m) for m in model.modules()):
        return None, "an FSDP-sharded model: a reference copy would need its own process group"
    try:
        ref = copy.deepcopy(model)
    except Exception as e:
        return None, f"the model cannot be deep-copied ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    ref = unwrap(ref)
    for name, m in list(ref.named_modules()):
        if "forward" in m.__dict__:
            # A forward replaced on the instance (torch_remat's checkpoint or region, by the toolkit or by hand) is
            # a function: deepcopy keeps it as is, so the copy would still call the *original* module.
            if not _class_forward_under(m):
                return None, (
                    f"{name or 'the model'}'s forward is replaced by a function that does not wrap its "
                    "class's forward, so a copy cannot run without it"
                )
            del m.__dict__["forward"]
            m.__dict__.pop(RECOMPUTES_FORWARD, None)
        if compat.in_place_compiled(m):
            compat.clear_in_place_compile(m)  # a copied compiled call would still run the original module
        for name, child in list(m._modules.items()):
            if child is not None and is_wrapper(child):
                m._modules[name] = unwrap(child)
    if any(is_compiled(m) or is_wrapper(m) for m in ref.modules()):
        return None, "compile or checkpoint wrappers could not be removed from the copy"
    return ref, ""


def reference_run(
    ref: nn.Module, forward: Callable[..., Any], loss_of: Callable[[Any], torch.Tensor]
) -> tuple[float, dict[str, torch.Tensor], str]:
    """Run `forward` (which calls `ref`) under `force_eager`, so no compiled code or cache entry is touched, with
    function-form non-reentrant checkpoints running as plain calls; returns loss, grads and what the reference was."""
    ref.zero_grad(set_to_none=True)
    with torch.compiler.set_stance("force_eager"), compat.non_reentrant_checkpoints_disabled() as disabled:
        loss = loss_of(forward())
        loss.backward()  # type: ignore[no-untyped-call]  # unannotated in torch
    what = (
        "eager: a deep copy without checkpointing"
        if disabled
        else "eager: a deep copy without checkpoint wrappers (function-form checkpoints kept)"
    )
    return float(loss.detach().float()), grads(ref), what


class NonFiniteLoss(ArithmeticError):
    """The step's loss is NaN or infinite: no gradient comparison means anything, so the Report says so and where the
    first non-finite value appeared, instead of calling it a gradient mismatch."""


def _non_finite(x: Any) -> bool:
    return any(
        isinstance(t, torch.Tensor) and t.is_floating_point() and not t.is_meta and not bool(torch.isfinite(t).all())
        for t in compat.tree_leaves(x)
    )


def first_non_finite(
    model: nn.Module,
    forward: Callable[[], Any],
    inputs: Any = (),
    loss_of: Callable[[Any], Any] | None = None,
) -> str:
    """Where a non-finite value first appears, in words: an input, a parameter or buffer, the output of the first
    module to finish with one, or the loss (an eager, no-grad re-run of `forward` with a forward hook on every
    module; the RNG state is restored after). "" when the eager re-run is finite throughout (the value comes from
    what the step added: compile, checkpointing)."""
    leaves = [t for t in compat.tree_leaves(inputs) if isinstance(t, torch.Tensor)]
    for i, t in enumerate(leaves):
        if _non_finite(t):
            return f"input tensor {i} (shape {tuple(t.shape)}) already holds non-finite values"
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if _non_finite(t.detach()):
            return f"{canonical_name(name)} holds non-finite values before the step"
    names = {id(m): n or "the model" for n, m in named_modules(model)}
    found: list[str] = []
    running: list[str] = []

    def before(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        name = names[id(module)]
        if not found and running and _non_finite((args, kwargs)):
            # Finite until its caller's own code ran: the value was made there, between the caller's submodules.
            found.append(f"the forward of {running[-1]} itself (its own ops, before it calls {name})")
        running.append(name)

    def after(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        running.pop()
        if not found and _non_finite(output):
            found.append(f"the output of {names[id(module)]}")

    handles = []
    for m in model.modules():
        if id(m) in names:
            handles.append(m.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(m.register_forward_hook(after))
    rng = torch.random.get_rng_state()
    try:
        with torch.no_grad(), torch.compiler.set_stance("force_eager"):
            out = forward()
    except Exception as e:  # the diagnosis is best effort: its failure must not hide the step's result
        return f"(not located: the eager re-run raised {type(e).__name__})"
    finally:
        for h in handles:
            h.remove()
        torch.random.set_rng_state(rng)
    if found:
        return found[0]
    if _non_finite(out):
        return "the model's output"
    if loss_of is not None:
        try:
            with torch.no_grad():
                if _non_finite(loss_of(out)):
                    return "the loss function's result (the model's output is finite)"
        except Exception as e:  # the diagnosis is best effort: its failure must not hide the step's result
            return f"(not located: the loss function raised {type(e).__name__} on the eager re-run)"
    return ""


def non_finite_message(loss: float, where: str, reference: str = "") -> str:
    """The error message of a non-finite loss: the value, where it first appears, and the reference's loss."""
    at = (
        f"first non-finite value: {where}"
        if where
        else "the same forward run eagerly is finite everywhere, so the loss function or what the step added "
        "(compile, checkpointing) made it"
    )
    return f"the loss is {loss} ({at})" + (f"; {reference}" if reference else "") + "."
