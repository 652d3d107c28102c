"""AC recompute of a compiled function runs the newest (dynamic-shape) graph, not the one the forward ran.

Symptom: an expert function compiled with `wrap_inductor_compiled_regions=True` and used in two selective-checkpoint
regions with different token counts (48, then 40) recompiles a dynamic graph on the second call; Dynamo's LRU cache
then hands region 1's recompute the dynamic graph, whose compiled callable is not in region 1's SAC storage, and
backward fails with "inductor_compiled_code encountered during backward but not found in storage". Full AC fails the
same way once the static and the dynamic graph save different tensors (`variant_full_ac`).

Upstream: pytorch#166926 (open; root cause), pytorch#177091 (hint in the checkpoint error), pytorch#174993 and
pytorch#175881 (proposed cache guards); torchtitan#1971, torchtitan#1991 and #2204 (LRU cache off), #2007
(mark_dynamic on routed tokens).

Run: python c08_lru_recompute.py

Shape suffixes: T tokens (T1 = 48 in region 1, T2 = 40 in region 2), D model dim, H hidden dim (x_TD is [T, D]).
"""

import functools
import json
import re

import torch
import torch.nn.functional as F
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C8"
NEEDS = "cpu"

D, H = 64, 128
T1, T2 = 48, 40
BLOCK = 16


def expert(x_TD, w1_DH, w2_HD, w3_DH):
    return (F.silu(x_TD @ w1_DH) * (x_TD @ w3_DH)) @ w2_HD


def expert_padded(x_TD, w1_DH, w2_HD, w3_DH):
    # Same math as `expert`, with the kind of shape-dependent fast path kernels with block sizes use: the static
    # graph can prove T % BLOCK == 0 and skips the padding; the dynamic graph cannot (statically_known_true adds
    # no guard) and pads, which is a no-op at T = 48 but changes which tensors autograd saves.
    T = x_TD.shape[0]
    if statically_known_true(T % BLOCK == 0):
        return expert(x_TD, w1_DH, w2_HD, w3_DH)
    xpad_TD = F.pad(x_TD, (0, 0, 0, (-T) % BLOCK))
    return expert(xpad_TD, w1_DH, w2_HD, w3_DH)[:T]


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _policy(ctx, op, *args, **kwargs):
    # torchtitan-style: save the compiled region; the failure does not depend on this choice, because the SAC
    # storage is keyed by the compiled callable for every decision.
    if op is torch._higher_order_ops.wrap.inductor_compiled_code:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _run(fn, *, sac: bool, backend: str = "inductor", lru: bool = True, mark_dynamic: bool = False) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    w1_DH = (torch.randn(D, H) * 0.1).requires_grad_()
    w2_HD = (torch.randn(H, D) * 0.1).requires_grad_()
    w3_DH = (torch.randn(D, H) * 0.1).requires_grad_()
    ws = [w1_DH, w2_HD, w3_DH]
    xs = [torch.randn(T1, D, requires_grad=True), torch.randn(T2, D, requires_grad=True)]
    leaves = ws + xs

    sum(fn(x_TD, *ws).sum() for x_TD in xs).backward()
    ref = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None

    torch._dynamo.utils.counters.clear()
    kwargs = {"context_fn": functools.partial(create_selective_checkpoint_contexts, _policy)} if sac else {}
    torch._C._dynamo.eval_frame._set_lru_cache(lru)
    try:
        with torch._inductor.config.patch(wrap_inductor_compiled_regions=(backend == "inductor")):
            compiled = torch.compile(fn, backend=backend)
            outs = []
            for x_TD in xs:
                if mark_dynamic:
                    torch._dynamo.mark_dynamic(x_TD, 0)
                outs.append(checkpoint(compiled, x_TD, *ws, use_reentrant=False, **kwargs))
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            try:
                # Region 2's backward runs first; region 1's recompute is the one that meets the dynamic graph.
                sum(y_TD.sum() for y_TD in outs).backward()
                error = None
            except RuntimeError as e:
                error = _msg(e)
    finally:
        torch._C._dynamo.eval_frame._set_lru_cache(True)
    grads_match = None if error else all(torch.allclose(t.grad, r, rtol=1e-4, atol=1e-5) for t, r in zip(leaves, ref))
    return {"error": error, "grads_match": grads_match, "graphs": graphs}


def bug() -> dict:
    """SAC(compile(expert)) with wrapped regions, 48 then 40 tokens: region 1's recompute misses its storage."""
    r = _run(expert, sac=True)
    return {"error": r["error"], "graphs": r["graphs"]}


def fix() -> dict:
    """Same, with Dynamo's LRU cache off: graphs are tried in insertion order, so 48 tokens hit the static graph."""
    return _run(expert, sac=True, lru=False)


def variant_mark_dynamic() -> dict:
    """Same as bug(), with the token dim marked dynamic from the start: one graph, nothing to confuse."""
    return _run(expert, sac=True, mark_dynamic=True)


def variant_full_ac() -> dict:
    """Full AC (no SAC, no wrapped regions): needs static and dynamic graphs that save different tensors."""
    plain = _run(expert, sac=False, backend="aot_eager")
    padded = _run(expert_padded, sac=False, backend="aot_eager")
    padded_lru_off = _run(expert_padded, sac=False, backend="aot_eager", lru=False)
    return {
        "plain_error": plain["error"],
        "error": padded["error"],
        "lru_off_error": padded_lru_off["error"],
        "lru_off_grads_match": padded_lru_off["grads_match"],
    }


class _TwoRegions(torch.nn.Module):
    """A user's MoE-style code: one compiled expert function, checkpointed around each of two token groups (48, then
    40 tokens), with the padding fast path that makes the static and the dynamic graph save different tensors."""

    def __init__(self):
        super().__init__()
        self.w1_DH = torch.nn.Parameter(torch.randn(D, H) * 0.1)
        self.w2_HD = torch.nn.Parameter(torch.randn(H, D) * 0.1)
        self.w3_DH = torch.nn.Parameter(torch.randn(D, H) * 0.1)
        self.expert = torch.compile(expert_padded, backend="aot_eager")

    def forward(self, x1_TD, x2_TD):
        ws = (self.w1_DH, self.w2_HD, self.w3_DH)
        return sum(checkpoint(self.expert, x_TD, *ws, use_reentrant=False).sum() for x_TD in (x1_TD, x2_TD))


def user_models() -> dict:
    """C8 as a user's training code holds it (`variant_full_ac`'s form: full AC, aot_eager): a compiled function
    called inside two checkpoints with different token counts, and its inputs."""
    torch.manual_seed(0)
    return {"C8": {"model": _TwoRegions(), "inputs": (torch.randn(T1, D), torch.randn(T2, D))}}


if __name__ == "__main__":
    print(torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_mark_dynamic", json.dumps(variant_mark_dynamic()))
    print("variant_full_ac", json.dumps(variant_full_ac()))
