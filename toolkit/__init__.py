"""toolkit: see how activation checkpointing, torch.compile and Mixture-of-Experts compose on a real PyTorch model.

Layers, each importing only the ones before it: `compat` (every private torch API) → `models` (torch only) →
`transforms` (naming, AC and SAC policies, compile, recipes, settings) → `instrument` (probes, step, records) →
`stacks` → `measurement` (scenario, report) → `estimation` → `execution` (run, measure, isolate, ranks) →
`analysis` (classify, catalogue, matrix, sweep) → `bugs` (bug notebooks, repro bundles) and `notebook` (display,
widgets, setup) → `cli`.

Importing the package does nothing but define it: no torch, no signal handler, no setting. The public API
(`toolkit._api.__all__`) is imported on first use of any of its names (torch and the toolkit: seconds); the command
line's own handling (Ctrl-C) is set by its entry point, `toolkit.__main__`.
"""

__version__ = "0.2.0"  # read by pyproject.toml (setuptools reads it without importing the package)

# The public API: names from `toolkit._api`, the subpackages a user reaches through `tk.` (`compat`, `bugs`,
# `analysis`), and the notebook front end (ipywidgets, plotly), imported apart from the rest when first used.
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
    "catalogue",
    "classify",
    "matrix",
    "sweep",
    "bugs",
    "repro",
    "estimate",
    "Estimate",
    "LAYER_SHAPES",
    "plan",
    "run_distributed",
    "DistributedReport",
    "TorchtitanConfig",
    "TransformersConfig",
    "analysis",
    "display",
    "widgets",
    "explore",
    "__version__",
]
# The notebook front end's names: a module, or `module:attribute`.
_LAZY = {
    "display": "toolkit.notebook.display",
    "widgets": "toolkit.notebook.widgets",
    "explore": "toolkit.notebook.widgets:explore",
}


def __getattr__(name: str):
    # Only the public names resolve here: any other (`from . import cli` inside the package asks this first) is left
    # to the import system at once, so that no import of a submodule imports the whole API.
    if name not in __all__:
        raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
    import importlib
    import importlib.util

    if name in _LAZY:
        module, _, attribute = _LAZY[name].partition(":")
        value = importlib.import_module(module)
        value = getattr(value, attribute) if attribute else value
    elif importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f"{__name__}.{name}")  # a public subpackage: `tk.compat`, `tk.bugs`
    else:
        value = getattr(importlib.import_module("toolkit._api"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
