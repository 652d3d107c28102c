"""Classify a Report: `works`, `error`, or a silent failure, with the catalogued cases it shows.

Classify a Report: `works`, `error`, or one of the silent failures (gradients differ, compile fell back to eager, SAC
had no effect, …), with the catalogued cases it shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._config import check_instance
from .._escape import terminal
from ..instrument.records import fmt_bytes, short_paths
from ..measurement.report import Report
from ..measurement.verdict import SEVERITY
from ..transforms.ac import MODES
from . import catalogue

EXPLAIN = {
    "grads_differ": "gradients differ from the reference (or a recompute drew new random numbers): silently wrong "
    "training",
    "crashed": "the worker process died",
    "timeout": "no result within the time limit",
    "error": "raised an error",
    "fell_back_to_eager": "compile was requested but the region ran eagerly (no graph)",
    "module_left_unwrapped": "AC was asked for a module, but it ran with no checkpoint around it",
    "sac_not_applied": "the selective policy had no effect: saved the same as full AC or as no AC",
    "ac_saves_nothing": "activation checkpointing saved no memory: saved >= the same setup without AC",
    "recompiles": "compiled code was recompiled",
    "graph_breaks": "the compiled region was split by graph breaks",
    # Per cell, `classify` says what "works" meant: ran eagerly or compiled (how many graphs), gradients compared.
    "works": "no failure found: compiled where compile was asked for, gradients match eager where compared",
}
# The failures no exception announces: a run can end "ok" and still be one of these.
SILENT = tuple(label for label in SEVERITY if label not in ("works", "error", "crashed", "timeout"))
# The classifications that need the same setup run without AC (and with full AC): `reference_scenarios`.
NEED_REFERENCES = ("sac_not_applied", "ac_saves_nothing")
# The modes whose policy decides op by op (per_submodule's does with submodule_ac="selective"): their own configs say.
_SELECTIVE = tuple(mode for mode, config in MODES.items() if config.SELECTIVE)


@dataclass(frozen=True)
class Classification:
    label: str
    explanation: str
    flags: tuple[str, ...] = ()
    cases: tuple[str, ...] = ()
    links: tuple[str, ...] = ()

    @property
    def severity(self) -> int:
        return SEVERITY.index(self.label)


def classify(report: Report, refs: dict[str, Report] | None = None) -> Classification:
    """Sort a cell's report into works / error / the silent failures; `refs` holds the same block and compile
    setup with AC "none" and "full" (keys "none", "full"), for the checks that compare against them."""
    check_instance("classify", "report", report, Report, "pass a Report (tk.run(...) or tk.measure(...) returns one).")
    refs = refs or {}
    for key, ref in refs.items():
        check_instance("classify", f"refs[{key!r}]", ref, Report, "pass Reports of the reference runs.")
    flags: list[str] = []
    why: dict[str, str] = {}
    if report.outcome in ("crashed", "timeout"):
        flags.append(report.outcome)
        why[report.outcome] = report.error.message if report.error else EXPLAIN[report.outcome]
    elif report.outcome == "error":
        flags.append("error")
        e = report.error
        assert e is not None  # an "error" outcome holds the error it ended on (Report.from_dict refuses one without)
        d = report.checkpoint_error
        if d is not None:
            # Torch's message names a position; say what diverged and why, from what the probes saw.
            why["error"] = f"{e.type.rsplit('.', 1)[-1]} at {e.stage}: {d.summary()}; likely cause: {d.cause_text()}"
        else:
            why["error"] = f"{e.type.rsplit('.', 1)[-1]} at {e.stage}: {e.message.strip().splitlines()[0][:160]}"
    else:
        for label, text in report.silent_failures:  # grads_differ, fell_back_to_eager: the Report's own rule
            flags.append(label)
            why[label] = text
        c = report.compile
        ac = report.scenario.ac_mode
        saved = report.saved.total_bytes
        none_ref, full_ref = refs.get("none"), refs.get("full")
        selective = ac in _SELECTIVE
        if selective and none_ref is not None and full_ref is not None and none_ref.ok and full_ref.ok:
            s_none, s_full = none_ref.saved.total_bytes, full_ref.saved.total_bytes
            if s_none != s_full and (_close(saved, s_full) or _close(saved, s_none)):
                flags.append("sac_not_applied")
                like = "full AC" if _close(saved, s_full) else "no AC"
                why["sac_not_applied"] = f"saved {fmt_bytes(saved)}, the same as {like}"
        if (
            _ran_ac(report)
            and none_ref is not None
            and none_ref.ok
            and saved >= none_ref.saved.total_bytes
            and "fell_back_to_eager" not in flags
            and "ac_saves_nothing" not in flags
        ):
            flags.append("ac_saves_nothing")
            why["ac_saves_nothing"] = f"saved {fmt_bytes(saved)} >= {fmt_bytes(none_ref.saved.total_bytes)} without AC"
        if c.recompiles:
            flags.append("recompiles")
            first = short_paths(" ".join(c.recompiles[0].splitlines()[0].split()))
            why["recompiles"] = f"{len(c.recompiles)} recompiles, guard failed: {first[:140]}"
        if c.graph_breaks:
            flags.append("graph_breaks")
            b = c.breaks[0] if c.breaks else None
            where = f" at {b.place}: {b.reason.splitlines()[0][:100]}" if b else ""
            why["graph_breaks"] = f"{c.graph_breaks} graph breaks{where}"
    if not flags:
        flags.append("works")
        why["works"] = _works(report)
    flags.sort(key=SEVERITY.index)
    label = flags[0]
    matched = []
    for flag in flags:
        for case in catalogue.match(flag, report):
            if case.id not in matched:
                matched.append(case.id)
    links = tuple(dict.fromkeys(link for cid in matched for link in catalogue.get(cid).links))
    return Classification(label, why[label], tuple(flags), tuple(matched), links)


def _ran_ac(report: Report) -> bool:
    """AC was on in the step: configured by the toolkit, or (a model measured as it came, `ac_mode` "unknown") seen
    in the step — a checkpoint began, selective or not, or a memory budget below 1 was in torch's config."""
    ac = report.scenario.ac_mode
    if ac != "unknown":
        return ac != "none"
    t = report.transforms
    return bool(t.under_checkpoint or t.selective or report.compile.memory_budget is not None)


