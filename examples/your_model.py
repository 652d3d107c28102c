"""A model of your own, as `python -m toolkit matrix --model examples/your_model.py:build` sweeps it.

`build()` returns the model at a tiny size and its inputs (optionally a loss function as a third item). The toolkit
finds the repeated blocks as FSDP's auto-wrap would (here `trunk`, the ModuleList holding the most parameters) or
takes `--blocks Block`, then applies its AC modes and compiles to them, cell by cell.
"""

import torch
from torch import nn


class Experts(nn.Module):
    """Top-1 routing over a loop of small experts: a data-dependent MoE, as many users write one."""

    def __init__(self, dim: int, n: int = 4):
        super().__init__()
        self.router = nn.Linear(dim, n, bias=False)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n))

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            mask = choice == i
            out[mask] = expert(x[mask])
        return out


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mix = nn.Linear(dim, dim)
        self.moe = Experts(dim)

    def forward(self, x):
        h = x + torch.relu(self.mix(self.norm(x)))
        return h + self.moe(h)


class YourModel(nn.Module):
    def __init__(self, dim: int = 32, n_blocks: int = 2, vocab: int = 64):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.trunk = nn.ModuleList(Block(dim) for _ in range(n_blocks))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.trunk:
            x = block(x)
        return self.head(x)


def build():
    model = YourModel()
    tokens = torch.randint(0, 64, (2, 16))
    return model, tokens, lambda logits: nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
