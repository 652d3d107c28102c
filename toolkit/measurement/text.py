"""A Report as plain text: a deterministic summary led by its verdict (what nbval compares)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._escape import terminal
from ..instrument.records import fmt_bytes, fmt_measured_bytes
from .verdict import names

if TYPE_CHECKING:
    from .report import Report

INPUT_WARNING = "InputWarning: "
"""How a captured `_config.InputWarning` starts in `Report.warnings` (`f"{category}: {message}"`)."""
EXPLAINED = ("CheckpointError explained:", "CheckpointError likely cause:")
"""How the warnings a CheckpointError explanation puts first begin."""


def _top(d: dict[str, int], n: int = 6) -> str:
    items = sorted(d.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    more = len(d) - len(items)
    return ", ".join(f"{k or '<model>'} {fmt_bytes(v)}" for k, v in items) + (f", +{more} more" if more > 0 else "")


def format_report(r: Report) -> str:
    """A deterministic summary: rounded numbers, no timings, no addresses (what nbval compares)."""
    lines = []
    title = terminal(r.scenario.name) or "scenario"  # a Report read from a file may carry anything
    silent = r.silent_failures
    # The verdict leads: a step that ran to its end with wrong gradients is not "ok" on the first line.
    lines.append(
        f"{title}: {r.outcome}" if not silent else f"{title}: {silent[0][0]} [silent failure] — {silent[0][1]}"
    )
    if r.error is not None:
        lines.append(f"  error at {r.error.stage}: {r.error.type}: {r.error.message.splitlines()[0][:200]}")
    if r.checkpoint_error is not None:
        lines += [f"  {line}" for line in r.checkpoint_error.lines()]
    # An input that ran but did nothing of what it says (InputWarning) leads, before any number it may explain.
    inputs = [w for w in r.warnings if w.startswith(INPUT_WARNING)]
    for w in inputs:
        lines.append(f"  input: {w[len(INPUT_WARNING) :].splitlines()[0][:300]}")
    others = [w for w in _shown_warnings(r) if not w.startswith(INPUT_WARNING)]
    if r.outcome in ("crashed", "timeout") and r.error is None:
        return "\n".join(lines)
    measured = bool(r.saved.tensors) or bool(r.memory.method) or r.numerics.loss is not None
    if not measured:
        if r.compile.requested and r.compile.orders:
            lines.append("  compile orders: " + ", ".join(sorted(set(r.compile.orders.values()))))
        for w in others[:3]:
            lines.append(f"  warning: {w.splitlines()[0][:140]}")
        return "\n".join(lines)
    s = r.saved
    lines.append(
        f"  saved for backward: {fmt_bytes(s.total_bytes)} in {len(s.tensors)} tensors "
        f"(+{fmt_bytes(s.params_bytes)} params/buffers)"
    )
    if s.by_kind:
        lines.append("    by kind: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in sorted(s.by_kind.items())))
    if s.by_module:
        lines.append("    by module: " + _top(s.by_module))
    if s.by_op:
        lines.append("    by op: " + _top(s.by_op))
    rc = r.recompute
    rerun = ", ".join(f"{k} x{v}" for k, v in sorted(rc.compiled_reruns.items()))
    lines.append(
        f"  recomputed in backward: {rc.ops} ops"
        + (f" (+{rc.bookkeeping} of the checkpoint's own)" if rc.bookkeeping else "")
        + (f"; compiled regions re-run: {rerun}" if rerun else "")
        + (f"; {rc.in_compiled_backward} forward ops inside compiled backward" if rc.in_compiled_backward else "")
    )
    c = r.compile
    if c.requested:
        warm = f" ({c.warm_graphs} compiled before the step)" if c.warm_graphs else ""
        lines.append(
            f"  compile: {c.graphs} graphs{warm}, {c.graph_breaks} graph breaks, {len(c.recompiles)} recompiles"
            + (
                "; FELL BACK TO EAGER in " + names((*c.regions_without_graphs, *c.eager_checkpoints), 99)
                if c.fell_back_to_eager
                else ""
            )
        )
        if c.memory_budget is not None:
            lines.append(f"    activation_memory_budget {c.memory_budget:g} (read from torch's config in the step)")
        if c.compiled_later:
            lines.append(f"    a later step compiled {c.compiled_later} more graphs (not counted above)")
        for b in c.breaks[:5]:
            lines.append(f"    break at {b.place}: {b.reason.splitlines()[0][:120]}")
    else:
        lines.append("  compile: not requested")
    m = r.memory
    if m.method:
        lines.append(
            f"  memory ({m.device}, {m.method}): peak {fmt_measured_bytes(m.peak_bytes)}, "
            f"held after forward {fmt_measured_bytes(m.held_after_forward_bytes)}"
        )
    n = r.numerics
    if n.loss is not None:
        if n.compared:
            lines.append(
                f"  numerics: loss {n.loss:.4f}; vs {n.reference or 'the reference'}: |dloss| "
                f"{'-' if n.loss_diff is None else format(n.loss_diff, '.1e')}, "
                f"max |dgrad| {n.grad_diff_text} -> {'match' if n.grads_match else 'MISMATCH'}"
            )
        else:
            lines.append(
                f"  numerics: loss {n.loss:.4f}; gradients not compared" + (f" ({n.reference})" if n.reference else "")
            )
    d = r.distributed
    if d.world_size > 1 or d.collectives:
        calls = ", ".join(f"{k} x{v}" for k, v in d.collectives.items())
        lines.append(f"  rank {d.rank} of {d.world_size}" + (f"; collectives: {calls}" if calls else ""))
    for spot in r.blind_spots:
        lines.append(f"  cannot see: {spot.split(' (', 1)[0]}")
    for w in others[:3]:
        lines.append(f"  warning: {w.splitlines()[0][:140]}")
    return "\n".join(lines)


def _shown_warnings(r: Report) -> list[str]:
    """The warnings the summary lists: a CheckpointError's explanation has its own lines above them."""
    return [w for w in r.warnings if not (r.checkpoint_error is not None and w.startswith(EXPLAINED))]
