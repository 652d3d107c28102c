"""Every CheckpointWrapper shares one `forward`: compiled for submodules called with different arguments, it recompiles.

Symptom: torchtitan's 2025 per-submodule AC (the FlexAttention "flex hack": attention and feed-forward / MoE wrapped in
`checkpoint_wrapper` separately) with each wrapper compiled: the first wrapper compiles `CheckpointWrapper.forward`
for attention's call `(x, freqs)`; the feed-forward's call `(x)` fails the guard `len(args) == 2` on that same code
object and Dynamo compiles it again — one recompile, whatever the number of layers, on every step's first pass. It is
benign for two call signatures, but each distinct one takes an entry of the code object's cache against
`recompile_limit` (8), past which Dynamo runs the wrappers eagerly without a word. The central list's
`moe:for_loop | recipe torchtitan_2025_09 + FSDP blocks` cell is this recompile.

Fix: checkpoint (and compile) whole blocks, each called the same way — torchtitan since #2118 — so that the shared
forward sees one call signature.

Upstream: torchtitan#2118 (removed the per-submodule wrapping), torchtitan#1895.

Run: python c56_checkpoint_wrappers_share_one_compiled_forward.py

Shapes: T tokens, D model dim.
"""

import json

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

CASE = "C56"
NEEDS = "cpu"

T, D, LAYERS = 16, 64, 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wo = nn.Linear(D, D)

    def forward(self, x_TD, freqs_TD):
        return self.wo(x_TD * freqs_TD)


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Linear(D, D)

    def forward(self, x_TD):
        return torch.relu(self.w(x_TD))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = Attention()
        self.feed_forward = FeedForward()

    def forward(self, x_TD, freqs_TD):
        h_TD = x_TD + self.attention(x_TD, freqs_TD)
        return h_TD + self.feed_forward(h_TD)


def _step(*, per_submodule: bool) -> dict:
    """LAYERS blocks, checkpointed and compiled per submodule or per block (aot_eager); one training step."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch._dynamo.utils.guard_failures.clear()
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(LAYERS))
    for i, block in enumerate(blocks):
        if per_submodule:
            for name in ("attention", "feed_forward"):
                wrapped = checkpoint_wrapper(getattr(block, name), preserve_rng_state=False)
                setattr(block, name, torch.compile(wrapped, backend="aot_eager", fullgraph=True))
        else:
            blocks[i] = torch.compile(
                checkpoint_wrapper(block, preserve_rng_state=False), backend="aot_eager", fullgraph=True
            )
    x_TD, freqs_TD = torch.randn(T, D, requires_grad=True), torch.randn(T, D)
    h_TD = x_TD
    for block in blocks:
        h_TD = block(h_TD, freqs_TD)
    h_TD.sum().backward()
    # Dynamo's record of the guards that failed, per code object: each failure is a recompile.
    reasons = [str(r) for failures in torch._dynamo.utils.guard_failures.values() for r in failures]
    return {
        "graphs": int(torch._dynamo.utils.counters["stats"]["unique_graphs"]),
        "recompiles": len(reasons),
        "len_args_guard": any("len(args)" in r for r in reasons),
    }


def bug() -> dict:
    """Attention and feed-forward wrapped and compiled apart: the shared forward recompiles for the second arity."""
    return _step(per_submodule=True)


def fix() -> dict:
    """Whole blocks wrapped and compiled, each called the same way: one graph, no recompile."""
    return _step(per_submodule=False)


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))

    def forward(self, x_TD, freqs_TD):
        for block in self.layers:
            x_TD = block(x_TD, freqs_TD)
        return x_TD


def user_models() -> dict:
    """The case as a user's training code holds it: each block's attention and feed-forward wrapped and compiled
    apart, and the inputs."""
    torch.manual_seed(0)
    model = _Model()
    for block in model.layers:
        for name in ("attention", "feed_forward"):
            wrapped = checkpoint_wrapper(getattr(block, name), preserve_rng_state=False)
            setattr(block, name, torch.compile(wrapped, backend="aot_eager", fullgraph=True))
    return {"C56": {"model": model, "inputs": (torch.randn(T, D, requires_grad=True), torch.randn(T, D))}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
