"""A recompute that draws dropout's random numbers again: silently wrong gradients, compiled (C60) and eager (C61).

Symptom (C60): with `torch._functorch.config.activation_memory_budget` below 1 (0, and the knapsack's 0 < b < 1), the
partitioner recomputes a compiled graph's dropout in the backward graph, where it draws a new mask: the loss equals the
same compile without a budget, the gradients do not, and nothing warns. The backward graph holds the random op.
Symptom (C61): an eager checkpoint with `preserve_rng_state=False` (torch_remat's default too) re-runs dropout in its
recompute with the RNG wherever it is then: another mask, the same silent result. A compiled checkpoint with the same
option is exact: its compiled recompute saves the random outputs.

Fix: C60 keep the budget at 1 for graphs with random ops, or checkpoint them explicitly (compile(AC(x)), exact);
C61 `preserve_rng_state=True` (torch's default), or with torch_remat a RecomputeStateHook restoring the RNG.

Upstream: C60 pytorch#190758 and #190717 (open; fixes proposed in pytorch#190759, #191684). C61 is the documented
behaviour of preserve_rng_state=False; torchtitan made True its default in torchtitan#2380.

Run: python c60_random_numbers_in_recompute.py

Shape suffixes: B batch, D dim, H hidden.
"""

import json

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

CASE = "C60"
CASES = {"C60": "bug", "C61": "variant_eager_checkpoint"}
NEEDS = "cpu"

B, D, H = 8, 32, 64


def _weights():
    torch.manual_seed(0)
    return torch.randn(D, H) * 0.2, torch.randn(H, D) * 0.2


def _block(x_BD, w1_DH, w2_HD):
    h_BH = F.dropout(torch.relu(x_BD @ w1_DH), 0.5, training=True)
    return h_BH @ w2_HD


def _step(fn, budget: float | None = None) -> tuple[float, torch.Tensor]:
    """Loss and the first weight's gradient of one step of `fn` from the same seed."""
    torch._dynamo.reset()
    w1_DH, w2_HD = (w.clone().requires_grad_() for w in _weights())
    x_BD = torch.randn(B, D, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # the step's random numbers
    if budget is None:
        loss = fn(x_BD, w1_DH, w2_HD).square().mean()
        loss.backward()
    else:
        with torch._functorch.config.patch(activation_memory_budget=budget):
            loss = fn(x_BD, w1_DH, w2_HD).square().mean()
            loss.backward()
    return loss.detach().item(), w1_DH.grad


def _backward_random_ops(budget: float) -> list[str]:
    """The random ops the partitioner places in the compiled backward graph (each draws new numbers there)."""
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition

    found: list[str] = []

    def bw_compiler(gm, example_inputs):
        found.extend(
            str(n.target)
            for n in gm.graph.nodes
            if n.op == "call_function" and torch.Tag.nondeterministic_seeded in (getattr(n.target, "tags", ()) or ())
        )
        return make_boxed_func(gm)

    with torch._functorch.config.patch(activation_memory_budget=budget):
        f = aot_function(
            _block,
            fw_compiler=lambda gm, ex: make_boxed_func(gm),
            bw_compiler=bw_compiler,
            partition_fn=min_cut_rematerialization_partition,
        )
        w1_DH, w2_HD = (w.clone().requires_grad_() for w in _weights())
        f(torch.randn(B, D), w1_DH, w2_HD).sum().backward()
    return found


def bug() -> dict:
    """C60: the same compiled block with budgets 1, 0.5 and 0: one loss, other gradients below 1."""
    compiled = torch.compile(_block, backend="aot_eager", fullgraph=True)
    ref_loss, ref_grad = _step(compiled, 1.0)
    out = {"backward_random_ops": _backward_random_ops(0.0)}
    for budget in (0.5, 0.0):
        loss, grad = _step(compiled, budget)
        out[f"same_loss_{budget}"] = abs(loss - ref_loss) < 1e-6
        out[f"grads_match_{budget}"] = bool(torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-6))
    out["redraws"] = bool(out["backward_random_ops"]) and not out["grads_match_0.0"]
    return out


def fix() -> dict:
    """C60's fix: checkpoint the block explicitly inside the compile, budget left at 1: exact, and no random op in the
    backward graph."""

    def checkpointed(x_BD, w1_DH, w2_HD):
        return checkpoint(_block, x_BD, w1_DH, w2_HD, use_reentrant=False)

    ref_loss, ref_grad = _step(torch.compile(_block, backend="aot_eager", fullgraph=True), 1.0)
    loss, grad = _step(torch.compile(checkpointed, backend="aot_eager", fullgraph=True), 1.0)
    return {
        "same_loss": abs(loss - ref_loss) < 1e-6,
        "grads_match": bool(torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-6)),
        "backward_random_ops": _backward_random_ops(1.0),
    }


def variant_eager_checkpoint() -> dict:
    """C61: an eager checkpoint of the block without the RNG restored, and with it, against no checkpoint."""
    ref_loss, ref_grad = _step(_block)
    out = {}
    for preserve in (False, True):

        def ck(x_BD, w1_DH, w2_HD, preserve=preserve):
            return checkpoint(_block, x_BD, w1_DH, w2_HD, use_reentrant=False, preserve_rng_state=preserve)

        loss, grad = _step(ck)
        out[f"same_loss_preserve_{preserve}"] = abs(loss - ref_loss) < 1e-6
        out[f"grads_match_preserve_{preserve}"] = bool(torch.allclose(grad, ref_grad, rtol=1e-4, atol=1e-6))
    out["redraws"] = out["same_loss_preserve_False"] and not out["grads_match_preserve_False"]
    return out


class _Block(torch.nn.Module):
    def __init__(self, checkpointed: bool = False):
        super().__init__()
        self.w1_DH, self.w2_HD = (torch.nn.Parameter(w) for w in _weights())
        self.checkpointed = checkpointed

    def forward(self, x_BD):
        if self.checkpointed:
            return checkpoint(_block, x_BD, self.w1_DH, self.w2_HD, use_reentrant=False, preserve_rng_state=False)
        return _block(x_BD, self.w1_DH, self.w2_HD)


def user_models() -> dict:
    """Each case as a user's training code holds it: the model, its inputs, and the torch config in force."""
    x_BD = torch.randn(B, D, generator=torch.Generator().manual_seed(1))
    return {
        "C60": {
            "model": torch.compile(_Block(), backend="aot_eager", fullgraph=True),
            "inputs": (x_BD,),
            "config": {"torch._functorch.config.activation_memory_budget": 0.0},
        },
        "C61": {"model": _Block(checkpointed=True), "inputs": (x_BD,)},
    }


if __name__ == "__main__":
    print(torch.__version__)
    print(json.dumps({"bug": bug(), "fix": fix(), "eager": variant_eager_checkpoint()}, indent=1))
