"""A dispatch mode active only during backward breaks the recompute of SAC(compile(x)).

Symptom: a `torch.compile`d MLP inside a selective-checkpoint region runs fine, but running its backward under
`FlopCounterMode` fails with "aten.view.default encountered during backward but not found in storage" (a plain
`TorchDispatchMode` fails with "Recomputed values ... have different metadata" instead): under a mode whose
`ignore_compile_internals()` is False, Dynamo does not run the compiled code, so the recompute runs the module
eagerly and its op stream / saved tensors no longer match what the compiled forward recorded (the first op that
differs is an `aten.view` added by FlopCounterMode's ModuleTracker hooks). A mode whose
`ignore_compile_internals()` classmethod returns True is safe (`fix`); running the forward under the same
FlopCounterMode also works (`variant_same_mode_forward`, torchtitan's fix) but only because then nothing is compiled.
With Inductor and `wrap_inductor_compiled_regions=True` the safe mode must also set
`supports_higher_order_operators = True`, or backward fails with "NotImplementedError: There was no rule registered
for HigherOrderOperator inductor_compiled_code and mode ..." (checked on 2.13, not exercised here).

Upstream: torchtitan#3098 (torchtitan@42b7364: SAC unit test runs the forward under the FLOP counter too);
pytorch#161648 (`ignore_compile_internals`, Aug 2025).

Run: python c09_probes_perturb_recompute.py

Shape suffixes: T tokens, D model dim, H hidden dim (x_TD is [T, D]).
"""

import collections
import functools
import json
import re
import warnings

import torch
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
from torch.utils.flop_counter import FlopCounterMode

CASE = "C9"
NEEDS = "cpu"

D, H, T = 64, 128, 32


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _op_in(error: str | None) -> str | None:
    m = re.search(r"(\S+) encountered during backward but not found in storage", error or "")
    return m.group(1) if m else None


def _policy(ops, ctx, op, *args, **kwargs):
    ops.append(str(op))
    if op in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class PlainMode(TorchDispatchMode):
    """What an ad-hoc probe looks like: `ignore_compile_internals()` keeps its default, False."""

    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


class InfraMode(PlainMode):
    """Same probe, declared safe for compiled code: Dynamo switches it off while compiling and back on when the
    compiled artifact runs, so the recompute executes the same compiled graph as the forward."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True


def _setup():
    torch._dynamo.reset()
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(D, H), nn.SiLU(), nn.Linear(H, D))
    x_TD = torch.randn(T, D, requires_grad=True)
    return mlp, x_TD


def _grads(mlp, x_TD):
    out = [p.grad.clone() for p in mlp.parameters()] + [x_TD.grad.clone()]
    mlp.zero_grad(set_to_none=True)
    x_TD.grad = None
    return out


def _eager_grads(mlp, x_TD):
    mlp(x_TD).sum().backward()
    return _grads(mlp, x_TD)


def _match(a, b) -> bool:
    return all(torch.allclose(g, r, rtol=1e-5, atol=1e-6) for g, r in zip(a, b))


def _step(mode_factory, *, forward_under_mode: bool) -> dict:
    """SAC(compile(mlp)): forward (optionally under the mode), then backward under the mode."""
    mlp, x_TD = _setup()
    ref = _eager_grads(mlp, x_TD)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(mlp, backend=counter)
    fwd_ops = []
    context_fn = functools.partial(create_selective_checkpoint_contexts, functools.partial(_policy, fwd_ops))
    mode = mode_factory()
    with warnings.catch_warnings():
        # FlopCounterMode installs global module hooks; torch warns that the OptimizedModule sees them twice.
        warnings.filterwarnings("ignore", message=".*global hooks on modules.*")
        try:
            if forward_under_mode:
                with mode:
                    out_TD = checkpoint(compiled, x_TD, use_reentrant=False, context_fn=context_fn)
                    out_TD.sum().backward()
            else:
                out_TD = checkpoint(compiled, x_TD, use_reentrant=False, context_fn=context_fn)
                with mode:
                    out_TD.sum().backward()
            error = None
        except Exception as e:  # noqa: BLE001 - the error text is the observation
            error = _msg(e)
    return {
        "mode": mode,
        "fwd_ops": fwd_ops,
        "graphs": counter.frame_count,
        "error": error,
        "grads_match": error is None and _match(_grads(mlp, x_TD), ref),
    }


def bug() -> dict:
    """Forward outside any mode, backward under FlopCounterMode (and under a plain TorchDispatchMode)."""
    flop = _step(lambda: FlopCounterMode(display=False), forward_under_mode=False)
    plain = _step(PlainMode, forward_under_mode=False)
    return {
        "fwd_ops": flop["fwd_ops"],
        "graphs": flop["graphs"],
        "error": flop["error"],
        "op": _op_in(flop["error"]),
        "plain_mode_error": plain["error"],
    }


def fix() -> dict:
    """Backward under a probe whose ignore_compile_internals() is True: the compiled graph is replayed as recorded."""
    r = _step(InfraMode, forward_under_mode=False)
    return {
        "graphs": r["graphs"],
        "error": r["error"],
        "grads_match": r["grads_match"],
        # The probe still sees the compiled graph's aten ops (aot_eager runs them through the dispatcher).
        "mm_seen_in_backward": r["mode"].ops["aten.mm.default"],
    }


def variant_same_mode_forward() -> dict:
    """torchtitan's fix: forward and backward under the same FlopCounterMode. It works, but Dynamo never compiles
    under that mode (graphs == 0), so what gets counted is the eager module, not the compiled one."""
    r = _step(lambda: FlopCounterMode(display=False), forward_under_mode=True)
    return {
        "graphs": r["graphs"],
        "error": r["error"],
        "grads_match": r["grads_match"],
        "total_flops": r["mode"].get_total_flops(),
    }


if __name__ == "__main__":
    print(torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_same_mode_forward", json.dumps(variant_same_mode_forward()))
