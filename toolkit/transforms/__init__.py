"""Transforms applied from outside the model: AC, compile, recipes, and the torch settings they need.

AC is `apply_ac` with its SAC policies (`policies`), compile `apply_compile`; `naming` finds a model's modules whoever
built it; `settings` holds the global torch settings a transform needs, scoped to the step.
"""

from .ac import ACConfig, apply_ac, remove_ac
from .compile import BACKENDS, SCOPES, CompileConfig, apply_compile, remove_compile
from .containers import blocks
from .lifecycle import prepare, reset
from .naming import canonical_name, get_module, named_modules, unwrap
from .policies import PolicyDecision, SaveOpsPolicy, SelectiveOpPolicy, default_save_ops, record_policy_decisions
from .recipes import RECIPES, Recipe, apply_recipe
from .record import Applied, applied
from .settings import global_state, torch_settings
from .training import train_step

__all__ = [
    "ACConfig",
    "apply_ac",
    "blocks",
    "remove_ac",
    "BACKENDS",
    "SCOPES",
    "CompileConfig",
    "apply_compile",
    "remove_compile",
    "canonical_name",
    "get_module",
    "named_modules",
    "unwrap",
    "PolicyDecision",
    "SaveOpsPolicy",
    "SelectiveOpPolicy",
    "default_save_ops",
    "record_policy_decisions",
    "RECIPES",
    "Recipe",
    "apply_recipe",
    "prepare",
    "reset",
    "Applied",
    "applied",
    "global_state",
    "torch_settings",
    "train_step",
]
