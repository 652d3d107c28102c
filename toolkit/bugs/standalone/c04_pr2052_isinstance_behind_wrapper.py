"""Per-submodule SAC wrappers hide the MoE from an MoE-aware compile: it is compiled whole and raises Unsupported.

Symptom: torchtitan between torchtitan#1895 and torchtitan#2118 wrapped a block's `attention` and `moe` in separate
SAC checkpoint wrappers (the SAC + FlexAttention workaround), then compiled each child of the block, asking
`isinstance(child, MoE)` to leave the MoE's experts (with FSDP2's compiler-disabled pre-forward hook) eager. The child
is a `CheckpointWrapper`, so the check is False, the whole MoE is compiled with `fullgraph=True`, and the first step
raises `torch._dynamo.exc.Unsupported` on the experts' hook inside the checkpoint ("Skip calling
`torch.compiler.disable()`d function" / "Attempted to call function marked as skipped").

Mechanism: `isinstance(child, MoE)` is False on `CheckpointWrapper(MoE)` -> the else-branch compiles it whole with
fullgraph=True -> Dynamo speculates the checkpoint into its higher-order op and meets the disabled hook there, which it
can neither trace nor break at.

Fix: look under the wrapper (`isinstance(unwrap(child), MoE)`: the router and shared expert are compiled, the experts
stay eager), or checkpoint whole blocks instead of submodules (torchtitan#2118 removed the per-submodule wrapping).

Upstream: torchtitan#2052 (the report; warn and turn compile off for SAC + MoE, never merged), torchtitan#1895 (the
MoE-aware compile), torchtitan#2118 (removed the per-submodule SAC wrapping), torchtitan@2a7a148, torchtitan@575674a.

Run: python c04_pr2052_isinstance_behind_wrapper.py

Shape suffixes: T tokens, D model dim, E experts, K top-k, H expert hidden dim.
"""

import json
import re
from functools import partial
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

CASE = "C4"
NEEDS = "cpu"

T, D, E, K, H, HEADS = 64, 64, 4, 2, 128, 4


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    first = re.sub(r"(?<![\w.])(?:/[^\s:'\"]+)+", "<path>", first)
    return f"{type(e).__name__}: {first}"


@torch.compiler.disable
def _unshard(module: nn.Module, args: Any) -> None:
    """Stands in for FSDP2's pre-forward hook of `fully_shard(moe.experts)` (all-gather the weights), which Dynamo
    is told not to trace."""


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wqkv, self.wo = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        q, k, v = self.wqkv(x_TD).view(T, 3, HEADS, D // HEADS).permute(1, 2, 0, 3)
        return self.wo(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(T, D))


class Router(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(D, E, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        weights_TK, ids_TK = torch.topk(torch.sigmoid(self.gate(x_TD)), K, dim=-1)
        return torch.zeros(T, E).scatter_add(1, ids_TK, weights_TK)


class Experts(nn.Module):
    """SwiGLU experts, every expert on every token, masked by its gate; sharded on their own (the hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.05)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.05)
        self.register_forward_pre_hook(_unshard)

    def forward(self, x_TD: torch.Tensor, gate_TE: torch.Tensor) -> torch.Tensor:
        out_TD = torch.zeros_like(x_TD)
        for e in range(E):
            out_TD = out_TD + gate_TE[:, e : e + 1] * (F.silu(x_TD @ self.w1_EDH[e]) @ self.w2_EHD[e])
        return out_TD


class MoE(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router, self.experts = Router(), Experts()
        self.shared_experts = nn.Sequential(nn.Linear(D, H, bias=False), nn.SiLU(), nn.Linear(H, D, bias=False))

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        return self.experts(x_TD, self.router(x_TD)) + self.shared_experts(x_TD)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(D), nn.RMSNorm(D)
        self.attention, self.moe = Attention(), MoE()

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        h_TD = x_TD + self.attention(self.attention_norm(x_TD))
        return h_TD + self.moe(self.ffn_norm(h_TD))


def _save_mm(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


def sac_context() -> Any:
    return create_selective_checkpoint_contexts(_save_mm)


def apply_ac(block: Block, per_submodule: bool) -> None:
    """SAC on `attention` and `moe` separately (the flex workaround of that era), or on the whole block."""
    if per_submodule:
        for name in ("attention", "moe"):
            block.register_module(name, checkpoint_wrapper(getattr(block, name), context_fn=partial(sac_context)))


def unwrap(module: nn.Module) -> nn.Module:
    return getattr(module, "_checkpoint_wrapped_module", module)


def apply_compile(block: Block, see_through: bool, backend: Any) -> list[str]:
    """torchtitan#1895's MoE-aware compile: each child of the block compiled with fullgraph=True, except an MoE, of
    which only the router and the shared experts are compiled (its experts carry FSDP's hook). Returns what it
    compiled whole."""
    whole = []
    for name, child in list(block.named_children()):
        inner = unwrap(child) if see_through else child
        if isinstance(inner, MoE):
            for sub in ("router", "shared_experts"):
                inner.register_module(
                    sub, cast(nn.Module, torch.compile(getattr(inner, sub), backend=backend, fullgraph=True))
                )
        else:
            block.register_module(name, cast(nn.Module, torch.compile(child, backend=backend, fullgraph=True)))
            whole.append(name)
    return whole


class _WholeBlockSAC(nn.Module):
    """The block checkpointed whole (torchtitan#2118), its children then compiled by the same MoE-aware compile."""

    def __init__(self, block: Block):
        super().__init__()
        self.block = block

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x_TD, use_reentrant=False, context_fn=partial(sac_context))


def _run(per_submodule: bool = True, see_through: bool = False) -> dict[str, Any]:
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    torch.manual_seed(0)
    block = Block()
    reference = Block()
    reference.load_state_dict(block.state_dict())
    apply_ac(block, per_submodule)
    seen = type(block.moe).__name__
    counter = CompileCounterWithBackend("aot_eager")
    whole = apply_compile(block, see_through, counter)
    model: nn.Module = block if per_submodule else _WholeBlockSAC(block)
    x_TD = torch.randn(T, D, generator=torch.Generator().manual_seed(1), requires_grad=True)
    try:
        model(x_TD).square().mean().backward()
        error = None
    except Exception as e:  # noqa: BLE001 - the Unsupported is the observation
        error = _msg(e)
    grads_match = None
    if error is None:
        x_ref = x_TD.detach().clone().requires_grad_()
        reference(x_ref).square().mean().backward()
        grads_match = bool(torch.allclose(x_TD.grad, x_ref.grad, rtol=1e-4, atol=1e-6))  # type: ignore[arg-type]
    torch._dynamo.reset()
    return {
        "compile_saw": seen,
        "isinstance_moe": isinstance(unwrap(block.moe) if see_through else block.moe, MoE),
        "compiled_whole": whole,
        "graphs": counter.frame_count,
        "error": error,
        "grads_match": grads_match,
    }


def bug() -> dict:
    """Per-submodule SAC, then the MoE-aware compile: it sees a CheckpointWrapper, compiles the whole MoE with
    fullgraph=True, and the step raises Unsupported at the experts' hook."""
    return _run()


def fix() -> dict:
    """The compile looks under the wrapper; or the block is checkpointed whole: the experts stay eager, the step
    runs, and its input gradient equals the block's without AC or compile."""
    return {"see_through": _run(see_through=True), "whole_block_ac": _run(per_submodule=False)}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
