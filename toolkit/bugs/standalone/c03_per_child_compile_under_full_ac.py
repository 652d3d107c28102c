"""Per-child compile of MoE blocks under full AC (torchtitan#1895's layout): AC(compile(child)) works, glue stays eager.

Symptom (none wrong: it works, with a small cost): each MoE block is checkpointed whole (full AC, non-reentrant) and
its children are compiled one by one inside the checkpoint — attention, the norms, the router and the shared expert as
modules, the routed experts' helper as a function, the experts module itself left eager (its `__call__` is where
FSDP's hooks would run). The step compiles a few graphs with no graph break and no recompile, every compiled child's
forward runs again in backward (the eager checkpoint re-runs the block, the compiled children with it), and the
gradients equal eager's. The glue between the children (residual adds, the gate scatter, routed + shared) stays eager:
compiled whole, the block would run those ops in its graph.

Mechanism: a compiled child called inside an eager checkpoint is AC(compile(x)): its forward runs under the
checkpoint's saved-tensor hooks, which drop what the compiled graph saves and re-run the child in backward; Dynamo
never traces `experts.__call__`, so FSDP's hooks there cannot break a graph.

Fix: none needed; for the lost performance compile each block whole (torchtitan#2741): one graph per block, the glue
inside it.

Upstream: torchtitan#1895 (children compiled, experts eager), torchtitan#2741 (replaced by whole-block compile).

Run: python c03_per_child_compile_under_full_ac.py

Shape suffixes: B batch, S sequence, T tokens (B·S), D model dim, E experts, K top-k, H expert hidden dim, N heads.
"""

import json
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

CASE = "C3"
NEEDS = "cpu"

B, S, D, E, K, H, N = 2, 16, 64, 4, 2, 128, 4
T = B * S
BLOCKS = 2


class RMSNorm(nn.Module):
    """Its own module rather than nn.RMSNorm: torch 2.13's Dynamo skips the frames of torch.nn's files, so an
    nn.RMSNorm compiled on its own compiles nothing there (and fullgraph=True raises)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(D))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (D,), self.weight)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wqkv, self.wo = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        q, k, v = self.wqkv(x_BSD).view(B, S, 3, N, D // N).permute(2, 0, 3, 1, 4)
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, D))


class Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)

    def forward(self, x_TD: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.topk(torch.softmax(self.gate(x_TD), dim=-1), K, dim=-1)


class FeedForward(nn.Module):
    """SwiGLU: the shared expert."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(D, H, bias=False), nn.Linear(D, H, bias=False)
        self.w2 = nn.Linear(H, D, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x_TD)) * self.w3(x_TD))


def run_experts(
    x_TD: torch.Tensor, gate_TE: torch.Tensor, w1_EDH: torch.Tensor, w3_EDH: torch.Tensor, w2_EHD: torch.Tensor
) -> torch.Tensor:
    """Every expert on every token, masked by its gate (static shapes; the stand-in for the grouped-mm helper)."""
    h_ETH = F.silu(torch.einsum("td,edh->eth", x_TD, w1_EDH)) * torch.einsum("td,edh->eth", x_TD, w3_EDH)
    return torch.einsum("eth,ehd,te->td", h_ETH, w2_EHD, gate_TE)


class Experts(nn.Module):
    """The routed experts: the module stays eager, its helper may be a compiled function."""

    def __init__(self) -> None:
        super().__init__()
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w3_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.05)
        self.run: Any = run_experts

    def forward(self, x_TD: torch.Tensor, gate_TE: torch.Tensor) -> torch.Tensor:
        return self.run(x_TD, gate_TE, self.w1_EDH, self.w3_EDH, self.w2_EHD)


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router, self.experts, self.shared_experts = Router(), Experts(), FeedForward()

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        x_TD = x_BSD.reshape(T, D)
        weights_TK, ids_TK = self.router(x_TD)
        gate_TE = torch.zeros(T, E).scatter_add(1, ids_TK, weights_TK)  # glue: eager unless the block is compiled
        return (self.experts(x_TD, gate_TE) + self.shared_experts(x_TD)).view(B, S, D)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = RMSNorm(), RMSNorm()
        self.attention, self.moe = Attention(), MoE()

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        h_BSD = x_BSD + self.attention(self.attention_norm(x_BSD))
        return h_BSD + self.moe(self.ffn_norm(h_BSD))


