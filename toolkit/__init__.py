"""toolkit: see how activation checkpointing, torch.compile and Mixture-of-Experts compose on a real PyTorch model.

Layers, each importing only the ones before it: `compat` (every private torch API) → `models` (torch only) →
`transforms` (naming, AC and SAC policies, compile, recipes, settings) → `measure` (scenario, probes, step,
report, estimate) → `analysis` (classify, catalogue, matrix, sweep) → `bugs` (bug notebooks, repro bundles) and
`notebook` (display, widgets, setup) → `cli`.
"""

import sys as _sys


def _as_command() -> bool:
    """This package is being imported on the way to the command line: `python -m toolkit` (its package import runs
    while `sys.argv[0]` is still "-m"; the original command line says which module) or the `toolkit` script. Not
    `python -m toolkit.measure.worker` and the like, whose Ctrl-C handling is their own."""
    first = _sys.argv[0] if _sys.argv else ""
    if first == "-m":
        cmd = list(getattr(_sys, "orig_argv", ()))
        pairs = zip(cmd, cmd[1:] + [""])
        return any((a == "-m" and b in ("toolkit", "toolkit.__main__")) or a == "-mtoolkit" for a, b in pairs)
    return first.rsplit("/", 1)[-1] == "toolkit"


if _as_command():
    from . import _interrupt

    _interrupt.stop_at_once_while_importing()  # until `cli.main` starts

# ruff: noqa: E402 - the Ctrl-C handler above goes in before the imports below, which take seconds (torch)
from . import bugs, compat
from ._config import ConfigError
from .analysis import catalogue, classify, matrix, sweep
from .bugs import repro
from .measure import (
    LAYER_SHAPES,
    PRESETS,
    DistributedReport,
    Estimate,
    Report,
    Scenario,
    estimate,
    measure,
    preset,
    presets,
    report,
    run,
    run_distributed,
)
from .models import Batch, ModelConfig, build_model, loss_fn, make_batch
from .notebook.setup import setup_notebook
from .stacks.torchtitan import TorchtitanConfig
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

__version__ = "0.2.0"

# The notebook front end (ipywidgets, plotly) is imported when it is first used, not by `import toolkit`.
_LAZY = {"display": "toolkit.notebook.display", "widgets": "toolkit.notebook.widgets"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")


__all__ = [
    "compat",
    "ConfigError",
    "ACConfig",
    "PolicyDecision",
    "SelectiveOpPolicy",
    "apply_ac",
    "default_save_ops",
    "record_policy_decisions",
    "remove_ac",
    "CompileConfig",
    "apply_compile",
    "remove_compile",
    "Batch",
    "ModelConfig",
    "build_model",
    "loss_fn",
    "make_batch",
    "train_step",
    "canonical_name",
    "get_module",
    "named_modules",
    "unwrap",
    "naming",
    "RECIPES",
    "apply_recipe",
    "prepare",
    "reset",
    "applied",
    "global_state",
    "torch_settings",
    "Report",
    "Scenario",
    "measure",
    "run",
    "PRESETS",
    "preset",
    "presets",
    "report",
    "setup_notebook",
    "display",
    "catalogue",
    "classify",
    "matrix",
    "sweep",
    "widgets",
    "bugs",
    "repro",
    "estimate",
    "Estimate",
    "LAYER_SHAPES",
    "run_distributed",
    "DistributedReport",
    "TorchtitanConfig",
    "__version__",
]
