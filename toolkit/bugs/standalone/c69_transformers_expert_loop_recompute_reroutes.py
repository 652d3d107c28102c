"""transformers' MoE expert loop under its checkpointing: a recompute that re-routes saves another number of tensors.

Symptom (transformers#47467, Qwen3.5-MoE): with `gradient_checkpointing_enable()`, backward raises
`torch.utils.checkpoint.CheckpointError` ("A different number of tensors was saved during the original forward and
recomputation", or "different metadata") — or, with experts of fixed shape, the gradients are silently wrong. Here on
Qwen3-MoE (`experts_implementation="eager"`, the same loop) the recompute's input is made to differ the
way the report describes (there, GPTQ kernels' run-to-run drift on GPU; here, attention dropout drawn again because
`preserve_rng_state=False`), and the step fails the same way; with `grouped_mm` experts it runs and the gradients
differ from an uncheckpointed step.

Mechanism: the experts' forward loops `for expert_idx in expert_hit`, the experts that received tokens in this call.
A recompute whose hidden states differ re-runs the router, which can pick other experts: the loop runs another number
of times, saving another number of tensors (or tensors of other shapes), which non-reentrant checkpoint refuses.

Fix: make the recompute see what the forward saw (keep the RNG state: `preserve_rng_state=True`, the default; or save
the routing decision: `aten.topk` in a SAC policy, C47 — but see C68 for Mixtral), or loop over every expert
(transformers PR #47508's proposal).

Upstream: huggingface/transformers#47467 (closed), PR #47508 (closed unmerged); near C47 and C60.

Run: python c69_transformers_expert_loop_recompute_reroutes.py   (needs transformers)
"""

import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM

CASE = "C69"
NEEDS = "cpu"


def _model(experts: str):
    config = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=8,
        num_experts_per_tok=2,
        vocab_size=128,
        attention_dropout=0.5,
        use_cache=False,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", experts_implementation=experts).train()


def _step(experts: str, kwargs) -> dict:
    torch._dynamo.reset()
    model = _model(experts)
    if kwargs is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    try:
        model(input_ids=ids, labels=ids).loss.backward()
    except Exception as e:  # CheckpointError is a RuntimeError
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    return {"error": "", "grads": torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])}


def bug() -> dict:
    """The eager expert loop and grouped_mm experts, checkpointed with the RNG state not kept."""
    redraw = {"use_reentrant": False, "preserve_rng_state": False}
    loop = _step("eager", redraw)
    grouped, plain = _step("grouped_mm", redraw), _step("grouped_mm", None)
    return {
        "error": loop["error"],
        "grouped_mm_grads_match": not grouped["error"] and bool(torch.allclose(grouped["grads"], plain["grads"])),
        "reroutes": "CheckpointError" in loop["error"],
    }


def fix() -> dict:
    """The RNG state kept (transformers' default): the recompute routes as the forward did."""
    kept = _step("eager", {"use_reentrant": False})
    plain = _step("eager", None)
    match = not kept["error"] and bool(torch.allclose(kept["grads"], plain["grads"]))
    return {"error": kept["error"], "grads_match": match}


def user_models() -> dict:
    """The case as a user's training code holds it: the eager expert loop checkpointed without the RNG state kept,
    and the inputs (labels given: the model returns its loss)."""
    model = _model("eager")
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False, "preserve_rng_state": False}
    )
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return {"C69": {"model": model, "inputs": (), "kwargs": {"input_ids": ids, "labels": ids}}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
