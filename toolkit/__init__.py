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


_COMMAND = _as_command()
if _COMMAND:
    from . import _interrupt

    _interrupt.stop_at_once_while_importing()  # until `cli.main` starts

__version__ = "0.2.0"  # read by pyproject.toml (setuptools reads it without importing the package)

# The notebook front end (ipywidgets, plotly) is imported when it is first used, not by `import toolkit`.
_LAZY = {"display": "toolkit.notebook.display", "widgets": "toolkit.notebook.widgets"}

# Imported now, except on the way to the command line: its commands import what each needs (`matrix` re-run on a
# folder it left with nothing to run answers without torch); a name asked for there is imported then.
if not _COMMAND:
    from ._api import *  # noqa: E402, F403 - the names are listed once, in _api.__all__
    from ._api import __all__ as _public  # noqa: E402

    __all__ = [*_public, *_LAZY, "__version__"]


def __getattr__(name: str):
    import importlib
    import importlib.util

    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        globals()[name] = module
        return module
    if name.startswith("__") and name != "__all__":
        raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule (`from .. import compat` within)
    api = importlib.import_module("toolkit._api")  # on the way to the command line, a name asked for after all
    if name in api.__all__:
        globals()[name] = value = getattr(api, name)
        return value
    if name == "__all__":
        return [*api.__all__, *_LAZY, "__version__"]
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
