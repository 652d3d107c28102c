"""toolkit: see how activation checkpointing, torch.compile and Mixture-of-Experts compose on a real PyTorch model."""

from ._config import ConfigError
from .ac import ACConfig, PolicyDecision, SelectiveOpPolicy, apply_ac, default_save_ops, record_policy_decisions, remove_ac
from .compile import CompileConfig, apply_compile, remove_compile
from .models import Batch, ModelConfig, build_model, loss_fn, make_batch, train_step
from .naming import canonical_name, get_module, named_modules, unwrap
from .recipes import RECIPES, apply_recipe, prepare, reset
from .report import Report
from .runner import Scenario, measure, run
from .presets import PRESETS, preset
from . import presets
from . import bugs, catalogue, display, matrix, repro, widgets
from .fullsize import LAYER_SHAPES, Estimate, estimate
from .notebook import setup_notebook
from .state import applied, global_state, torch_settings

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "ACConfig", "PolicyDecision", "SelectiveOpPolicy", "apply_ac", "default_save_ops",
    "record_policy_decisions", "remove_ac", "CompileConfig", "apply_compile", "remove_compile", "Batch",
    "ModelConfig", "build_model", "loss_fn", "make_batch", "train_step", "canonical_name", "get_module",
    "named_modules", "unwrap", "RECIPES", "apply_recipe", "prepare", "reset", "applied", "global_state",
    "torch_settings", "Report", "Scenario", "measure", "run", "PRESETS", "preset", "setup_notebook", "display", "catalogue", "matrix", "widgets", "bugs", "repro", "estimate", "Estimate", "LAYER_SHAPES",
    "__version__",
]
