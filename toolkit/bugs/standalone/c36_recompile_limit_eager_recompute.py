"""A compiled function switching to eager between a checkpoint's forward and its recompute fails the recompute check.

Symptom: inside a non-reentrant checkpoint (`AC(compile(f))`), the forward packs the tensors the compiled graph saves
(AOTAutograd's choice: transposed weights, the pre-activation, ...); if the recompute then runs `f` eagerly, eager
autograd saves other tensors at the same positions and `torch.utils.checkpoint` raises "CheckpointError: ...
Recomputed values for the following tensors have different metadata than during the forward pass". Two ways to get
the switch on CPU with `backend="aot_eager"`:
- (bug) a wrapper in unsloth's style runs `torch.compile(f)` with `fail_on_recompile_limit_hit=True` and latches to
  eager for good on `FailOnRecompileLimitHit`: the routed experts (T·K rows) run compiled, the shared expert (T rows)
  hits `recompile_limit=1`, the wrapper latches, and the routed region is recomputed eagerly;
- (variant_guard_flip) plain Dynamo, `recompile_limit=1`: a Python global the compiled code guards on changes between
  forward and backward; the recompute misses the guard, cannot recompile and runs eagerly (and the other way round).
Dynamo alone never switches: once the limit is hit it runs the frame eagerly in forward and recompute alike
(variant_limit_only), and compile(AC) replays the recompute inside its compiled backward (variant_compile_outside).

Upstream: unsloth-zoo#1001 (latch deferred to the step boundary), unsloth-zoo#1058 (Gemma4 MLP left eager),
unsloth-zoo#1145 (the last latch arm guarded against open checkpoint regions); no pytorch issue.

Run: python c36_recompile_limit_eager_recompute.py

Shape suffixes: T tokens, K top-k (the routed rows are T·K), D model dim, H expert hidden dim.
"""

import contextlib
import json
import logging
import re

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CASE = "C36"
NEEDS = "cpu"

T, K, D, H = 32, 2, 64, 128


def mlp(x_TD, w1_DH, w2_HD):
    return F.silu(x_TD @ w1_DH) @ w2_HD


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


@contextlib.contextmanager
def _quiet_dynamo():
    # Hitting the limit is the point here; Dynamo's warning about it would only clutter the output.
    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


