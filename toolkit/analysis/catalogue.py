"""The known AC × compile × MoE composability cases, loaded from `catalogue.json`, and their tables; what a
signature matches is `signatures`', what this machine recorded `findings`'."""

from __future__ import annotations

import functools
import pathlib
from dataclasses import dataclass
from typing import Any

from .. import _escape
from .._config import ConfigError
from .findings import findings, torch_release
from .signatures import REPORT_KEYS, observed_shows, report_shows

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
        return observed_shows(self.signature or {}, observed)

    def matches(self, classification: str, report) -> bool:
        """Does a classified report show this case's signature?

        `any_of`: alternative sets of report keys, each laid over the rest of the signature — for a case that shows
        in two ways (C6: an error when the policy saves what it sees, a silent full recompute when it names the
        model's ops)."""
        sig = self.signature
        if not sig:
            return False
        base = {k: v for k, v in sig.items() if k != "any_of"}
        return any(report_shows({**base, **alt}, classification, report) for alt in sig.get("any_of") or [{}])


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
            if unknown := set(alt) - REPORT_KEYS:
                raise ConfigError(
                    "catalogue.json",
                    f"{c['id']}.signature.any_of",
                    f"an alternative names {sorted(unknown)}, which no report carries.",
                    f"use only report keys: {', '.join(sorted(REPORT_KEYS))}.",
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
