"""The known AC × compile × MoE composability cases (C1–C26), loaded from `catalogue.json`, with signature matching."""

from __future__ import annotations

import functools
import json
import pathlib
from dataclasses import dataclass
from typing import Any

_PATH = pathlib.Path(__file__).with_name("catalogue.json")


@dataclass(frozen=True)
class Case:
    id: str
    title: str
    configuration: str
    symptom: str
    mechanism: str
    status: str
    upstream: tuple[str, ...]
    links: tuple[str, ...]
    cpu: str
    torch_versions: str
    notebook: str | None
    signature: dict[str, Any] | None

    def matches(self, classification: str, report) -> bool:
        """Does a classified report show this case's signature?"""
        sig = self.signature
        if not sig:
            return False
        if "classification" in sig and sig["classification"] != classification:
            return False
        scen = report.scenario or {}
        if "recipe" in sig and scen.get("recipe") != sig["recipe"]:
            return False
        if "ac_modes" in sig:
            mode = (scen.get("ac") or {}).get("mode", "none")
            if scen.get("recipe"):
                mode = "recipe"
            if mode not in sig["ac_modes"]:
                return False
        if "order" in sig and sig["order"] not in set(report.compile.orders.values()):
            return False
        if "error_contains" in sig:
            text = f"{report.error.type} {report.error.message}" if report.error else ""
            if not any(s in text for s in sig["error_contains"]):
                return False
        if "break_reason_contains" in sig:
            reasons = " ".join(b.reason for b in report.compile.breaks)
            if not any(s in reasons for s in sig["break_reason_contains"]):
                return False
        if "recompute_op_contains" in sig:
            ops = " ".join(report.recompute.by_op)
            if not any(s in ops for s in sig["recompute_op_contains"]):
                return False
        return True


@functools.lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    """Every catalogued case, in id order."""
    data = json.loads(_PATH.read_text())
    out = []
    for c in data["cases"]:
        out.append(Case(id=c["id"], title=c["title"], configuration=c["configuration"], symptom=c["symptom"],
                        mechanism=c["mechanism"], status=c["status"], upstream=tuple(c.get("upstream") or ()),
                        links=tuple(c.get("links") or ()), cpu=c["cpu"], torch_versions=c.get("torch_versions", ""),
                        notebook=c.get("notebook"), signature=c.get("signature")))
    return tuple(sorted(out, key=lambda c: int(c.id[1:])))


def get(case_id: str) -> Case:
    for c in cases():
        if c.id == case_id:
            return c
    raise KeyError(f"no case {case_id!r}; known: {', '.join(c.id for c in cases())}")


def filter(*, cpu: str | None = None, text: str | None = None, notebook: bool | None = None) -> list[Case]:
    """Cases by CPU reproducibility ("reproduced", "plausible", "gpu_only"), a search text, or having a notebook."""
    out = []
    for c in cases():
        if cpu is not None and c.cpu != cpu:
            continue
        if text is not None and text.lower() not in " ".join([c.title, c.configuration, c.symptom, c.mechanism]).lower():
            continue
        if notebook is not None and bool(c.notebook) != notebook:
            continue
        out.append(c)
    return out


def match(classification: str, report) -> list[Case]:
    """The catalogued cases whose signature this classified report shows."""
    return [c for c in cases() if c.matches(classification, report)]


def markdown(selection: list[Case] | None = None) -> str:
    """The catalogue as a markdown table."""
    rows = ["| id | case | status | upstream | CPU |", "| --- | --- | --- | --- | --- |"]
    for c in selection if selection is not None else cases():
        refs = ", ".join(f"[{u}]({l})" for u, l in zip(c.upstream, c.links)) if c.links else ", ".join(c.upstream)
        rows.append(f"| {c.id} | {c.title} | {c.status} | {refs} | {c.cpu} |")
    return "\n".join(rows)