class EagerOnRecompileLimit:
    """Compiled until Dynamo refuses to recompile, then eager — unsloth-zoo's `_fall_back_to_eager_on_recompile_limit`
    reduced to its latch. `defer=True` is unsloth-zoo#1001's fix: finish this step as it started (the refused call
    runs eagerly once) and switch at the step boundary, when no checkpointed region is waiting for its recompute."""

    def __init__(self, fn, *, defer: bool = False):
        self.fn, self.compiled = fn, torch.compile(fn, backend="aot_eager")
        self.defer, self.eager, self.pending = defer, False, False

    def __call__(self, *args):
        if self.eager:
            return self.fn(*args)
        try:
            return self.compiled(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            if self.defer:
                self.pending = True
            else:
                self.eager = True
            return self.fn(*args)

    def step_boundary(self):
        self.eager, self.pending = self.eager or self.pending, False


def _weights():
    torch.manual_seed(0)
    x_TD = torch.randn(T, D, requires_grad=True)
    w1_DH = (torch.randn(D, H) * 0.1).requires_grad_()
    w2_HD = (torch.randn(H, D) * 0.1).requires_grad_()
    return x_TD, w1_DH, w2_HD


def _moe_step(act) -> torch.Tensor:
    """Routed experts (T·K rows) and shared expert (T rows), each its own checkpointed region, one expert MLP."""
    x_TD, w1_DH, w2_HD = _weights()
    routed_ND = checkpoint(act, x_TD.repeat_interleave(K, dim=0), w1_DH, w2_HD, use_reentrant=False)
    shared_TD = checkpoint(act, x_TD, w1_DH, w2_HD, use_reentrant=False)
    loss = routed_ND.view(T, K, D).sum(1).add(shared_TD).square().sum()
    return torch.autograd.grad(loss, x_TD)[0]


def _latched(*, defer: bool) -> dict:
    torch._dynamo.reset()
    ref_TD = _moe_step(mlp)
    act = EagerOnRecompileLimit(mlp, defer=defer)
    with _quiet_dynamo(), torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        try:
            grad_TD = _moe_step(act)
            act.step_boundary()
            return {"error": None, "eager_after_step": act.eager, "grads_match": bool(torch.allclose(grad_TD, ref_TD))}
        except Exception as e:  # noqa: BLE001 - the error is the observation
            return {"error": _msg(e), "eager_after_step": act.eager, "grads_match": None}


def bug() -> dict:
    """The latch flips on the shared expert's call, after the routed region packed compiled: its recompute runs
    eagerly and the checkpoint's metadata check fails."""
    return _latched(defer=False)


def fix() -> dict:
    """unsloth-zoo#1001: defer the latch to the step boundary; the step finishes with the mode it started in (the
    refused call eager in forward and recompute alike), the next step is eager throughout."""
    return _latched(defer=True)


FLAG = True  # a Python value the compiled code guards on (a debug switch, a schedule flag)


def mlp_flag(x_TD, w1_DH, w2_HD):
    h_TH = x_TD @ w1_DH
    if FLAG:
        h_TH = h_TH + 0.0  # the same numbers either way: only the guard differs
    return F.silu(h_TH) @ w2_HD


def _guard_flip(*, limit: int, back: bool = False, compile_outside: bool = False) -> dict:
    global FLAG
    torch._dynamo.reset()
    x_TD, w1_DH, w2_HD = _weights()
    if compile_outside:
        step = torch.compile(lambda *a: checkpoint(mlp_flag, *a, use_reentrant=False), backend="aot_eager")
    else:
        compiled = torch.compile(mlp_flag, backend="aot_eager")
        step = lambda *a: checkpoint(compiled, *a, use_reentrant=False)  # noqa: E731
    FLAG = True
    with _quiet_dynamo(), torch._dynamo.config.patch(recompile_limit=limit):
        torch._dynamo.utils.counters.clear()
        try:
            if back:
                step(x_TD, w1_DH, w2_HD)  # compiles with FLAG=True
                FLAG = False
                out_TD = step(x_TD, w1_DH, w2_HD)  # guard miss at the limit: this forward runs eagerly
                FLAG = True  # the recompute finds the compiled graph again
            else:
                out_TD = step(x_TD, w1_DH, w2_HD)  # forward compiled
                FLAG = False  # the recompute misses the guard and cannot recompile
            out_TD.sum().backward()
            error = None
        except Exception as e:  # noqa: BLE001
            error = _msg(e)
        finally:
            FLAG = True
        return {"error": error, "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"]}


def variant_guard_flip() -> dict:
    """recompile_limit=1, no wrapper: compiled forward, eager recompute ("compiled_to_eager") and eager forward,
    compiled recompute ("eager_to_compiled"); with the default limit (8) the recompute compiles a second graph."""
    return {
        "compiled_to_eager": _guard_flip(limit=1),
        "eager_to_compiled": _guard_flip(limit=1, back=True),
        "default_limit": _guard_flip(limit=8),
    }


def variant_compile_outside() -> dict:
    """compile(AC(f)) with the same flip: the recompute is part of the compiled backward, no guard is checked."""
    return _guard_flip(limit=1, compile_outside=True)


def variant_limit_only() -> dict:
    """recompile_limit=1 and a new shape, nothing else: Dynamo runs the refused frame eagerly in the forward and in the
    recompute alike (no switch, no error); with fail_on_recompile_limit_hit the forward raises."""
    out = {}
    for name, fail in (("default", False), ("fail_on_limit", True)):
        torch._dynamo.reset()
        compiled = torch.compile(mlp, backend="aot_eager")
        with _quiet_dynamo(), torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=fail):
            try:
                _moe_step(compiled)
                out[name] = None
            except Exception as e:  # noqa: BLE001
                out[name] = _msg(e)
    return out


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_guard_flip", json.dumps(variant_guard_flip()))
    print("variant_compile_outside", json.dumps(variant_compile_outside()))
    print("variant_limit_only", json.dumps(variant_limit_only()))
