"""A block compiled whole with fullgraph=True cannot hold an FSDP2 unit of its own: Unsupported (torchtitan#1895).

Symptom: an MoE block compiled whole with `fullgraph=True`, then sharded as torchtitan's PR #2052 era did — the
routed experts `fully_shard`ed as a unit of their own inside the block's unit — fails in its first forward with
`torch._dynamo.exc.Unsupported` ("Call to `torch._dynamo.disable()`" / "Attempted to call function marked as
skipped"): Dynamo does not trace FSDP2's pre-forward hook on the experts (FSDP hooks are skipped by design), and
`fullgraph=True` forbids the graph break that would step over it. With `fullgraph=False` the block runs, split at
the hooks. No AC is needed; full AC and per-op SAC fail the same way.

Fix: keep every FSDP unit's hooks outside compiled regions — compile the block's children one by one (torchtitan's
MoE-aware `apply_compile`, #1895, which compiles the experts' computation and not the module that carries the
hooks), shard the experts with the block, or accept the graph breaks (`fullgraph=False`).

Upstream: torchtitan#1895 (MoE-aware compile), torchtitan#2052 (the same hooks reached through a checkpoint wrapper:
the toolkit's C4).

Run: python c53_fullgraph_block_with_fsdp_experts.py

Shape suffixes: T tokens, D model dim, H expert hidden dim, E experts.
"""

import json
import re
import socket

import torch
import torch.distributed as dist
from torch import nn

CASE = "C53"
NEEDS = "cpu"

T, D, H, E = 32, 64, 128, 4


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    return f"{type(e).__name__}: {first}"


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.1)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.1)

    def forward(self, x_TD, weights_TE):
        # Every expert on every token, weighted by the routing (the "masked" experts: static shapes).
        h_ETH = torch.relu(x_TD.unsqueeze(0) @ self.w1_EDH)
        return ((h_ETH @ self.w2_EHD) * weights_TE.T.unsqueeze(-1)).sum(0)


class Attention(nn.Module):
    """A stand-in for attention (a module of our own: compiling a bare `torch.nn` module is another story, C26)."""

    def __init__(self):
        super().__init__()
        self.wo = nn.Linear(D, D)

    def forward(self, x_TD):
        return self.wo(torch.tanh(x_TD))


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(D, E)

    def forward(self, x_TD):
        return torch.softmax(self.gate(x_TD), dim=-1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.router = Router()
        self.experts = Experts()

    def forward(self, x_TD):
        h_TD = x_TD + self.attention(x_TD)
        return h_TD + self.experts(h_TD, self.router(h_TD))


class _OneRank:
    """A 1-rank gloo group on 127.0.0.1 for the duration (an existing 1-rank group is used as it is)."""

    def __enter__(self):
        self.own = not dist.is_initialized()
        if self.own:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        return self

    def __exit__(self, *exc):
        if self.own:
            dist.destroy_process_group()


def _step(*, fullgraph: bool, experts_unit: bool, compile_children: bool = False) -> dict:
    """Compile, then shard (torchtitan's order), then one training step; what Dynamo made of it."""
    from torch.distributed.fsdp import fully_shard

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    block = Block()
    if compile_children:
        block.attention.compile(backend="aot_eager", fullgraph=True)
        block.router.compile(backend="aot_eager", fullgraph=True)
        # The experts' computation, not their module call: FSDP's hooks run around `forward`, outside the graph.
        block.experts.forward = torch.compile(block.experts.forward, backend="aot_eager", fullgraph=True)
    else:
        block.compile(backend="aot_eager", fullgraph=fullgraph)
    error = None
    with _OneRank():
        if experts_unit:
            fully_shard(block.experts)
        fully_shard(block)
        try:
            block(torch.randn(T, D)).sum().backward()
        except Exception as e:  # noqa: BLE001 - the error is the observation
            error = _msg(e)
    stats = torch._dynamo.utils.counters["stats"]
    return {
        "error": error,
        "unsupported": error is not None and error.startswith("Unsupported"),
        "graphs": int(stats["unique_graphs"]),
        "breaks": int(sum(torch._dynamo.utils.counters["graph_break"].values())),
    }


def bug() -> dict:
    """fullgraph=True over a block whose experts are an FSDP2 unit of their own: Unsupported in the forward."""
    return _step(fullgraph=True, experts_unit=True)


def fix() -> dict:
    """The block's children compiled one by one, the experts' `forward` as a function (torchtitan's MoE-aware
    compile): the experts' FSDP hooks stay outside every compiled region."""
    return _step(fullgraph=True, experts_unit=True, compile_children=True)


def variant_experts_with_the_block() -> dict:
    """The experts sharded with the block (one unit): fullgraph=True compiles the block in one graph."""
    return _step(fullgraph=True, experts_unit=False)


def variant_fullgraph_false() -> dict:
    """fullgraph=False: the block runs, split by graph breaks at the experts' hooks."""
    return _step(fullgraph=False, experts_unit=True)


USER_MODELS_NEED = "process_group"  # `user_models()` shards with FSDP2: call it, and measure, inside one


def user_models() -> dict:
    """C53 as a user's training code holds it, inside a process group the caller opened: the block compiled whole
    (aot_eager, fullgraph=True), then its experts and itself sharded (torchtitan's order); and its input."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    block = Block()
    block.compile(backend="aot_eager", fullgraph=True)
    fully_shard(block.experts)
    fully_shard(block)
    return {"C53": {"model": block, "inputs": (torch.randn(T, D),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    for name in ("bug", "fix", "variant_experts_with_the_block", "variant_fullgraph_false"):
        print(name, json.dumps(globals()[name]()))