class Checkpointed(nn.Module):
    """Full AC: the block in a non-reentrant checkpoint."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x_BSD, use_reentrant=False)


class Model(nn.Module):
    """BLOCKS blocks under full AC (`ac`), compiled as `scope` says: "children" (#1895: AC(compile(child))),
    "blocks" (#2741: compile(AC(block)), each block whole) or "none"."""

    def __init__(self, scope: str, ac: bool = True, backend: Any = "aot_eager"):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList()
        for _ in range(BLOCKS):
            block = Block()
            if scope == "children":
                children = (block.attention_norm, block.attention, block.ffn_norm, block.moe.router)
                for child in (*children, block.moe.shared_experts):
                    child.compile(backend=backend, fullgraph=True)
                block.moe.experts.run = torch.compile(run_experts, backend=backend, fullgraph=True)
            layer: nn.Module = Checkpointed(block) if ac else block
            if scope == "blocks":
                layer.compile(backend=backend, fullgraph=True)
            self.layers.append(layer)

    def forward(self, x_BSD: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x_BSD = layer(x_BSD)
        return x_BSD


def inputs() -> torch.Tensor:
    return torch.randn(B, S, D, generator=torch.Generator().manual_seed(1), requires_grad=True)


class Backend:
    """aot_eager that counts the graphs it compiles, the torch calls in each, and each run of a compiled forward."""

    def __init__(self) -> None:
        self.graphs = 0
        self.runs = 0
        self.ops_run = 0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Any:
        from torch._dynamo.backends.registry import lookup_backend

        self.graphs += 1
        # Torch calls of the graph and of any higher-order op's body (compile(AC(block)) holds the block in one);
        # tuple indexing is no op.
        ops = sum(
            1
            for mod in gm.modules()
            if isinstance(mod, torch.fx.GraphModule)
            for node in mod.graph.nodes
            if node.op == "call_method"
            or node.op == "call_function"
            and not isinstance(node.target, torch._ops.HigherOrderOperator)
            and node.target is not operator.getitem
        )
        compiled = lookup_backend("aot_eager")(gm, example_inputs)

        def run(*args: Any) -> Any:
            self.runs += 1
            self.ops_run += ops
            return compiled(*args)

        return run


def _step(scope: str, ac: bool = True) -> dict[str, Any]:
    """One training step: graphs, breaks, recompiles; compiled forwards run in the forward and again in backward;
    the torch calls the compiled graphs ran per block in the forward; the gradients."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend = Backend()
    model = Model(scope, ac, backend)
    x_BSD = inputs()
    out = model(x_BSD)
    runs_forward, ops_forward = backend.runs, backend.ops_run
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters()] + [x_BSD.grad]
    torch._dynamo.reset()
    return {
        "graphs": backend.graphs,
        "graph_breaks": sum(counters["graph_break"].values()),
        "recompiles": sum(counters["recompiles"].values()),
        "compiled_runs_forward": runs_forward,
        "compiled_runs_backward": backend.runs - runs_forward,
        "compiled_ops_per_block": ops_forward // BLOCKS,
        "grads": grads,
    }


def _match(a: list, b: list) -> bool:
    return all(g is not None and r is not None and torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(a, b))


def _public(run: dict[str, Any], eager: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k != "grads"} | {"grads_match": _match(run["grads"], eager["grads"])}


def bug() -> dict:
    """#1895's layout (full AC, children compiled inside the checkpoint) against each block compiled whole: it
    compiles without a break or a recompile, re-runs each compiled child in backward, matches eager's gradients, and
    leaves the glue ops eager (the whole block's graph runs more torch calls per block than the children's do)."""
    eager = _step("none", ac=False)
    children, blocks = _public(_step("children"), eager), _public(_step("blocks"), eager)
    glue = blocks["compiled_ops_per_block"] - children["compiled_ops_per_block"]
    return {
        "children": children,
        "eager_glue_ops_per_block": glue,
        "works": children["graphs"] >= 1
        and children["graph_breaks"] == 0
        and children["recompiles"] == 0
        and children["grads_match"]
        and children["compiled_runs_backward"] == children["compiled_runs_forward"] > 0
        and glue > 0,
    }


def fix() -> dict:
    """Nothing to fix; the faster layout: each block compiled whole around its checkpoint (compile(AC(block))), one
    graph with the glue inside, whose forward does not run again in backward."""
    eager = _step("none", ac=False)
    return _public(_step("blocks"), eager)


def user_models() -> dict:
    """The case as a user's training code holds it: each block under full AC, its children compiled inside the
    checkpoint (aot_eager, fullgraph=True), the experts' helper compiled as a function, and the input."""
    return {"C3": {"model": Model("children"), "inputs": (inputs(),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
