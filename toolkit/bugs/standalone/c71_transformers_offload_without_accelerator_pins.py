"""transformers' offload=True on a torch built without any accelerator: "pin_memory=True requires ..." in the forward.

Symptom: `model.activation_checkpointing_enable(offload=True)` (transformers 5.25: `save_on_cpu` around each
checkpoint call) makes the training forward raise RuntimeError "pin_memory=True requires a CUDA or other accelerator
backend; no pinned memory allocator is available on this system" on a CPU-only torch (the CPU wheel). A CUDA build
of torch on a machine with no GPU runs it (its copies are not pinned), and so does the same model without offload.

Mechanism: with no accelerator transformers picks `device_type="cpu"` for `save_on_cpu(pin_memory=True, ...)`
(modeling_utils.py: "the activations already live on the host and there is nothing to copy off a device"), but
save_on_cpu pins whenever `torch.cpu.is_available()`, which is always true: `torch.empty(..., pin_memory=True)` then
fails for want of a pinned allocator.

Fix: leave offload off where torch has no accelerator (the activations are on the host already), or wrap the
checkpoint in `save_on_cpu(pin_memory=False)` yourself.

Upstream: not reported (2026-12).

Run: python c71_transformers_offload_without_accelerator_pins.py   (needs transformers)
"""

import json

import torch
from transformers import AutoConfig, AutoModelForCausalLM

CASE = "C71"
NEEDS = "cpu"


def _model(offload: bool) -> torch.nn.Module:
    config = AutoConfig.for_model(
        "qwen3",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=128,
        use_cache=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    model.activation_checkpointing_enable(offload=offload)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))


def _step(offload: bool) -> dict:
    torch._dynamo.reset()
    model, ids = _model(offload), _ids()
    try:
        model(input_ids=ids, labels=ids).loss.backward()
    except RuntimeError as e:
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
    return {"error": ""}


def bug() -> dict:
    """offload=True on this torch (the error needs a build with no accelerator at all, e.g. the CPU wheel)."""
    step = _step(offload=True)
    has_accelerator = torch.cuda.is_available() or torch.backends.cuda.is_built()
    return {**step, "cpu_only_build": not has_accelerator, "pin_error": "pin_memory=True requires" in step["error"]}


def fix() -> dict:
    """The same checkpointing without offload: the step runs (nothing was to be copied off a device)."""
    return {"without_offload": _step(offload=False)}


def user_models() -> dict:
    """C71 as a user's training code holds it: a small Qwen3 with transformers' own offloaded checkpointing, and
    its inputs (the error needs a torch built without any accelerator)."""
    return {"C71": {"model": _model(offload=True), "inputs": (), "kwargs": {"input_ids": _ids(), "labels": _ids()}}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
