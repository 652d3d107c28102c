"""Where each public name comes from: imported whole (seconds: torch) on first use of a name of `toolkit.__all__`."""

# ruff: noqa: F401 - the names are re-exported; the list of them is toolkit.__all__

from . import bugs, compat
from ._config import ConfigError
from .analysis import catalogue, classify, matrix, sweep
from .analysis.plan import plan
from .bugs import repro
from .estimation import LAYER_SHAPES, Estimate, estimate
from .execution import DistributedReport, measure, run, run_distributed
from .measurement import PRESETS, Report, Scenario, preset, presets, report
from .models import Batch, ModelConfig, build_model, loss_fn, make_batch
from .notebook.setup import setup_notebook
from .stacks.torchtitan import TorchtitanConfig
from .stacks.transformers import TransformersConfig
from .transforms import (
    RECIPES,
    ACConfig,
    CompileConfig,
    PolicyDecision,
    SelectiveOpPolicy,
    applied,
    apply_ac,
    apply_compile,
    apply_recipe,
    canonical_name,
    default_save_ops,
    get_module,
    global_state,
    named_modules,
    naming,
    prepare,
    record_policy_decisions,
    remove_ac,
    remove_compile,
    reset,
    torch_settings,
    train_step,
    unwrap,
)
