"""transformers: a checkpointed decoder layer under torch.compile runs eagerly ("HOP: Unsafe side effect").

Symptom: with transformers' own activation checkpointing on (`gradient_checkpointing_enable()`, either
`use_reentrant`), compiling each decoder layer the way users do (`layer.compile()`) gives no graph at all: Dynamo
reports "HOP: Unsafe side effect" inside the checkpoint and runs every layer eagerly, silently (fullgraph=False).
Compiling the whole model (`model.compile()`) breaks the graph at the same place, and the layers run eagerly inside
it. Without checkpointing the same layers compile. Gradients stay right; only the compile is gone.

Mechanism: transformers 5.x checkpoints each `GradientCheckpointingLayer`'s `forward` inside the module's call, so a
compiled layer holds the checkpoint, which Dynamo turns into the `tag_activation_checkpoint` higher-order op; its
body must have no side effect a recompute would repeat. The attention's `use_kernelized_func` wrapper (the `kernels`
package, 0.19) sets a `CompileableContextVar`, which under compile assigns an attribute of a module-level object:
a side effect, so the HOP is refused and the frame falls back to eager.

Fix: `torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True` (Dynamo's own hint, as torchtitan's
`apply_compile` sets it): one graph for the layers, the recompute moves into the compiled backward, gradients exact.

Upstream: same error as torchtitan#3104 and torchtitan#2341 (other code); not reported to transformers (2026-12).

Run: python c67_transformers_compiled_checkpoint_layer_runs_eagerly.py   (needs transformers)
"""

import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM

CASE = "C67"
NEEDS = "cpu"


def _model(checkpointing: bool):
    config = AutoConfig.for_model(
        "qwen3_moe",
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        vocab_size=128,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _step(checkpointing: bool, scope: str, skip_side_effects: bool = False) -> dict:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    graphs = [0]

    def backend(gm, example_inputs):
        graphs[0] += 1
        return gm.forward

    model = _model(checkpointing)
    for m in [model] if scope == "model" else list(model.model.layers):
        m.compile(backend=backend)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=skip_side_effects):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    reasons = " ".join(counters["graph_break"])
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    torch._dynamo.reset()
    return {"graphs": graphs[0], "unsafe_side_effect": "Unsafe side effect" in reasons, "grads": grads}


def _eager_grads() -> torch.Tensor:
    model = _model(False)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def bug() -> dict:
    """Each decoder layer compiled, with and without transformers' checkpointing; the whole model compiled."""
    per_layer, no_ac, whole = _step(True, "blocks"), _step(False, "blocks"), _step(True, "model")
    return {
        "per_layer_graphs": per_layer["graphs"],
        "per_layer_without_checkpointing_graphs": no_ac["graphs"],
        "unsafe_side_effect": per_layer["unsafe_side_effect"],
        "whole_model_unsafe_side_effect": whole["unsafe_side_effect"],
        "falls_back": per_layer["graphs"] == 0 and no_ac["graphs"] > 0 and per_layer["unsafe_side_effect"],
    }


def fix() -> dict:
    """Dynamo's side-effect flag: the checkpointed layers compile, and their gradients equal eager's."""
    fixed = _step(True, "blocks", skip_side_effects=True)
    return {
        "per_layer_graphs": fixed["graphs"],
        "grads_match_eager": bool(torch.allclose(fixed["grads"], _eager_grads(), atol=1e-5)),
    }


def user_models() -> dict:
    """The case as a user's training code holds it: transformers' checkpointing on, each decoder layer compiled, and
    the inputs (labels given: the model returns its loss)."""
    model = _model(True)
    for layer in model.model.layers:
        layer.compile(backend="aot_eager")
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    # C2 too: the general case, a checkpoint Dynamo gave up inside a compiled region.
    return {"C67": {"model": model, "inputs": (), "kwargs": {"input_ids": ids, "labels": ids}, "also": ["C2"]}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
