"""The standalone, torch-only repro scripts (`toolkit/bugs/standalone/`): found by case, run and confirmed on this
torch, shown, and exported for an upstream issue."""

from __future__ import annotations

import functools
import importlib
import inspect
import pathlib
import pkgutil
from dataclasses import dataclass
from types import ModuleType

from .. import _files
from .verdicts import Finding, confirm

_PACKAGE = "toolkit.bugs.standalone"


@dataclass(frozen=True)
class Skipped:
    """A case's repro did not run here, and why (no GPU; an optional package missing, with its install line)."""

    case: str
    reason: str

    def __str__(self) -> str:
        return f"{self.case} skipped: {self.reason}"


@functools.cache
def _index() -> dict[str, str]:
    """Case id → standalone module name, read from each script's `CASE` / `CASES` constants without importing it
    (a script for one case may import an optional package that another case does not need). Read once: the scripts
    are the package's own files (the central list's page asks for every case)."""
    import ast

    pkg = importlib.import_module(_PACKAGE)
    out: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        path = pathlib.Path(pkg.__path__[0]) / f"{info.name}.py"
        for node in ast.parse(_files.read_capped(path, "bugs", "script", name=path.name)).body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("CASE", "CASES") for t in node.targets
            ):
                value = ast.literal_eval(node.value)
                for cid in [value] if isinstance(value, str) else list(value):
                    out.setdefault(cid, info.name)
    return out


def has_script(case_id: str) -> bool:
    """Does the case have a standalone repro (by its file's `CASE`, or a script's `CASES`)?"""
    return case_id in _index()


def script_name(case_id: str) -> str:
    """The standalone repro's module name for a case (`c65_eager_backend_checkpoint_redraws_dropout`)."""
    return _index()[case_id]


def script(case_id: str) -> ModuleType:
    """The standalone repro module for a case: `cNN_*.py`, or the one listing the case in its `CASES` (torch only).
    A missing optional package it imports raises ModuleNotFoundError (`check` turns that into a `Skipped`)."""
    index = _index()
    if case_id not in index:
        raise KeyError(f"no standalone repro for {case_id}; have: {', '.join(sorted(set(index.values())))}")
    return importlib.import_module(f"{_PACKAGE}.{index[case_id]}")


def check(case_id: str, *, record: bool = True) -> Finding | Skipped:
    """Run a case's standalone repro on this torch and `confirm` it; a `Skipped` naming why when it cannot run here
    (no GPU, or an optional package it imports is missing — with the install line)."""
    from ..stacks import extras, reason

    try:
        mod = script(case_id)
    except ModuleNotFoundError as e:
        if e.name not in extras():
            raise
        return Skipped(case_id, f"its repro {reason(e.name)}")
    observed = getattr(mod, getattr(mod, "CASES", {}).get(case_id, "bug"))()
    if "skipped" in observed:
        return Skipped(case_id, str(observed["skipped"]))
    return confirm(case_id, observed, record=record)


def show(case_id: str, *names: str) -> None:
    """Print the source of a repro's functions (default: `bug` and `fix`) — the code a notebook runs."""
    mod = script(case_id)
    for name in names or ("bug", "fix"):
        print(inspect.getsource(getattr(mod, name)))


def export(case_id: str, directory: str | pathlib.Path, *, overwrite: bool = False) -> pathlib.Path:
    """Copy a case's standalone repro script into `directory`; it runs with `python FILE` and imports only torch.
    A script already there (perhaps edited since) is not replaced unless `overwrite=True`, as `repro.export`
    refuses; both refusals come before anything is written."""
    from .._config import ConfigError, check_bool

    check_bool("bugs.export", "overwrite", overwrite)
    src = pathlib.Path(inspect.getfile(script(case_id)))
    out = _files.check_folder("bugs.export", "directory", directory, "'repros'")
    if out.exists() and not out.is_dir():
        raise ConfigError(
            "bugs.export", "directory", f"{str(out)!r} is a file, not a folder.", "pass a folder (created if missing)."
        )
    target = out / src.name
    if target.exists() and not overwrite:
        raise ConfigError(
            "bugs.export",
            "directory",
            f"{str(target)!r} exists (perhaps edited since it was exported).",
            "pass overwrite=True to replace it, or another folder.",
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(
            "bugs.export", "directory", f"cannot make {str(out)!r} ({e.strerror or e}).", "pass another folder."
        ) from None
    _files.write_text(target, _files.read_capped(src, "bugs.export", "case", name=src.name))
    return target
