"""The verdict rule: the silent failures a Report shows on its own, most severe first, and line 1's word."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..transforms.naming import within

if TYPE_CHECKING:
    from .report import CompileInfo, Report

SEVERITY = (
    "grads_differ",
    "crashed",
    "timeout",
    "error",
    "fell_back_to_eager",
    "module_left_unwrapped",
    "sac_not_applied",
    "ac_saves_nothing",
    "recompiles",
    "graph_breaks",
    "works",
)
"""Every verdict a step can get, most severe first: the one order line 1, `classify` and the matrix read."""


def silent_failures(r: Report) -> tuple[tuple[str, str], ...]:
    """`(label, why)` of each silent failure this Report shows on its own, most severe first: gradients that
    differ from the reference (a recompute that drew new random numbers always does), compile that fell back to
    eager, a memory budget that no partitioner read. The one rule `classify` and the summary's first line both
    read (the failures that need reference runs, a policy with no effect, are `classify`'s)."""
    if not r.ok:
        return ()
    out = []
    n, redrawn = r.numerics, r.recompute.redrawn
    if redrawn or (n.compared and not n.grads_match):
        why = []
        if redrawn:
            why.append(
                f"recompute re-drew random numbers: {', '.join(redrawn[:3])}" + (" …" if len(redrawn) > 3 else "")
            )
        if n.compared and not n.grads_match:
            why.append(f"max |dgrad| {n.grad_diff_text} in {n.worst_param} vs {n.reference or 'the reference'}")
        out.append(("grads_differ", "; ".join(why)))
    c = r.compile
    if c.fell_back_to_eager:
        out.append(("fell_back_to_eager", _fell_back_text(c)))
    if c.memory_budget is not None and c.aot_autograd is False:
        # No partitioner read the budget: what it asked to recompute is saved (C66), whoever set it.
        out.append(
            (
                "ac_saves_nothing",
                f"activation_memory_budget {c.memory_budget:g} was set, but the graphs compiled without "
                "AOTAutograd (the `eager` backend): no partitioner reads the budget, so nothing is recomputed",
            )
        )
    unwrapped = r.transforms.left_unwrapped
    if unwrapped:
        names = ", ".join(unwrapped[:6]) + (" …" if len(unwrapped) > 6 else "")
        out.append(
            (
                "module_left_unwrapped",
                f"AC was asked to checkpoint {names}, but {'it' if len(unwrapped) == 1 else 'they'} ran with no "
                f"checkpoint around {'it' if len(unwrapped) == 1 else 'them'}",
            )
        )
    return tuple(sorted(out, key=lambda f: SEVERITY.index(f[0])))


def verdict(r: Report) -> str:
    """The first line's word: the outcome when the step did not end ("error", "crashed", "timeout"), else the most
    severe silent failure it shows, else "ok"."""
    if not r.ok:
        return r.outcome
    silent = silent_failures(r)
    return silent[0][0] if silent else "ok"


def names(names: tuple[str, ...], n: int = 6) -> str:
    """`layers.0, layers.1 …`: the first `n` canonical names ("" is the model)."""
    return ", ".join(x or "<model>" for x in names[:n]) + (" …" if len(names) > n else "")


def _fell_back_text(c: CompileInfo) -> str:
    """`compile requested, but layers.0, layers.1 ran eagerly (0 graphs)`; for checkpoints Dynamo gave up inside a
    region whose graphs otherwise ran: `… these checkpointed layers ran eagerly, outside the graph: model.layers.0`."""
    parts = []
    # A checkpoint inside a region that had no graph at all is said by that region's name already.
    inside = tuple(e for e in c.eager_checkpoints if not any(within(e, r) for r in c.regions_without_graphs))
    if c.regions_without_graphs or not inside:
        parts.append(f"{names(c.regions_without_graphs) or 'every region'} ran eagerly")
    if inside:
        parts.append(
            f"these checkpointed layers ran eagerly, outside the graph: {names(inside)} (a graph break inside each "
            "checkpoint)"
        )
    return f"compile requested, but {'; '.join(parts)} ({c.graphs} graphs)"
