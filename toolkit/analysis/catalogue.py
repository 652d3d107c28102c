"""The known AC × compile × MoE composability cases, loaded from `catalogue.json`, with signature matching."""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import re
from dataclasses import dataclass
from typing import Any

from .. import _escape
from .._config import ConfigError

_PATH = pathlib.Path(__file__).with_name("catalogue.json")


# `cpu` status → what a repro needs ("reproduced" and "plausible" need no more than one CPU process).
NEEDS = {"gpu_only": "gpu", "multi_rank": "multi-rank"}
CPU_STATUSES = ("reproduced", "plausible", "gpu_only", "multi_rank")
THEMES = (
    "AC × compile",
    "SAC × compile",
    "MoE × compile",
    "AC × MoE routing",
    "randomness",
    "memory budget",
    "remat",
    "offload",
    "FSDP and parallelism",
    "stacks",
)
"""What a case is about, in the order the central list's page groups them (each case has one)."""

_REPORT_KEYS = {
    "classification",
    "recipe",
    "stacks",
    "ac_modes",
    "backends",
    "grads_finite",
    "order",
    "error_contains",
    "break_reason_contains",
    "recompute_op_contains",
    "warning_contains",
    "fsdp",
    "max_graph_breaks",
    "recompile_reason_contains",
    "redrawn_contains",
    "redrawn_none",
    "packages",
    "eager_checkpoints",
    "memory_budget",
    "saved_kinds",
    "aot_autograd",
    "fsdp_inside",
}


def _shows(text: str, patterns) -> bool:
    """Does `text` contain one of `patterns`? A pattern starting with "re:" is a regular expression, for a bug whose
    wording changes between torch releases (C14: "Expected inputs of BF16 type" in 2.13, "Expected mat_a to be
    BFloat16 …" in 2.14): match what the bug is, not how one release phrases it."""
    return any(re.search(p[3:], text) if p.startswith("re:") else p in text for p in patterns)


