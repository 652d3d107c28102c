"""A case in a bug notebook: its header, and a version-aware verdict of a run against its catalogue signature
(`confirm`: reproduced, a broken repro, or a finding for a torch the catalogue has no verdict for)."""

from __future__ import annotations

import dataclasses
import json
import platform
import re
from dataclasses import dataclass, field
from typing import Any

import torch

from ..analysis import catalogue, findings
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
        findings.record(finding)
    return finding


def expected(case_id: str) -> str:
    """What the catalogue records for this case on the running torch release: "reproduced", "fixed",
    "not reproduced" or "unknown". Notebooks assert a release-dependent result against it instead of printing the
    release's literal outcome (`assert finding.reproduced == (tk.bugs.expected("C26") == "reproduced")`)."""
    return catalogue.get(case_id).verified.get(torch_release(), "unknown")
