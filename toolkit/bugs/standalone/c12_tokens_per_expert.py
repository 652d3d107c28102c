"""AC recompute repeats an MoE's in-place `tokens_per_expert` update in eager, but not inside compile(AC(x)).

Symptom: an MoE that counts routed tokens into a buffer in its forward (aux-loss-free load balancing, as torchtitan
does) has counted every token twice after backward when the block is checkpointed and runs eagerly (full AC or SAC)
or as AC(compile(x)): the recompute replays the `add_`. Inside compile(AC(x)) the functionalized mutation is applied
once, so the count is right. torchtitan's optimizer hook halves the buffer whenever the block is wrapped in a
non-reentrant checkpoint — right for eager AC, off by 2x when the checkpoint is compiled.

Upstream: torchtitan#1593 (the halving hack, still present), torchtitan components/optimizer (the hook).

Run: python c12_tokens_per_expert.py

Shape suffixes: T tokens, D model dim, E routed experts, K top-k.
"""

import json
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CASE = "C12"
NEEDS = "cpu"

T, D, E, K = 64, 32, 4, 2


class CountingRouter(nn.Module):
    """Top-k routing that counts tokens per expert into a buffer, in place, during the forward."""

    def __init__(self, count_inside: bool = True):
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)
        self.register_buffer("tokens_per_expert", torch.zeros(E))
        self.count_inside = count_inside

    def forward(self, x_TD):
        scores_TE = torch.sigmoid(self.gate(x_TD))
        weights_TK, ids_TK = torch.topk(scores_TE, K, dim=-1)
        counts_E = torch.zeros(E).scatter_add_(0, ids_TK.flatten(), torch.ones(T * K))
        if self.count_inside:
            self.tokens_per_expert.add_(counts_E)
        return x_TD * weights_TK.sum(-1, keepdim=True), counts_E


def _key(order: str) -> str:
    return order.replace(" ", "_").replace("(", "_").replace(")", "")


def _count(order: str, count_inside: bool = True) -> tuple[int, int]:
    """Tokens counted after the forward and after the backward, for one way of combining AC and compile."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    router = CountingRouter(count_inside)
    x_TD = torch.randn(T, D, requires_grad=True)
    ac = partial(checkpoint, use_reentrant=False)
    if order == "eager AC":
        fn = lambda x: ac(router, x)  # noqa: E731
    elif order == "AC(compile)":
        compiled = torch.compile(router, backend="aot_eager")
        fn = lambda x: ac(compiled, x)  # noqa: E731
    elif order == "compile(AC)":
        fn = torch.compile(lambda x: ac(router, x), backend="aot_eager", fullgraph=True)
    else:
        fn = router
    out, counts_E = fn(x_TD)
    if not count_inside:
        # The update happens outside the checkpointed region, so no recompute can repeat it.
        router.tokens_per_expert.add_(counts_E.detach())
    after_forward = int(router.tokens_per_expert.sum())
    out.sum().backward()
    return after_forward, int(router.tokens_per_expert.sum())


ORDERS = ("no AC", "eager AC", "AC(compile)", "compile(AC)")


def bug() -> dict:
    """Tokens counted [after forward, after backward]: eager AC and AC(compile) count each token twice, compile(AC)
    once — the same model, two different load-balancing signals."""
    return {_key(order): list(_count(order)) for order in ORDERS}


def fix() -> dict:
    """Return the counts and update the buffer outside the checkpointed region: every order counts T·K once."""
    return {_key(order): list(_count(order, count_inside=False)) for order in ORDERS}


def variant_halving_hack() -> dict:
    """torchtitan's optimizer hook halves the count whenever the block is a non-reentrant checkpoint: right for eager
    AC and AC(compile), wrong (half the tokens) for compile(AC). True = the halved count is T·K."""
    return {_key(order) + "_halved_correct": _count(order)[1] // 2 == T * K for order in ORDERS[1:]}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
    print("halving hack", json.dumps(variant_halving_hack()))
