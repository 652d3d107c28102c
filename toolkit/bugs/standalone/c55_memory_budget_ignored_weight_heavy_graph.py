"""A memory budget between 0 and 1 does nothing where a graph's inputs, its parameters included, outweigh its saves.

Symptom: `torch._functorch.config.activation_memory_budget` at 0.5 saves exactly what 1.0 (no budget) saves for a
compiled expert MLP that computes in bf16 on fp32 weights large against its activations — while 0.0 saves much less:
the knapsack never runs. The partitioner places the budget between the size of the graph's inputs (what budget 0
keeps) and the size of the runtime-optimal saves (budget 1), and returns the runtime-optimal plan outright when the
second is not larger ("the optimized choice is smaller than the inputs anyways"). The inputs count the fp32
parameters, which are not activations and are held whatever the plan, while backward saves their bf16 copies, half
their size; so a weight-heavy graph with few tokens — an MoE's experts compiled on their own — ignores every budget
but 0. With more tokens the same graph follows the budget.

Fix: budget 0, or compile more than the weight-heavy part (the whole block: its activations outweigh its weights), or
bring the activations above the weights (more tokens per step).

Upstream: not filed; the shortcut is `choose_saved_values_set` in torch/_functorch/partitioners.py.

Run: python c55_memory_budget_ignored_weight_heavy_graph.py

Shape suffixes: T tokens, D model dim, F expert hidden dim, E experts.
"""

import json

import torch
from torch import nn

CASE = "C55"
NEEDS = "cpu"

D, F, E = 64, 256, 8


class Experts(nn.Module):
    """Every token through every expert (static shapes), weights E × (D·F + F·D)."""

    def __init__(self):
        super().__init__()
        self.w1_EDF = nn.Parameter(torch.randn(E, D, F) * 0.05)
        self.w2_EFD = nn.Parameter(torch.randn(E, F, D) * 0.05)

    def forward(self, x_TD):
        # bf16 compute on fp32 parameters, as the toolkit's (and torchtitan 0.3.0's) grouped-GEMM experts do: backward
        # needs the bf16 copies of the weights, not the fp32 parameters themselves.
        w1_EDF, w2_EFD = self.w1_EDF.bfloat16(), self.w2_EFD.bfloat16()
        h_ETF = torch.nn.functional.silu(x_TD.bfloat16().unsqueeze(0) @ w1_EDF)
        return torch.tanh(h_ETF @ w2_EFD).float().sum(0)


def _saved_bytes(tokens: int, budget: float) -> int:
    """Bytes the compiled experts keep for backward (outer saved-tensor hooks; parameters left out)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    experts = Experts()
    params = {p.untyped_storage()._cdata for p in experts.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st._cdata not in params:
            seen[st._cdata] = st.nbytes()
        return t

    with torch._functorch.config.patch(activation_memory_budget=budget):
        compiled = torch.compile(experts, backend="aot_eager", fullgraph=True)
        x_TD = torch.randn(tokens, D, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = compiled(x_TD)
        out.sum().backward()
    return sum(seen.values())


def _sweep(tokens: int) -> dict:
    return {f"budget_{b}": _saved_bytes(tokens, b) for b in (1.0, 0.5, 0.0)}


def bug() -> dict:
    """16 tokens: the weights (1 MiB) outweigh the activations; 0.5 saves what 1.0 saves, 0.0 much less."""
    out = _sweep(16)
    out["budget_ignored"] = out["budget_0.5"] == out["budget_1.0"] > out["budget_0.0"]
    return out


def fix() -> dict:
    """512 tokens: the activations outweigh the weights, and 0.5 lands between 1.0 and 0.0."""
    out = _sweep(512)
    out["budget_ignored"] = out["budget_0.5"] == out["budget_1.0"] > out["budget_0.0"]
    return out


def user_models() -> dict:
    """C55 as a user's training code holds it: the experts compiled whole (aot_eager, fullgraph) under a budget of
    0.5, at 16 tokens; its `reference` is the same model under no budget (1.0), which it saves as much as."""
    torch.manual_seed(0)
    experts, reference = Experts(), Experts()
    reference.load_state_dict(experts.state_dict())
    return {
        "C55": {
            "model": torch.compile(experts, backend="aot_eager", fullgraph=True),
            "reference": torch.compile(reference, backend="aot_eager", fullgraph=True),
            "reference_config": {"torch._functorch.config.activation_memory_budget": 1.0},
            "inputs": (torch.randn(16, D, requires_grad=True),),
            "config": {"torch._functorch.config.activation_memory_budget": 0.5},
        }
    }


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
