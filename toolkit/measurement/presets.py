"""Named scenarios for `python -m toolkit run --preset NAME`, the notebooks and the tests."""

from __future__ import annotations

from .._config import ConfigError
from ..models import ModelConfig
from ..transforms import ACConfig, CompileConfig
from ..transforms.recipes import RECIPES
from .scenario import Scenario

_MOE = ModelConfig()
# PR #2052's era: the 2025 layout (`moe.experts`) with for-loop experts, whose `.tolist()` breaks graphs (C2).
_MOE_2025 = ModelConfig(layout="torchtitan_2025", experts_impl="for_loop")

PRESETS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(name="moe_eager", model=_MOE),
        Scenario(name="moe_full_ac", model=_MOE, ac=ACConfig.of(mode="full")),
        Scenario(name="moe_selective_ac", model=_MOE, ac=ACConfig.of(mode="selective_op")),
        Scenario(name="moe_compile_blocks", model=_MOE, compile=CompileConfig(scope="blocks", fullgraph=True)),
        Scenario(
            name="graph_break_in_checkpoint",
            model=_MOE_2025,
            ac=ACConfig.of(mode="full"),
            compile=CompileConfig(scope="blocks"),
        ),
        Scenario(
            name="memory_budget",
            model=_MOE,
            ac=ACConfig.of(mode="memory_budget", memory_budget=0.3),
            compile=CompileConfig(scope="blocks", fullgraph=True),
        ),
        Scenario(name="dense_selective_ac", model=_MOE.replace(moe_layers="none"), ac=ACConfig.of(mode="selective_op")),
        Scenario(
            name="torchtitan_0_3_0", model=RECIPES["torchtitan_0_3_0"].model_config(_MOE), recipe="torchtitan_0_3_0"
        ),
        # The recipe says what it needs of the model (its era's layout, the stand-in FSDP hook): not written here.
        Scenario(
            name="pr2052", model=RECIPES["torchtitan_2025_09"].model_config(_MOE_2025), recipe="torchtitan_2025_09"
        ),
    )
}


def preset(name: str) -> Scenario:
    """The preset scenario called `name`."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ConfigError("preset", "name", f"{name!r} is not a preset.", f"use one of {', '.join(PRESETS)}.")
    return PRESETS[name]
