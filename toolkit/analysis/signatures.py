"""A case's signature read against a classified Report (its report keys) or a repro's observations: the one home of
what "this step shows this case" means."""

from __future__ import annotations

import math
import re
from typing import Any

REPORT_KEYS = {
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
"""The keys a signature reads off a classified Report (the rest are `observed` / `observed_contains`)."""


def shows(text: str, patterns) -> bool:
    """Does `text` contain one of `patterns`? A pattern starting with "re:" is a regular expression, for a bug whose
    wording changes between torch releases (C14: "Expected inputs of BF16 type" in 2.13, "Expected mat_a to be
    BFloat16 …" in 2.14): match what the bug is, not how one release phrases it."""
    return any(re.search(p[3:], text) if p.startswith("re:") else p in text for p in patterns)


def observed_shows(sig: dict[str, Any], observed: dict[str, Any]) -> bool:
    """A signature's `observed` (equal values) and `observed_contains` (texts) against a repro's observations; a
    signature with neither never matches them."""
    want, contains = sig.get("observed"), sig.get("observed_contains")
    if not want and not contains:
        return False
    for key, value in (want or {}).items():
        if key not in observed or observed[key] != value:
            return False
    for key, texts in (contains or {}).items():
        if not shows(str(observed.get(key, "")), texts):
            return False
    return True


def report_shows(sig: dict[str, Any], classification: str, report) -> bool:
    """One set of report keys against a classified report."""
    if not set(sig) & REPORT_KEYS:
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
    if "ac_modes" in sig and not ac_mode_shows(sig["ac_modes"], report):
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
    if "recompile_reason_contains" in sig and not shows(
        " ".join(report.compile.recompiles), sig["recompile_reason_contains"]
    ):
        return False
    if "order" in sig and sig["order"] not in set(report.compile.orders.values()):
        return False
    if "error_contains" in sig:
        text = f"{report.error.type} {report.error.message}" if report.error else ""
        if not shows(text, sig["error_contains"]):
            return False
    if "break_reason_contains" in sig:
        reasons = " ".join(b.reason for b in report.compile.breaks)
        if not shows(reasons, sig["break_reason_contains"]):
            return False
    if "recompute_op_contains" in sig:
        ops = " ".join(report.recompute.by_op)
        if not shows(ops, sig["recompute_op_contains"]):
            return False
    if "warning_contains" in sig and not shows(" ".join(report.warnings), sig["warning_contains"]):
        return False
    redrawn = report.recompute.redrawn  # one entry per random op a recompute drew again: matched entry by entry
    if "redrawn_contains" in sig and not any(shows(r, sig["redrawn_contains"]) for r in redrawn):
        return False
    if "redrawn_none" in sig and bool(redrawn) == sig["redrawn_none"]:
        return False
    return True


def ac_mode_shows(modes, report) -> bool:
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
