"""activation_memory_budget: a lower budget saves less for backward but can raise the step's peak memory.

Symptom: two tiny MoE blocks (masked experts: every expert on every token, gated), each compiled as one graph, swept
over `torch._functorch.config.activation_memory_budget`. What the graphs save for backward falls as the budget falls,
but the peak over forward + backward is not monotonic: at 0.4 it is higher than at 0.6 (CPU allocations replayed
from the profiler), so lowering the budget to save memory can cost memory. A user tuning the budget by its name
("memory") gets the opposite of what was asked.

Mechanism: the budget bounds what the forward keeps, not the peak: below some budget the partitioner recomputes the
expert intermediates in the backward graph, where they are live together with the gradients being formed, and that
backward-time high-water mark passes the forward's.

Fix: measure the peak across budgets and take the lowest, not the smallest budget (the knee here is 0.6).

Upstream: pytorch#197838.

Run: python c77_memory_budget_peak_not_monotonic.py

Shape suffixes: T tokens, D dim, E experts, H expert hidden, K top-k.
"""

import json

import torch

CASE = "C77"
NEEDS = "cpu"

BUDGETS = (1.0, 0.6, 0.4, 0.0)
E, D, H, T = 4, 64, 64, 64


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router_DE = torch.nn.Linear(D, E, bias=False)
        self.w1_EDH = torch.nn.Parameter(torch.randn(E, D, H) * 0.1)
        self.w2_EHD = torch.nn.Parameter(torch.randn(E, H, D) * 0.1)

    def forward(self, x_TD):
        scores_TE = self.router_DE(x_TD).sigmoid()
        top_TK, idx_TK = scores_TE.topk(2, dim=-1)
        gate_TE = torch.zeros_like(scores_TE).scatter(1, idx_TK, top_TK)
        h_ETH = torch.einsum("td,edh->eth", x_TD, self.w1_EDH).relu()
        y_ETD = torch.einsum("eth,ehd->etd", h_ETH, self.w2_EHD)
        return x_TD + (y_ETD * gate_TE.t().unsqueeze(-1)).sum(0)


def _peak_bytes(step) -> int:
    """Peak CPU bytes above the start of `step`, from the profiler's allocation events replayed in time order (a
    free of a block allocated before the window is ignored)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocs, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            allocs.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live, cum, peak = {}, 0, 0
    for _, ptr, size in sorted(allocs):
        if size > 0:
            live[ptr] = size
            cum += size
        elif ptr in live:
            cum -= live.pop(ptr)
        peak = max(peak, cum)
    return peak


def _run(budget: float) -> dict:
    """One warm step at `budget`: the bytes saved for backward (outer saved-tensor hooks) and the peak."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    blocks = torch.nn.ModuleList([Block() for _ in range(2)])
    for block in blocks:
        block.compile(backend="aot_eager", fullgraph=True)
    x_TD = torch.randn(T, D, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(0 if isinstance(t, torch.nn.Parameter) else t.numel() * t.element_size())
        return t

    def step():
        y_TD = x_TD
        for block in blocks:
            y_TD = block(y_TD)
        y_TD.sum().backward()

    with torch._functorch.config.patch(activation_memory_budget=budget):
        step()  # compiles
        blocks.zero_grad(set_to_none=True)
        x_TD.grad = None
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step()
        blocks.zero_grad(set_to_none=True)
        x_TD.grad = None
        return {"saved": sum(saved), "peak": _peak_bytes(step)}


def bug() -> dict:
    """Saved bytes fall with the budget; the peak does not."""
    runs = {str(b): _run(b) for b in BUDGETS}
    saved = [runs[str(b)]["saved"] for b in BUDGETS]
    peaks = [runs[str(b)]["peak"] for b in BUDGETS]
    return {
        **runs,
        "saved_monotonic": all(a >= b for a, b in zip(saved, saved[1:])),
        "peak_not_monotonic": any(b > a for a, b in zip(peaks, peaks[1:])),
    }


def fix() -> dict:
    """The budget with the lowest measured peak (not the lowest budget)."""
    runs = {b: _run(b)["peak"] for b in BUDGETS}
    best = min(runs, key=lambda b: (runs[b], -b))
    return {"lowest_peak_budget": best, "lowest_budget_peak_over_it": runs[0.0] - runs[best]}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
