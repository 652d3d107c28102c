"""torch_remat recompute repeats an MoE's in-place token count in eager, but not compiled (C12 under torch_remat).

Symptom: a router that adds its per-expert token counts to a buffer in its forward (aux-loss-free load balancing),
inside a `torch_remat.checkpoint` block, has counted every token twice after backward eagerly — torch_remat reruns
the whole block in recompute, the `add_` included — and once when the block is compiled, where the functionalized
mutation is applied once by the forward graph. The balancing signal depends on whether the block is compiled.

Fixes, as torchtitan main does ("token counting ignores checkpoint replay"): count only when
`torch_remat.is_recomputing()` is false, or put the counting call in a SAVE region (`recompute=False`), which
recompute skips. Both count once eagerly and compiled.

Upstream: torchtitan#4159 (RematAC, draft) and torchtitan#4497 (torch_remat replaces per-op SAC); C12 is the same
effect with torch.utils.checkpoint (torchtitan#1593). Needs `pip install torch-remat==0.2.2`.

Run: python c33_remat_token_counter.py

Shape suffixes: T tokens, D model dim, E routed experts, K top-k.
"""

import json

import torch
import torch_remat as remat
from torch import nn

CASE = "C33"
NEEDS = "cpu"

T, D, E, K = 64, 32, 4, 2


class CountingRouter(nn.Module):
    """Top-k routing that counts tokens per expert into a buffer, in place, during the forward."""

    def __init__(self, guard: str = "none"):
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.register_buffer("tokens_per_expert", torch.zeros(E))
        self.guard = guard

    def count(self, ids_TK):
        counts_E = torch.zeros(E).scatter_add_(0, ids_TK.flatten(), torch.ones(T * K))
        self.tokens_per_expert.add_(counts_E)
        return counts_E

    def forward(self, x_TD):
        scores_TE = torch.sigmoid(self.gate(x_TD))
        weights_TK, ids_TK = torch.topk(scores_TE, K, dim=-1)
        if self.guard == "save_region":
            counts_E = remat.region(self.count, "count", recompute=False)(ids_TK)
            # Keep the (E-element) output so recompute needs no placeholder for it: CPU builds cannot make one (C31).
            remat.recompute_needs_tensor(counts_E)
        elif self.guard == "none" or not remat.is_recomputing():
            self.count(ids_TK)
        return x_TD * weights_TK.sum(-1, keepdim=True)


def _count(*, compiled: bool, guard: str = "none") -> list[int]:
    """Tokens counted [after the forward, after the backward] of one remat-checkpointed router."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    router = CountingRouter(guard)
    block = remat.checkpoint(region_name="router")(router)
    step = torch.compile(block, backend="aot_eager", fullgraph=True) if compiled else block
    out_TD = step(torch.randn(T, D, requires_grad=True))
    after_forward = int(router.tokens_per_expert.sum())
    out_TD.sum().backward()
    return [after_forward, int(router.tokens_per_expert.sum())]


def bug() -> dict:
    """Tokens counted [after forward, after backward]; T·K = 128 routed tokens per forward."""
    return {"eager": _count(compiled=False), "compiled": _count(compiled=True)}


def fix() -> dict:
    """Skip the count while remat recomputes: 128 everywhere."""
    return {
        "eager": _count(compiled=False, guard="is_recomputing"),
        "compiled": _count(compiled=True, guard="is_recomputing"),
    }


def variant_save_region() -> dict:
    """The counting call in a SAVE region, which recompute skips: 128 everywhere."""
    return {
        "eager": _count(compiled=False, guard="save_region"),
        "compiled": _count(compiled=True, guard="save_region"),
    }


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("variant_save_region", json.dumps(variant_save_region()))
