"""transformers' Mixtral under a SAC policy that saves aten.topk: "Tensor cached ... has been mutated" in backward.

Symptom: `MixtralForCausalLM` with transformers' own checkpointing and a selective policy passed through it
(`gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": ...})`) that
saves `aten.topk` — torchtitan's per-op save list has it since torchtitan#3146, and it is the usual cure for routing
that flips in the recompute (C47) — fails in backward: RuntimeError "Tensor cached during selective activation
checkpoint has been mutated". Qwen3-MoE with its default `norm_topk_prob=False`, and the same policy without topk,
pass.

Mechanism: Mixtral's router normalises the top-k weights in place (`router_top_value /= router_top_value.sum(...)`,
modeling_mixtral.py): the output SAC cached is then written, and SAC refuses a cached tensor whose version moved.

Fix: leave aten.topk out of the save list for Mixtral (or save the router's output after the division: a policy
on `aten.div`), or normalise out of place in the model.

Upstream: not reported (2026-12); near C6 (a policy saving all ops hits the same error) and C47 (why topk is saved).

Run: python c68_transformers_mixtral_sac_saved_topk_mutated.py   (needs transformers)
"""

import json
from functools import partial

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
from transformers import AutoConfig, AutoModelForCausalLM

CASE = "C68"
NEEDS = "cpu"


def _policy(save_ops, ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in save_ops else CheckpointPolicy.PREFER_RECOMPUTE


def _step(family: str, save_ops) -> dict:
    torch._dynamo.reset()
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    experts = (
        dict(intermediate_size=32, num_local_experts=4)
        if family == "mixtral"
        else dict(intermediate_size=128, moe_intermediate_size=32, num_experts=4)
    )
    config = AutoConfig.for_model(family, **sizes, **experts, num_experts_per_tok=2, vocab_size=128, use_cache=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    context = partial(create_selective_checkpoint_contexts, partial(_policy, frozenset(save_ops)))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": context})
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    try:
        model(input_ids=ids, labels=ids).loss.backward()
    except RuntimeError as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    return {"error": ""}


def bug() -> dict:
    """Save mm and topk (torchtitan's list, abridged) on Mixtral and on Qwen3-MoE."""
    ops = (torch.ops.aten.mm.default, torch.ops.aten.topk.default)
    mixtral, qwen = _step("mixtral", ops), _step("qwen3_moe", ops)
    return {
        "error": mixtral["error"],
        "qwen3_moe_error": qwen["error"],
        "mutated": "has been mutated" in mixtral["error"] and not qwen["error"],
    }


def fix() -> dict:
    """The same policy without aten.topk: Mixtral's step runs."""
    return {"mixtral_without_topk": _step("mixtral", (torch.ops.aten.mm.default,))}


def user_models() -> dict:
    """The case as a user's training code holds it: Mixtral with transformers' checkpointing under a SAC policy that
    saves mm and topk, and the inputs (labels given: the model returns its loss)."""
    sizes = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    config = AutoConfig.for_model(
        "mixtral", **sizes, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, vocab_size=128,
        use_cache=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    save_ops = frozenset((torch.ops.aten.mm.default, torch.ops.aten.topk.default))
    context = partial(create_selective_checkpoint_contexts, partial(_policy, save_ops))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": context})
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return {"C68": {"model": model, "inputs": (), "kwargs": {"input_ids": ids, "labels": ids}}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
