"""Per-layer selective AC driven by a module-global counter checkpoints different layers in the second model built.

Symptom: torchtitan's old "selective AC every N layers" (`selective_ac_option = "2"`) decided which blocks to wrap
with a module-level `_layer_sac_count` that was never reset. The first model built in a process gets blocks 1, 3, …
checkpointed; any later model — a second pipeline stage, an evaluation copy, the next test — continues the count, so
with an odd number of layers it gets blocks 0, 2, … instead. Memory and speed then depend on how many models were
built before, silently.

Upstream: torchtitan `_apply_ac_to_transformer_block` (`_layer_sac_count`), removed with the centralised AC policy
(torchtitan#2357); pipeline-parallel stages each apply AC to their own module.

Run: python c27_per_layer_sac_counter.py
"""

import json

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper, checkpoint_wrapper

CASE = "C27"
NEEDS = "cpu"

N_LAYERS, EVERY = 3, 2

_layer_sac_count = 0  # the old global, as torchtitan had it


def _old_apply_ac_to_block(block: nn.Module) -> nn.Module:
    global _layer_sac_count
    _layer_sac_count += 1
    if _layer_sac_count % EVERY == 0:
        return checkpoint_wrapper(block, preserve_rng_state=False)
    return block


def _new_apply_ac_to_block(block: nn.Module, index: int) -> nn.Module:
    # The decision depends on the block's own index, so every model gets the same pattern.
    return checkpoint_wrapper(block, preserve_rng_state=False) if (index + 1) % EVERY == 0 else block


def _model() -> nn.ModuleList:
    return nn.ModuleList(nn.Linear(8, 8) for _ in range(N_LAYERS))


def _wrapped(layers: nn.ModuleList) -> list[int]:
    return [i for i, m in enumerate(layers) if isinstance(m, CheckpointWrapper)]


def bug() -> dict:
    """Two identical models, AC applied the old way: different blocks checkpointed."""
    global _layer_sac_count
    _layer_sac_count = 0
    out = {}
    for name in ("first_model", "second_model"):
        layers = _model()
        for i in range(N_LAYERS):
            layers[i] = _old_apply_ac_to_block(layers[i])
        out[name] = _wrapped(layers)
    return out


def fix() -> dict:
    """The decision from the block index: the same blocks in every model."""
    out = {}
    for name in ("first_model", "second_model"):
        layers = _model()
        for i in range(N_LAYERS):
            layers[i] = _new_apply_ac_to_block(layers[i], i)
        out[name] = _wrapped(layers)
    return out


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
