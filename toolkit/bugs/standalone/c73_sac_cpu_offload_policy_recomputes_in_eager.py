"""SAC's CPU_OFFLOAD policies in eager: the op is neither saved nor offloaded, it is recomputed, and nothing says so.

Symptom: a selective-checkpoint policy that returns `CheckpointPolicy.MUST_CPU_OFFLOAD` (or `PREFER_CPU_OFFLOAD`) for
the matmuls, asking that their outputs be saved and moved to host memory, runs them again in backward exactly as
`MUST_RECOMPUTE` does, with no warning. Under torch.compile the same policy is not a recompute tag, so the partitioner
is free to save the output: eager and compiled runs of one policy keep different tensors.

Mechanism: `_CachingTorchDispatchMode` (torch/utils/checkpoint.py) caches an op's output only for MUST_SAVE /
PREFER_SAVE; every other policy stores the recompute marker. The enum documents the offload policies, but only the
compiled path reads them (the partitioner's `must_recompute` names the two RECOMPUTE values only).

Fix: ask for MUST_SAVE in eager (map the offload policies to it), and offload with
`torch.autograd.graph.save_on_cpu` around the checkpoint where host memory is the point.

Upstream: pytorch#180874, pytorch#185015.

Run: python c73_sac_cpu_offload_policy_recomputes_in_eager.py

Shape suffixes: T tokens, D dim, H hidden.
"""

import functools
import json
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C73"
NEEDS = "cpu"

P = CheckpointPolicy
MATMUL = (torch.ops.aten.addmm.default, torch.ops.aten.mm.default)


class CountForwardMatmuls(TorchDispatchMode):
    """Counts addmm, the forward's own matmul (backward's gradients use mm): one in backward is a recompute."""

    def __init__(self):
        super().__init__()
        self.addmm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.addmm.default:
            self.addmm += 1
        return func(*args, **(kwargs or {}))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up_DH, self.down_HD = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

    def forward(self, x_TD):
        return x_TD + self.down_HD(self.up_DH(x_TD).relu())


def _policy(matmul_policy, ctx, op, *args, **kwargs):
    return matmul_policy if op in MATMUL else P.PREFER_RECOMPUTE


def _run(matmul_policy, compiled: bool = False) -> dict:
    """One step of the block under SAC with `matmul_policy` for its matmuls: forward matmuls run again in backward,
    warnings raised, and whether the gradient matches the block without checkpointing."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block()
    x_TD = torch.randn(32, 64, requires_grad=True)
    context = functools.partial(create_selective_checkpoint_contexts, functools.partial(_policy, matmul_policy))

    def fn(x):
        return checkpoint(block, x, use_reentrant=False, context_fn=context)

    run = torch.compile(fn, backend="aot_eager", fullgraph=True) if compiled else fn
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run(x_TD)
        counter = CountForwardMatmuls()
        with counter:
            out.sum().backward()
    grad = x_TD.grad.clone()
    x_TD.grad = None
    block(x_TD).sum().backward()
    return {
        "matmuls_recomputed": counter.addmm,
        "warnings": len([w for w in caught if "checkpoint" in str(w.message).lower() or "offload" in str(w.message)]),
        "grads_match": bool(torch.allclose(grad, x_TD.grad)),
    }


def bug() -> dict:
    """Eager SAC: the offload policies recompute both matmuls, like MUST_RECOMPUTE, unlike MUST_SAVE; silently."""
    runs = {p.name.lower(): _run(p) for p in (P.MUST_SAVE, P.MUST_RECOMPUTE, P.MUST_CPU_OFFLOAD, P.PREFER_CPU_OFFLOAD)}
    offload = (runs["must_cpu_offload"], runs["prefer_cpu_offload"])
    return {
        **runs,
        "offload_recomputes": all(
            r["matmuls_recomputed"] == runs["must_recompute"]["matmuls_recomputed"] > 0 for r in offload
        ),
        "silent": all(r["warnings"] == 0 for r in offload),
    }


def variant_compiled() -> dict:
    """The same policy under torch.compile (aot_eager): not a recompute tag, so the partitioner may save instead."""
    return {
        "must_cpu_offload": _run(P.MUST_CPU_OFFLOAD, compiled=True),
        "must_recompute": _run(P.MUST_RECOMPUTE, compiled=True),
    }


def fix() -> dict:
    """MUST_SAVE in eager keeps the matmuls' outputs: nothing recomputed (offload them with save_on_cpu if needed)."""
    return {"must_save": _run(P.MUST_SAVE)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("variant_compiled", json.dumps(variant_compiled()))
    print("fix", json.dumps(fix()))
