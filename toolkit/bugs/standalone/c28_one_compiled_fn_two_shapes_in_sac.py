"""SAC recompute serves one compiled function's two calls from the wrong graph when the second call recompiled.

Symptom: a compiled activation function (`wrap_inductor_compiled_regions=True`, so SAC sees each compiled call as one
`inductor_compiled_code` op) is called twice inside **one** selective-checkpoint region at two token counts — the
routed experts at T·K rows, the shared expert at T rows, as in an MoE whose routed and shared experts share an
activation. Cold, the second call recompiles a dynamic-shape graph; in recompute Dynamo's LRU cache runs the first
call through that newer graph, whose saved outputs are the second call's, so the first call pops them and the second
finds nothing: "inductor_compiled_code invocation index 1 encountered during backward but not found in storage".
Warm (both graphs compiled before the checkpointed step) or with the LRU cache off, recompute picks the forward's
graphs and the gradients match. A variant of C8 (there: two regions, one call each).

Upstream: pytorch#166926 (open; the LRU cache picks the newest graph for the recompute), pytorch#177091 (hint in the
checkpoint error); torchtitan#1991 and #2204 (LRU cache off). torchtitan keeps its own repro as
docs/torch_compile_asks/repros/nla_sac_wrapped_region_recompile.py and sidesteps it on main by compiling inside
torch_remat blocks instead.

Run: python c28_one_compiled_fn_two_shapes_in_sac.py

Shape suffixes: T tokens, K top-k (the routed rows are T·K), D model dim, H expert hidden dim.
"""

import functools
import json
import re

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C28"
NEEDS = "cpu"

T, K, D, H = 64, 2, 64, 128


def act(gate_NH, up_NH):
    return F.silu(gate_NH) * up_NH


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


def _policy(ctx, op, *args, **kwargs):
    # torchtitan's choice: keep what the compiled regions return, recompute the eager glue around them.
    if op is torch._higher_order_ops.wrap.inductor_compiled_code:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _run(*, warm: bool, lru: bool = True) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    x_TD = torch.randn(T, D, requires_grad=True)
    w13_D2H = (torch.randn(D, 2 * H) * 0.1).requires_grad_()
    w2_HD = (torch.randn(H, D) * 0.1).requires_grad_()
    with torch._inductor.config.patch(wrap_inductor_compiled_regions=True):
        compiled_act = torch.compile(act, fullgraph=True)

        def block(x_TD, w13_D2H, w2_HD):
            routed_ND = x_TD.repeat_interleave(K, dim=0)  # N = T·K rows, one per (token, expert choice)
            routed_NH = compiled_act(*(routed_ND @ w13_D2H).chunk(2, dim=-1))
            shared_TH = compiled_act(*(x_TD @ w13_D2H).chunk(2, dim=-1))
            # cat accepts any row count, so a recompute that swaps the two calls' outputs is not stopped by a shape
            # check here and reaches the storage lookup of the second call.
            return torch.cat([routed_NH @ w2_HD, shared_TH @ w2_HD])

        ref_TD = torch.autograd.grad(block(x_TD, w13_D2H, w2_HD).sum(), x_TD)[0]
        if not warm:
            torch._dynamo.reset()  # the checkpointed step is the first to compile, as in a training run
        torch._dynamo.utils.counters.clear()
        torch._C._dynamo.eval_frame._set_lru_cache(lru)
        try:
            out = checkpoint(
                block,
                x_TD,
                w13_D2H,
                w2_HD,
                use_reentrant=False,
                context_fn=functools.partial(create_selective_checkpoint_contexts, _policy),
            )
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            try:
                grad_TD = torch.autograd.grad(out.sum(), x_TD)[0]
                return {
                    "error": None,
                    "graphs": graphs,
                    "grads_match": bool(torch.allclose(grad_TD, ref_TD, atol=1e-5)),
                }
            except RuntimeError as e:
                return {"error": _msg(e), "graphs": graphs, "grads_match": None}
        finally:
            torch._C._dynamo.eval_frame._set_lru_cache(True)


def bug() -> dict:
    """Cold: the checkpointed step compiles a static graph (T·K rows) and then a dynamic one (T rows); recompute
    fails."""
    return _run(warm=False)


def fix() -> dict:
    """Cold, with Dynamo's LRU cache off: graphs are tried in insertion order, so each call recomputes through the
    graph its forward ran."""
    return _run(warm=False, lru=False)


def variant_warm() -> dict:
    """Warm: one step without checkpointing first, so the dynamic graph exists before SAC and serves both calls."""
    return _run(warm=True)


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_warm", json.dumps(variant_warm()))
