"""The Explorer's models: the toolkit's own and each installed stack's, named as the matrix names them, at its size.

A choice is a matrix block (`analysis/blocks.py`): "toolkit" for the toolkit's model (the Explorer's own controls
size it), `PREFIX:FAMILY` for another stack's (its sliders set the family's layers, experts and top-k), and the
scenario's model of yours as `user:SPEC[#CLASS]` (its build() sizes it).
"""

from __future__ import annotations

from typing import Any

from ..analysis.blocks import block_of, config_of, user_block
from ..stacks import get

MODELS: dict[str, dict[str, str]] = {
    "toolkit": {"toolkit": "the toolkit's model"},
    "torchtitan": {"titan:qwen3_moe": "torchtitan Qwen3-MoE", "titan:deepseek_v3": "torchtitan DeepSeek-V3"},
    "transformers": {
        "hf:qwen3_moe": "transformers Qwen3-MoE",
        "hf:mixtral": "transformers Mixtral",
        "hf:deepseek_v3": "transformers DeepSeek-V3",
        "hf:qwen3": "transformers Qwen3 (dense)",
    },
}
"""Stack name → its models the Explorer offers: block → label."""


def choices(scenario: Any) -> list[tuple[str, str]]:
    """(label, block) of every stack's models whose package is installed, and the scenario's model of yours beside
    them, as the matrix addresses it."""
    out = [
        (label, block) for name, models in MODELS.items() if get(name).available() for block, label in models.items()
    ]
    if scenario.stack == "user":
        out.append((f"your model: {scenario.config.label}", user_block(scenario.config)))
    return out


def choice_of(scenario: Any) -> str:
    """The block of the scenario's model among `choices`: another stack's by its family (the sliders start at its
    sizes), yours by its build(), else "toolkit"."""
    if scenario.stack == "user":
        return user_block(scenario.config)
    if scenario.stack == "toolkit":
        return "toolkit"
    return block_of(scenario.stack, scenario.config.family)


def sized(block: str, *, n_layers: int, n_experts: int, top_k: int) -> Any:
    """The model config of another stack's `block` at the Explorer's size (what the family cannot take is left at its
    own: its config's `at_size`)."""
    return config_of(block).at_size(n_layers=n_layers, n_experts=n_experts, top_k=top_k)


__all__ = ["MODELS", "choice_of", "choices", "sized"]