def _works(report: Report) -> str:
    """What "works" means for this cell: an eager cell was not compiled, and gradients may not have been compared."""
    c, n = report.compile, report.numerics
    graphs = f"{c.graphs} graph{'' if c.graphs == 1 else 's'}"
    if report.scenario.recipe:
        ran = f"the recipe ran compiled ({graphs}, no graph break)"
    elif c.requested:
        ran = f"ran compiled as requested ({graphs}, no graph break)"
    else:
        ran = "ran eagerly (no compile requested)"
    if n.compared:
        # The reference's own words where it is not plain eager (a compiled one, for compiled random draws).
        grads = (
            "gradients match eager"
            if n.reference.startswith("eager")
            else f"gradients match the same model {n.reference}"
        )
    else:
        grads = "gradients not compared" + (f" ({n.reference})" if n.reference else "")
    return f"{ran}, {grads}"


def reference_scenarios(scenario) -> dict[str, Any]:
    """The runs `classify` compares a scenario with, to see `sac_not_applied` and `ac_saves_nothing`: the same model
    and compile setup without AC ("none") and, for a selective mode, with full AC ("full"). Empty for a recipe or
    AC "none". They measure saved bytes only (no numerics, no memory step)."""
    from ..transforms import ACConfig

    if scenario.recipe or scenario.ac.mode == "none":
        return {}
    quick = dict(check_numerics=False, measure_memory=False, steady_steps=0, memory_snapshot=None)
    label = scenario.label
    # Without AC there is no wrapper for `order` to place compile around, so the scope decides alone.
    refs = {
        "none": scenario.replace(
            ac=ACConfig.of(), compile=scenario.compile.replace(order=None), name=f"{label} [reference: no AC]", **quick
        )
    }
    if scenario.ac.mode in _SELECTIVE:
        refs["full"] = scenario.replace(ac=ACConfig.of(mode="full"), name=f"{label} [reference: full AC]", **quick)
    return refs


def headline(report: Report, cl: Classification, title: str | None = None) -> str:
    """One line that leads with the classification, not the outcome: `name: fell_back_to_eager [silent failure] —
    compile requested, but layers.0, layers.1 ran eagerly (0 graphs); known case C2` (`title` replaces the name)."""
    tag = " [silent failure]" if cl.label in SILENT else ""
    cases = f"; known case {', '.join(cl.cases)}" if cl.cases else ""
    return f"{terminal(title or report.scenario.name) or 'scenario'}: {cl.label}{tag} — {cl.explanation}{cases}"


def describe(report: Report, cl: Classification, *, references: bool | None = None) -> str:
    """`str(report)` led by the classification: the headline, the other flags, the known cases with their first link,
    what was not checked (`references=False`: `sac_not_applied` / `ac_saves_nothing` need reference runs), then
    the report's own lines."""
    lines = [headline(report, cl)]
    others = [f for f in cl.flags if f != cl.label]
    if others:
        lines.append("  also: " + ", ".join(others))
    for cid in cl.cases:
        case = catalogue.get(cid)
        lines.append(f"  known case {cid}: {case.title}" + (f" ({case.links[0]})" if case.links else ""))
    ac = report.scenario.ac_mode
    if references is False and report.ok and ac not in ("none", "unknown") and not report.scenario.recipe:
        unchecked = NEED_REFERENCES if ac in _SELECTIVE else ("ac_saves_nothing",)
        lines.append(
            f"  not checked: {', '.join(unchecked)} (they compare with the same setup run without AC"
            + (" and with full AC)" if ac in _SELECTIVE else ")")
        )
    body = str(report).splitlines()
    lines.append(f"  step outcome: {report.outcome}")
    lines += body[1:]
    return "\n".join(lines)


def _close(a: int, b: int, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * max(a, b, 1)
