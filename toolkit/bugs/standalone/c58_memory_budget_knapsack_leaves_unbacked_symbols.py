"""Inductor cannot compile a graph with data-dependent sizes under a memory budget: the knapsack's FLOP estimate leaves
unbacked symbols behind.

Symptom: for-loop experts (`counts.tolist()` then `torch.split`, compiled fullgraph with `capture_scalar_outputs`)
under `activation_memory_budget = 0.3` and Inductor fail to compile: "InductorError: PendingUnbackedSymbolNotFound:
Pending unbacked symbols {u12, …} not in returned outputs", raised while Inductor re-propagates the forward graph's
first placeholder. Budget 1.0 and 0.0 compile, and so does aot_eager at 0.3. The central list's
`moe:for_loop | memory_budget | … (fullgraph) | inductor` cells are this case, on 2.13.0 and 2.14.1, bare too.

Mechanism: between 0 and 1 the partitioner's knapsack prices each candidate op with `estimate_runtime`, which by
default (`activation_memory_budget_runtime_estimator = "flops"`) runs the op on fake tensors under the graph's own fake
mode. Running `aten._local_scalar_dense` (each `.tolist()` element) that way allocates a fresh unbacked symbol in the
graph's ShapeEnv that no node binds; Inductor's fake-tensor propagation of the forward graph then finds those symbols
pending at its first node and raises. aot_eager runs the same knapsack but never re-propagates, so nothing notices.
A warm FX graph cache hides it (a cache hit skips the propagation), so the repro turns the cache off.

Fix: any of — a runtime estimator that does not execute the ops (`"testing"`, every op cost 1: it changes what the
knapsack picks); `torch.fx.experimental._config.soft_pending_unbacked_not_found_error = True`; a graph break at
`.tolist()` (no `capture_scalar_outputs`, not fullgraph); grouped-GEMM experts (no host sync); or budget 0 / 1.

Upstream: not filed; related pytorch#158058 (PendingUnbackedSymbolNotFound from unused unbacked symbols) and
pytorch#174150 (the soft flag). The estimate is `estimate_runtime` in torch/_functorch/partitioners.py.

Run: python c58_memory_budget_knapsack_leaves_unbacked_symbols.py

Shape suffixes: T tokens, D model dim, F expert hidden dim, E experts.
"""

import json
import re

import torch
import torch._functorch.config
import torch._functorch.partitioners
import torch._inductor.config
import torch.fx.experimental._config
import torch.nn.functional as F
from torch import nn

CASE = "C58"
NEEDS = "cpu"

E, D, F_HIDDEN, T = 4, 64, 64, 64
COUNTS_E = [10, 20, 30, 4]  # tokens per expert, as routing would produce them


class Experts(nn.Module):
    """E experts run one after another on their own rows: sizes known only from `counts_E` at run time."""

    def __init__(self):
        super().__init__()
        self.w1_EFD = nn.Parameter(torch.randn(E, F_HIDDEN, D) * 0.05)
        self.w2_EDF = nn.Parameter(torch.randn(E, D, F_HIDDEN) * 0.05)

    def forward(self, x_TD, counts_E):
        chunks = torch.split(x_TD, counts_E.tolist(), dim=0)  # a host sync: unbacked sizes under fullgraph
        return torch.cat([F.silu(x @ self.w1_EFD[e].t()) @ self.w2_EDF[e].t() for e, x in enumerate(chunks)], dim=0)


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"\{[^}]*\}", "{…}", first)  # the symbols' names and their (set) order vary
    return f"{type(e).__name__}: {first.split(' not in returned outputs')[0]}"


def _step(
    *,
    budget: float = 0.3,
    backend: str = "inductor",
    estimator: str = "flops",
    fullgraph: bool = True,
    soft: bool = False,
    spy: list | None = None,
) -> dict:
    """One compiled forward + backward; `error` (first line) or whether the gradients equal eager's.

    `spy`: collects the ops whose runtime estimate left a pending unbacked symbol behind."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    experts = Experts()
    x_TD = torch.randn(T, D, requires_grad=True)
    counts_E = torch.tensor(COUNTS_E)
    experts(x_TD, counts_E).sum().backward()
    ref = [p.grad.clone() for p in experts.parameters()] + [x_TD.grad.clone()]
    experts.zero_grad(set_to_none=True)
    x_TD.grad = None

    original = torch._functorch.partitioners.estimate_runtime

    def estimate(node):
        env = getattr(torch._guards.detect_fake_mode(), "shape_env", None)
        before = set(env.pending_fresh_unbacked_symbols) if env else set()
        out = original(node)
        if env and set(env.pending_fresh_unbacked_symbols) - before:
            spy.append(str(node.target))
        return out

    with (
        torch._dynamo.config.patch(capture_scalar_outputs=fullgraph),
        torch._functorch.config.patch(
            activation_memory_budget=budget, activation_memory_budget_runtime_estimator=estimator
        ),
        # A cache hit skips the fake-tensor propagation that raises: turned off so that the result does not depend
        # on what ran before on this machine.
        torch._inductor.config.patch(fx_graph_cache=False),
        torch.fx.experimental._config.patch(soft_pending_unbacked_not_found_error=soft),
    ):
        if spy is not None:
            torch._functorch.partitioners.estimate_runtime = estimate
        try:
            compiled = torch.compile(experts, backend=backend, fullgraph=fullgraph)
            compiled(x_TD, counts_E).sum().backward()
        except Exception as e:  # noqa: BLE001 — the first line is the observation
            return {"error": _msg(e)}
        finally:
            torch._functorch.partitioners.estimate_runtime = original
    grads = [p.grad for p in experts.parameters()] + [x_TD.grad]
    return {"error": None, "grads_match": all(torch.allclose(g, r, rtol=1e-4, atol=1e-5) for g, r in zip(grads, ref))}


def bug() -> dict:
    """Budget 0.3 under Inductor fails; which estimates left symbols pending (aot_eager's too, unnoticed); the
    neighbours that compile."""
    spy: list = []
    aot_eager_spy: list = []
    return {
        "error": _step(spy=spy)["error"],
        "left_pending_by": spy,
        "budget_1.0": _step(budget=1.0),
        "budget_0.0": _step(budget=0.0),
        "aot_eager": _step(backend="aot_eager", spy=aot_eager_spy),
        "aot_eager_left_pending": len(aot_eager_spy),
    }


def fix() -> dict:
    """The same budget compiles once the estimate runs no op, the error is soft, or `.tolist()` breaks the graph."""
    return {
        "unit_estimator": _step(estimator="testing"),
        "soft_pending_error": _step(soft=True),
        "graph_break": _step(fullgraph=False),
    }


def user_models() -> dict:
    """The case as a user's training code holds it: the experts compiled whole with Inductor, their inputs, and the
    torch config in force (a memory budget, scalar outputs captured, no FX graph cache hit)."""
    torch.manual_seed(0)
    experts = torch.compile(Experts(), backend="inductor", fullgraph=True)
    return {
        "C58": {
            "model": experts,
            "inputs": (torch.randn(T, D, requires_grad=True), torch.tensor(COUNTS_E)),
            "config": {
                "torch._functorch.config.activation_memory_budget": 0.3,
                "torch._dynamo.config.capture_scalar_outputs": True,
                "torch._inductor.config.fx_graph_cache": False,
            },
        }
    }


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