@dataclass(frozen=True)
class Case:
    id: str
    title: str
    theme: str
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
    workaround: str = ""
    """What a user does today to avoid it (a setting, an order, a fix to take), one sentence; "" when there is none."""
    verified: dict[str, str] = None  # type: ignore[assignment]
    """torch release → "reproduced" / "fixed" / "not reproduced" (a release before the behaviour began, C42), as checked
    by this case's notebook or standalone script (`toolkit.bugs.confirm`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "verified", dict(self.verified or {}))

    @property
    def needs(self) -> str:
        """What a repro needs: "gpu", "multi-rank" (several processes), or "cpu" (one CPU process is enough)."""
        return NEEDS.get(self.cpu, "cpu")

    def matches_observed(self, observed: dict[str, Any]) -> bool:
        """Does a standalone repro's observation dict show this case's signature?

        `observed` in the signature: keys whose values must be equal; `observed_contains`: keys whose text must
        contain one of the listed strings ("re:…" for a regular expression). A signature with neither never
        matches an observation dict."""
        sig = self.signature or {}
        want, contains = sig.get("observed"), sig.get("observed_contains")
        if not want and not contains:
            return False
        for key, value in (want or {}).items():
            if key not in observed or observed[key] != value:
                return False
        for key, texts in (contains or {}).items():
            if not _shows(str(observed.get(key, "")), texts):
                return False
        return True

    def matches(self, classification: str, report) -> bool:
        """Does a classified report show this case's signature?

        `any_of`: alternative sets of report keys, each laid over the rest of the signature — for a case that shows
        in two ways (C6: an error when the policy saves what it sees, a silent full recompute when it names the
        model's ops)."""
        sig = self.signature
        if not sig:
            return False
        base = {k: v for k, v in sig.items() if k != "any_of"}
        return any(_report_shows({**base, **alt}, classification, report) for alt in sig.get("any_of") or [{}])


def _report_shows(sig: dict[str, Any], classification: str, report) -> bool:
    """One set of report keys against a classified report."""
    if not set(sig) & _REPORT_KEYS:
        return False  # only observations (`matches_observed`) can show this one
    if "classification" in sig and sig["classification"] != classification:
        return False
    scen = report.scenario
    if "recipe" in sig and scen.recipe != sig["recipe"]:
        return False
    if "stacks" in sig and scen.stack not in sig["stacks"]:
        return False
    # Observations: what the step showed, the same whoever built the model.
    if "packages" in sig and not set(sig["packages"]) & set(report.packages):
        return False
    if "eager_checkpoints" in sig and bool(report.compile.eager_checkpoints) != sig["eager_checkpoints"]:
        return False
    if "memory_budget" in sig and (report.compile.memory_budget is not None) != sig["memory_budget"]:
        return False
    if "saved_kinds" in sig and not any(report.saved.by_kind.get(kind) for kind in sig["saved_kinds"]):
        return False
    if "aot_autograd" in sig and report.compile.aot_autograd != sig["aot_autograd"]:
        return False  # None (nothing compiled in the step) matches neither
    if "ac_modes" in sig and not _ac_mode_shows(sig["ac_modes"], report):
        return False
    if "backends" in sig and scen.backend not in sig["backends"]:
        return False
    if "grads_finite" in sig:  # a NaN / inf gradient (C64) is not a numerical difference (C11)
        d = report.numerics.max_grad_diff
        if (d is not None and math.isfinite(d)) != sig["grads_finite"]:
            return False
    if "fsdp" in sig and scen.fsdp not in sig["fsdp"]:
        return False
    if "fsdp_inside" in sig:  # FSDP2 units inside a compiled region / a checkpointed module, read off the model
        t = report.transforms
        inside = {"compiled": t.fsdp_in_compiled, "checkpoint": t.fsdp_in_checkpoint}
        if not any(inside[where] for where in sig["fsdp_inside"]):
            return False
    if "max_graph_breaks" in sig and report.compile.graph_breaks > sig["max_graph_breaks"]:
        return False
    if "recompile_reason_contains" in sig and not _shows(
        " ".join(report.compile.recompiles), sig["recompile_reason_contains"]
    ):
        return False
    if "order" in sig and sig["order"] not in set(report.compile.orders.values()):
        return False
    if "error_contains" in sig:
        text = f"{report.error.type} {report.error.message}" if report.error else ""
        if not _shows(text, sig["error_contains"]):
            return False
    if "break_reason_contains" in sig:
        reasons = " ".join(b.reason for b in report.compile.breaks)
        if not _shows(reasons, sig["break_reason_contains"]):
            return False
    if "recompute_op_contains" in sig:
        ops = " ".join(report.recompute.by_op)
        if not _shows(ops, sig["recompute_op_contains"]):
            return False
    if "warning_contains" in sig and not _shows(" ".join(report.warnings), sig["warning_contains"]):
        return False
    redrawn = report.recompute.redrawn  # one entry per random op a recompute drew again: matched entry by entry
    if "redrawn_contains" in sig and not any(_shows(r, sig["redrawn_contains"]) for r in redrawn):
        return False
    if "redrawn_none" in sig and bool(redrawn) == sig["redrawn_none"]:
        return False
    return True


def _ac_mode_shows(modes, report) -> bool:
    """The AC mode a signature names: the one configured where the toolkit configured it, else (a model measured as
    it came, `ac_mode` "unknown") what the step showed: checkpoints with a selective policy match the selective modes,
    checkpoints without one the others."""
    mode = report.scenario.ac_mode
    if mode != "unknown":
        return mode in modes
    from ..transforms.ac import MODES

    t = report.transforms
    if t.selective:
        return any(MODES[m].SELECTIVE for m in modes if m in MODES)
    # torch's plain checkpoint (remat's regions and a memory budget are not seen as checkpoints here)
    return bool(t.under_checkpoint) and bool(set(modes) & {"full", "reentrant", "selective_layer"})


@functools.lru_cache(maxsize=1)
def cases() -> tuple[Case, ...]:
    """Every catalogued case, in id order."""
    from .. import _files

    data = _files.loads(
        _files.read_capped(_PATH, "catalogue.json", "", 16 << 20, name="the catalogue"),
        "catalogue.json",
        "",
        name="the catalogue",
    )
    out = []
    for c in data["cases"]:
        if c.get("theme") not in THEMES:
            raise ConfigError(
                "catalogue.json", f"{c['id']}.theme", f"{c.get('theme')!r} is not a theme.", f"use one of {THEMES}."
            )
        for alt in (c.get("signature") or {}).get("any_of") or ():
            if unknown := set(alt) - _REPORT_KEYS:
                raise ConfigError(
                    "catalogue.json",
                    f"{c['id']}.signature.any_of",
                    f"an alternative names {sorted(unknown)}, which no report carries.",
                    f"use only report keys: {', '.join(sorted(_REPORT_KEYS))}.",
                )
        out.append(
            Case(
                id=c["id"],
                title=c["title"],
                theme=c["theme"],
                configuration=c["configuration"],
                symptom=c["symptom"],
                mechanism=c["mechanism"],
                status=c["status"],
                upstream=tuple(c.get("upstream") or ()),
                links=tuple(c.get("links") or ()),
                cpu=c["cpu"],
                torch_versions=c.get("torch_versions", ""),
                notebook=c.get("notebook"),
                signature=c.get("signature"),
                workaround=c.get("workaround", ""),
                verified=c.get("verified"),
            )
        )
    return tuple(sorted(out, key=lambda c: int(c.id[1:])))


def get(case_id: str) -> Case:
    for c in cases():
        if c.id == case_id:
            return c
    raise KeyError(f"no case {case_id!r}; known: {', '.join(c.id for c in cases())}")


def filter(
    *, cpu: str | None = None, text: str | None = None, notebook: bool | None = None, needs: str | None = None
) -> list[Case]:
    """Cases by CPU reproducibility (one of `CPU_STATUSES`), a search text, having a notebook, or what a repro needs
    ("cpu", "gpu", "multi-rank"). A value none of them can have is refused, naming the argument (it matched no case,
    silently)."""
    from .._config import check_bool, check_choice, check_text

    if cpu is not None:
        check_choice("catalogue.filter", "cpu", cpu, CPU_STATUSES)
    if needs is not None:
        check_choice("catalogue.filter", "needs", needs, ("cpu", *NEEDS.values()))
    if text is not None:
        check_text("catalogue.filter", "text", text)
    if notebook is not None:
        check_bool("catalogue.filter", "notebook", notebook)
    out = []
    for c in cases():
        if cpu is not None and c.cpu != cpu:
            continue
        if needs is not None and c.needs != needs:
            continue
        if (
            text is not None
            and text.lower() not in " ".join([c.title, c.configuration, c.symptom, c.mechanism]).lower()
        ):
            continue
        if notebook is not None and bool(c.notebook) != notebook:
            continue
        out.append(c)
    return out


def match(classification: str, report) -> list[Case]:
    """The catalogued cases whose signature this classified report shows."""
    return [c for c in cases() if c.matches(classification, report)]


def torch_release(version: str | None = None) -> str:
    """`2.13.0+cpu` → `2.13.0`: the key of the `verified` table and of recorded findings."""
    if version is None:
        import torch

        version = torch.__version__
    return version.split("+")[0]


def findings_path() -> pathlib.Path:
    """Where `record` appends findings: `$TOOLKIT_FINDINGS`, else `~/.cache/toolkit/findings.jsonl`; a folder there
    is refused (ConfigError), before anything is read or written."""
    path = pathlib.Path(
        os.environ.get("TOOLKIT_FINDINGS") or pathlib.Path.home() / ".cache" / "toolkit" / "findings.jsonl"
    )
    if path.is_dir():
        raise ConfigError(
            "TOOLKIT_FINDINGS",
            "",
            f"{str(path)!r} is a folder, not a findings file.",
            f"point TOOLKIT_FINDINGS at a file, e.g. {str(path / 'findings.jsonl')!r}, or unset it.",
        )
    return path


def record(finding) -> None:
    """Append a `toolkit.bugs.Finding` whose verdict is new for its torch version (one JSON line)."""
    from .. import _files

    path = findings_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _files.append_line(path, json.dumps(finding.to_json(), sort_keys=True))  # synced; a torn tail is skipped
    except OSError as e:
        raise ConfigError(
            "TOOLKIT_FINDINGS", "", f"cannot write {str(path)!r} ({e.strerror or e}).", "point it at a writable file."
        ) from None


def findings(case_id: str | None = None) -> dict[str, dict[str, str]]:
    """Recorded verdicts: case id → {torch release: "reproduced" / "not reproduced"}; the latest run wins. A torn last
    line (an interrupted append) is skipped; any other line that is not a finding (not UTF-8, not JSON, or without
    its case, torch and verdict) is refused, naming the file and line."""
    from .. import _files

    out: dict[str, dict[str, str]] = {}
    path = findings_path()
    if not path.exists():
        return out
    # A regular file, read up to 64 MiB (a finding is a line of ~100 bytes): a FIFO or /dev/zero is refused, not read.
    lines = _files.read_bytes_capped(path, "TOOLKIT_FINDINGS", "", 64 << 20).splitlines()
    for n, raw in enumerate(lines, 1):
        try:
            f = _files.loads(raw.decode("utf-8"), "TOOLKIT_FINDINGS", "", name=f"line {n}")
        except ConfigError:
            if n == len(lines):
                continue  # the last line, torn by an interrupted append
            f = None
        except UnicodeDecodeError:
            f = None
        if (
            not isinstance(f, dict)
            or not isinstance(f.get("case"), str)
            or not re.fullmatch(r"C\d{1,4}", f["case"])
            or not isinstance(f.get("torch"), str)
            or not re.fullmatch(r"\d{1,3}\.\d{1,3}\.\d{1,3}(\+[\w.]{1,40})?", f["torch"])
            or not isinstance(f.get("reproduced"), bool)
        ):  # the case and the release are shown in tables and Markdown: their form is checked, not only their type
            raise ConfigError(
                "TOOLKIT_FINDINGS",
                "",
                f"{str(path)!r} line {n} holds {raw.decode('utf-8', 'replace')[:60]!r}, not a finding (an object "
                'with "case" like "C12", "torch" like "2.14.1" and "reproduced" true or false).',
                "delete that line (cases --check and the bug notebooks append findings), or point TOOLKIT_FINDINGS "
                "at another file.",
            )
        if case_id is None or f["case"] == case_id:
            release = torch_release(f["torch"])
            out.setdefault(f["case"], {})[release] = "reproduced" if f["reproduced"] else "not reproduced"
    return out


def versions(case: Case, *, with_findings: bool = True, recorded: dict[str, dict[str, str]] | None = None) -> str:
    """`reproduced on 2.13.0; not reproduced on 2.14.0 (local finding)`: the catalogue's verdicts plus this machine's
    (`recorded`: what `findings()` returned, when the caller already read it)."""
    parts = [f"{v} on {k}" for k, v in sorted(case.verified.items())]
    if with_findings:
        if recorded is None:
            recorded = findings(case.id)
        for release, verdict in sorted(recorded.get(case.id, {}).items()):
            if case.verified.get(release) != verdict:
                parts.append(f"{verdict} on {release} (local finding)")
    return "; ".join(parts) or case.torch_versions


def markdown(selection: list[Case] | None = None, *, with_findings: bool = False) -> str:
    """The catalogue as a markdown table (`with_findings` adds this machine's recorded verdicts): `needs` says what a
    repro takes (cpu / gpu / multi-rank), `torch` each release's verdict, `notebook` the bug notebook if there is
    one."""
    rows = [
        "| id | case | status | upstream | CPU | needs | torch | notebook |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    recorded = findings() if with_findings else {}
    for c in selection if selection is not None else cases():
        refs = ", ".join(f"[{u}]({link})" for u, link in zip(c.upstream, c.links)) if c.links else ", ".join(c.upstream)
        nb = f"[{pathlib.Path(c.notebook).name}](notebooks/{c.notebook})" if c.notebook else ""
        rows.append(
            f"| {c.id} | {c.title} | {c.status} | {refs} | {c.cpu} | {c.needs} | "
            f"{_escape.markdown(versions(c, with_findings=with_findings, recorded=recorded))} | {nb} |"
        )
    return "\n".join(rows)


def verdict(case: Case, release: str | None = None, *, recorded: dict[str, dict[str, str]] | None = None) -> str:
    """The case on one torch release (default: the installed one): the catalogue's verdict, else this machine's
    recorded finding (`recorded`, from `findings()`), else "not checked"."""
    release = release or torch_release()
    if release in case.verified:
        return case.verified[release]
    local = (recorded or {}).get(case.id, {}).get(release)
    return f"{local} (local)" if local else "not checked"


def text(selection: list[Case] | None = None, *, width: int = 100, with_findings: bool = False) -> str:
    """The catalogue as a plain-text table for a terminal `width` columns wide (titles and statuses wrapped): what a
    repro needs (cpu / gpu / multi-rank), whether a bug notebook shows it (nb), and the verdict for the installed
    torch release; `markdown()` has the links and every release's verdict."""
    import textwrap

    release = torch_release()
    recorded = findings() if with_findings else {}
    rows = [
        (c.id, c.title, c.status, c.needs, "yes" if c.notebook else "no", verdict(c, release, recorded=recorded))
        for c in (selection if selection is not None else cases())
    ]
    heads = ("id", "case", "status", "needs", "nb", f"torch {release}")
    fixed = [max([len(heads[i])] + [len(r[i]) for r in rows]) for i in (0, 3, 4, 5)]
    # What the fixed columns and the five two-space gaps leave goes to the two text columns, 3:2.
    free = max(40, width - sum(fixed) - 10)
    w_case, w_status = free * 3 // 5, free - free * 3 // 5
    widths = (fixed[0], w_case, w_status, *fixed[1:])
    out = ["  ".join(h.ljust(w) for h, w in zip(heads, widths)).rstrip(), "  ".join("-" * w for w in widths)]
    for r in rows:
        cols = [
            [r[0]],
            textwrap.wrap(r[1], w_case, break_on_hyphens=False) or [""],
            textwrap.wrap(r[2], w_status, break_on_hyphens=False) or [""],
            [r[3]],
            [r[4]],
            [r[5]],
        ]
        for i in range(max(len(col) for col in cols)):
            out.append("  ".join((col[i] if i < len(col) else "").ljust(w) for col, w in zip(cols, widths)).rstrip())
    out.append("")
    out += textwrap.wrap(
        f"{len(rows)} cases. needs: what a repro takes (cpu: one CPU process; gpu; multi-rank: "
        f"several processes); nb: a bug notebook shows it; torch {release}: the verdict recorded for "
        "the installed release"
        + (" (local: a finding of this machine)" if with_findings else "")
        + ". --markdown: the table with upstream links, notebooks and every release's verdict; "
        "--check CASE: re-run a repro here.",
        max(40, width),
    )
    return "\n".join(out)
