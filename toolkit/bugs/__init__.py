"""Bug-notebook support: a case's header, a version-aware verdict against its signature, standalone repros.

Bug-notebook support: a case's header, a version-aware verdict checked against its catalogue signature, standalone
repros.

A bug notebook prints `header(case)`, reproduces the case (a `Scenario` run, or a standalone torch-only script from
`toolkit.bugs.standalone`), and calls `confirm(case, report_or_observations)`. `confirm` checks the catalogue signature:
- it matches → the case is reproduced on this torch;
- it does not, and the catalogue says this torch version reproduces it → AssertionError (the repro broke);
- it does not, on a torch the catalogue has no verdict for → "not reproduced on torch X", recorded as a finding
  (`catalogue.findings()`), so a newer torch that fixed the bug turns the notebook into a record, not a failure.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import pathlib
import pkgutil
import platform
import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch

from .. import _files
from ..analysis import catalogue
from ..analysis.catalogue import torch_release
from ..analysis.classification import classify
from ..instrument.records import short_paths
from ..measurement.report import Report


@dataclass(frozen=True)
class Finding:
    """What one run of a case's repro showed on one torch version (plain data; JSON round-trip)."""

    case: str
    """Catalogue id, e.g. "C8"."""
    torch: str
    """`torch.__version__` of the run."""
    reproduced: bool
    """Did the run show the case's catalogue signature?"""
    observed: dict[str, Any] = field(default_factory=dict)
    """The facts the signature was checked against (numbers, error first lines)."""
    catalogued: str = "unknown"
    """What the catalogue's `verified` table says for this torch release: reproduced / fixed / unknown."""

    def __str__(self) -> str:
        verdict = "reproduced" if self.reproduced else "not reproduced"
        lines = [f"{self.case} {verdict} on torch {self.torch}"]
        for k, v in self.observed.items():
            lines.append(f"  {k}: {_fmt(v)}")
        if not self.reproduced:
            lines.append(f"  catalogue for {torch_release(self.torch)}: {self.catalogued}; recorded as a finding")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Finding":
        return cls(**data)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def header(case_id: str) -> None:
    """Print a case's title, symptom, mechanism, status, upstream links and this run's environment."""
    c = catalogue.get(case_id)
    refs = ", ".join(f"{u} <{link}>" for u, link in zip(c.upstream, c.links)) if c.links else ", ".join(c.upstream)
    verified = ", ".join(f"{v} on {k}" for k, v in c.verified.items()) or "no verdict recorded"
    where = f"CUDA ({torch.cuda.get_device_name(0)})" if torch.cuda.is_available() else "CPU only"
    print(f"{c.id} · {c.title}")
    print(f"symptom:   {c.symptom}")
    print(f"mechanism: {c.mechanism}")
    print(f"status:    {c.status}")
    print(f"upstream:  {refs or 'none filed'}")
    print(f"catalogue: {verified}")
    print(f"this run:  torch {torch.__version__} · python {'.'.join(platform.python_version_tuple()[:2])} · {where}")


def observe(report: Report, classification: str | None = None) -> dict[str, Any]:
    """The facts of a Report that signatures look at, as plain data (`classification`: its label, if already known)."""
    if classification is None:
        classification = classify(report).label
    c = report.compile
    out: dict[str, Any] = {"outcome": report.outcome, "classification": classification}
    if report.error is not None:
        out["error"] = error_line(report.error.type, report.error.message)
    if c.requested:
        out.update(
            graphs=c.graphs,
            graph_breaks=c.graph_breaks,
            recompiles=len(c.recompiles),
            fell_back_to_eager=c.fell_back_to_eager,
        )
    if report.ok:
        out["saved_bytes"] = report.saved.total_bytes
        if report.numerics.compared:
            out["grads_match"] = report.numerics.grads_match
    return out


def error_line(type_name: str, message: str) -> str:
    """`Type: first line of the message`, without paths or addresses (stable across machines)."""
    first = next((ln.strip() for ln in str(message).splitlines() if ln.strip()), "")
    first = re.sub(r"0x[0-9a-fA-F]+", "0x…", short_paths(first))
    return f"{type_name.rsplit('.', 1)[-1]}: {first[:200]}"


def confirm(
    case_id: str, result: Report | dict[str, Any], *, refs: dict[str, Report] | None = None, record: bool = True
) -> Finding:
    """Check `result` against the case's catalogue signature; raise if the catalogue says this torch reproduces it
    and the run did not; otherwise return the Finding (recorded when the verdict is new for this torch)."""
    c = catalogue.get(case_id)
    if c.signature is None:
        raise ValueError(f"{case_id} has no signature in catalogue.json; add one before confirming it.")
    if isinstance(result, Report):
        cls = classify(result, refs)
        reproduced = case_id in cls.cases
        observed = observe(result, cls.label)
    else:
        observed = dict(result)
        reproduced = c.matches_observed(observed)
    release = torch_release()
    catalogued = expected(case_id)
    finding = Finding(
        case=case_id, torch=torch.__version__, reproduced=reproduced, observed=observed, catalogued=catalogued
    )
    if not reproduced and catalogued == "reproduced":
        raise AssertionError(
            f"{case_id} is catalogued as reproducing on torch {release}, but this run did not show "
            f"its signature {json.dumps(c.signature)}.\n{finding}"
        )
    if record and catalogued not in (("reproduced",) if reproduced else ("fixed", "not reproduced")):
        catalogue.record(finding)
    return finding


def expected(case_id: str) -> str:
    """What the catalogue records for this case on the running torch release: "reproduced", "fixed",
    "not reproduced" or "unknown". Notebooks assert a release-dependent result against it instead of printing the
    release's literal outcome (`assert finding.reproduced == (tk.bugs.expected("C26") == "reproduced")`)."""
    return catalogue.get(case_id).verified.get(torch_release(), "unknown")


# --- standalone, torch-only repro scripts --------------------------------------------------------------------

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
