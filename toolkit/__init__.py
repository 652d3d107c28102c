"""toolkit: see how activation checkpointing, torch.compile and Mixture-of-Experts compose on a real PyTorch model.

Layers, each importing only the ones before it: `compat` (every private torch API) → `models` (torch only) →
`transforms` (naming, AC and SAC policies, compile, recipes, settings) → `instrument` (probes, step, records) →
`stacks` → `measurement` (scenario, report) → `estimation` → `execution` (run, measure, isolate, ranks) →
`analysis` (classify, catalogue, matrix, sweep) → `bugs` (bug notebooks, repro bundles) and `notebook` (display,
widgets, setup) → `cli`.

Importing the package does nothing but define it: no torch, no signal handler, no setting. The public face
(`__all__`, from `toolkit._api`) is imported on first use of any of its names (torch and the toolkit: seconds); the
command line's own handling (Ctrl-C) is set by its entry point, `toolkit.__main__`.
"""

__version__ = "0.2.0"  # read by pyproject.toml (setuptools reads it without importing the package)

# The public face: the names a user calls, and nothing else (no subpackage, nothing private). Each comes from
# `toolkit._api`, or from the notebook front end (ipywidgets, plotly), imported apart from the rest when first used.
# Everything else is reached through its layer, as in any package: `tk.transforms.prepare`, `tk.bugs.confirm`,
# `tk.notebook.display`, `tk.estimation.LAYER_SHAPES` (a subpackage is imported on first use of its name).
__all__ = [
    "__version__",
    "ConfigError",
    # the model and its batch
    "ModelConfig",
    "build_model",
    "make_batch",
    # the transforms, on any model
    "ACConfig",
    "CompileConfig",
    "apply_ac",
    "apply_compile",
    "train_step",
    # a stack's model in place of the toolkit's
    "TorchtitanConfig",
    "TransformersConfig",
    # one step, measured
    "Scenario",
    "Report",
    "run",
    "measure",
    "run_distributed",
    # across steps: the case behind a Report, a sweep, will it fit, a bug to file
    "classify",
    "sweep",
    "estimate",
    "plan",
    "repro",
    # in a notebook
    "setup_notebook",
    "explore",
]


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name == "explore":
        # The Explorer needs the notebook stack (ipywidgets, plotly): imported apart, never with the rest of the face.
        value = importlib.import_module("toolkit.notebook").widgets.explore
    elif name in __all__:
        value = getattr(importlib.import_module("toolkit._api"), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        # A layer, reached as in any package (`tk.transforms`): that subpackage alone, never the whole API.
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module 'toolkit' has no attribute {name!r}{_moved(name)}")
    globals()[name] = value
    return value


# The layers whose `__all__` a name left out of the public face may be found in (each imports torch: only on an error).
_LAYERS = ("transforms", "models", "measurement", "estimation", "execution", "analysis", "notebook")


def _moved(name: str) -> str:
    # A name the public face once had (0.2 had 58) says where it lives now, so that old code gets its fix.
    if name.startswith("_"):
        return ""
    import importlib

    for layer in _LAYERS:
        if name in getattr(importlib.import_module(f"{__name__}.{layer}"), "__all__", ()):
            return f"; it is toolkit.{layer}.{name} (the public face is toolkit.__all__)"
    return ""


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
