"""The optional packages the toolkit can use, what each turns on, and the one `pip install` that brings it.

Everything that degrades without one of them — a CLI command, a notebook, a test skip, a config error — takes its
one-line reason from here, so the install advice is written once. A training stack's own package (torchtitan,
transformers) is declared by its line in the stacks' registry (`toolkit.stacks.extra_of`); `toolkit.stacks.extras()`
and `reason()` cover both.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class Extra:
    module: str
    """The import name."""
    install: str
    """The command that brings it, from a checkout of the toolkit."""
    enables: str
    """What it turns on."""
    api: tuple[str, ...] = ()
    """The names the toolkit calls on the module: installed without them, it is not usable (`compat` detects)."""


EXTRAS: dict[str, Extra] = {
    e.module: e
    for e in (
        Extra(
            "torch_remat",
            'pip install -e ".[dev]"  (or: pip install torch-remat)',
            "torchtitan main's activation checkpointing: ACConfig.of(mode='remat'), the torchtitan_main recipe, "
            "C30-C33, C45, C46",
            api=(
                "checkpoint",
                "region",
                "recompute_needs_tensor",
                "is_recomputing",
                "current_saved_tensor_info",
                "RecomputeStateHook",
            ),
        ),
        Extra("submitit", 'pip install -e ".[cluster]"', "sweeps on Slurm (--executor submitit)"),
        Extra("ray", 'pip install -e ".[cluster]"', "sweeps on Ray (--executor ray)"),
        Extra("tlparse", 'pip install -e ".[trace]"', "rendering a bug bundle's TORCH_TRACE"),
        Extra("ipywidgets", 'pip install -e ".[notebook]"', "the Explorer (tk.explore) and the notebooks' widgets"),
        Extra("plotly", 'pip install -e ".[notebook]"', "the figures of toolkit.notebook.display and the Explorer"),
    )
}


def available(module: str) -> bool:
    """`module` is installed: found on the path, not imported (cheap: test skips and notebooks ask before running).
    Whether an installed torch_remat is usable, its `api` complete, is `compat.available("torch_remat")`."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a module in sys.modules without a spec
        return False


def version(module: str) -> str | None:
    """The installed distribution's version of `module` (read from its metadata, not imported), or None."""
    if not available(module):
        return None
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    try:
        return pkg_version(module)
    except PackageNotFoundError:
        return None


def reason(module: str, extras: dict[str, Extra] | None = None) -> str:
    """One line: `module` is missing, what that turns off, and how to install it. `extras` defaults to `EXTRAS`;
    a stack's own package (torchtitan, transformers) is declared by its stack: `toolkit.stacks.reason`."""
    e = (EXTRAS if extras is None else extras)[module]
    return f"needs {module} (not installed; it brings {e.enables}): {e.install}"


def missing(modules: tuple[str, ...] | list[str], extras: dict[str, Extra] | None = None) -> str | None:
    """The reason for the first of `modules` that is not installed, or None when all are."""
    for m in modules:
        if not available(m):
            return reason(m, extras)
    return None


__all__ = ["EXTRAS", "Extra", "available", "version", "reason", "missing"]
