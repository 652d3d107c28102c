"""A memory budget (`activation_memory_budget`) only shapes compiled graphs: the eager parts save what they saved.

Symptom: with torchtitan's #1895-era compile scope — each block's attention, router and shared expert compiled, the
routed experts left eager — lowering `torch._functorch.config.activation_memory_budget` from 1.0 to 0.0 shrinks what
the compiled parts save for backward, while the eager experts, the largest activations of the block, save exactly the
same bytes. Nothing says that the budget never reached them.

Mechanism: the budget is applied by the min-cut partitioner, which solves its knapsack per compiled graph, over that
graph's activations only; eager code saves what autograd saves.

Fix: compile what the budget should cover — each block whole (torchtitan since torchtitan#2741): at budget 0 the
experts' activations are recomputed too.

Upstream: torchtitan#1731 (memory-budget AC), torchtitan#3674 (the compile requirement validated in the Trainer's
config); torchtitan#1895 (children compiled, experts eager), torchtitan#2741 (blocks compiled whole).

Run: python c16_memory_budget_eager_islands.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim.
Bytes are distinct storages saved for backward, parameters and the input excluded.
"""

import json
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

CASE = "C16"
NEEDS = "cpu"

T, D, E, K, H, HEADS = 64, 64, 4, 2, 128, 4


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(D)
        self.wqkv, self.wo = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        q, k, v = self.wqkv(self.norm(x_TD)).view(T, 3, HEADS, D // HEADS).permute(1, 2, 0, 3)
        return x_TD + self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, D))


class Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(D)
        self.gate = nn.Linear(D, E, bias=False)

    def forward(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_TD = self.norm(x_TD)
        weights_TK, ids_TK = torch.topk(torch.sigmoid(self.gate(h_TD)), K, dim=-1)
        return h_TD, torch.zeros(T, E).scatter_add(1, ids_TK, weights_TK)


class Experts(nn.Module):
    """SwiGLU experts, every expert on every token, masked by its gate (static shapes)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w3_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.05)

    def forward(self, h_TD: torch.Tensor, gate_TE: torch.Tensor) -> torch.Tensor:
        out_TD = torch.zeros_like(h_TD)
        for e in range(E):
            hid_TH = F.silu(h_TD @ self.w1_EDH[e]) * (h_TD @ self.w3_EDH[e])
            out_TD = out_TD + gate_TE[:, e : e + 1] * (hid_TH @ self.w2_EHD[e])
        return out_TD


class Shared(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w2 = nn.Linear(D, H, bias=False), nn.Linear(H, D, bias=False)

    def forward(self, h_TD: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(h_TD)))


REGION = ["compiled"]
"""Where the running code is, for the saved-tensor hook: "experts" while the eager experts run."""


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention, self.router, self.experts, self.shared = Attention(), Router(), Experts(), Shared()

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        x_TD = self.attention(x_TD)
        h_TD, gate_TE = self.router(x_TD)
        REGION[0] = "experts"
        routed_TD = self.experts(h_TD, gate_TE)
        REGION[0] = "compiled"
        return x_TD + routed_TD + self.shared(h_TD)


def _model(scope: str) -> nn.Module:
    """Two blocks; `scope` "children": #1895's compile (attention, router and shared expert, the experts eager),
    "blocks": each block compiled whole."""
    torch.manual_seed(0)
    blocks = [Block(), Block()]
    for block in blocks:
        if scope == "blocks":
            block.compile(backend="aot_eager")
        else:
            for child in (block.attention, block.router, block.shared):
                child.compile(backend="aot_eager", fullgraph=True)
    return nn.Sequential(*blocks)


def _saved(scope: str, budget: float) -> dict[str, Any]:
    """Bytes saved for backward by the eager experts and by the rest (compiled), at a budget."""
    torch._dynamo.reset()
    model = _model(scope)
    x_TD = torch.randn(T, D, generator=torch.Generator().manual_seed(1), requires_grad=True)
    skip = {t.untyped_storage().data_ptr() for t in [*model.parameters(), x_TD]}
    saved: dict[str, dict[int, int]] = {"experts": {}, "compiled": {}}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            saved[REGION[0]][st.data_ptr()] = st.nbytes()
        return t

    with torch._functorch.config.patch(activation_memory_budget=budget):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x_TD)
        out.square().mean().backward()
    torch._dynamo.reset()
    return {"experts": sum(saved["experts"].values()), "rest": sum(saved["compiled"].values())}


def bug() -> dict:
    """#1895's scope at budgets 1.0 and 0.0: the compiled parts save less, the eager experts the same."""
    high, low = _saved("children", 1.0), _saved("children", 0.0)
    return {
        "experts_bytes": [high["experts"], low["experts"]],
        "compiled_bytes": [high["rest"], low["rest"]],
        "eager_experts_bytes_unchanged": high["experts"] == low["experts"] > 0,
        "compiled_bytes_shrink": low["rest"] < high["rest"],
    }


def fix() -> dict:
    """Each block compiled whole: the budget covers the experts, and budget 0 saves less than the #1895 scope did."""
    children, blocks_high, blocks_low = _saved("children", 0.0), _saved("blocks", 1.0), _saved("blocks", 0.0)
    total = [blocks_high["experts"] + blocks_high["rest"], blocks_low["experts"] + blocks_low["rest"]]
    return {
        "blocks_bytes": total,
        "blocks_budget_0_below_children_budget_0": total[1] < children["experts"] + children["rest"],
    }


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
