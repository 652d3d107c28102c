"""Figure builders and plain-text twins for Reports (pure: they return `go.Figure`s and strings, never display)."""

from __future__ import annotations

from typing import Any, Mapping

from .. import _escape
from ..instrument.records import KINDS, fmt_bytes, fmt_measured_bytes, short_paths
from ..measurement.report import Report

KIND_COLORS = {
    "autograd": "#4c78a8",
    "compiled": "#f58518",
    "sac_cache": "#54a24b",
    "remat_save": "#17becf",
    "checkpoint_input": "#b279a2",
    "offloaded": "#e45756",
    "other": "#9d9da0",
}


def _grouped(report: Report, by: str, top: int) -> tuple[list[str], dict[str, list[int]]]:
    if by not in ("module", "op"):
        raise ValueError(f"by={by!r}: use 'module' or 'op'")
    totals: dict[str, int] = {}
    per_kind: dict[tuple[str, str], int] = {}
    for t in report.saved.tensors:
        key = (t.module or "<model>") if by == "module" else t.op
        totals[key] = totals.get(key, 0) + t.bytes
        per_kind[(key, t.kind)] = per_kind.get((key, t.kind), 0) + t.bytes
    keys = [k for k, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    return keys, {kind: [per_kind.get((k, kind), 0) for k in keys] for kind in KINDS}


def saved_figure(report: Report, by: str = "module", top: int = 20):
    """Stacked bars of bytes held for backward per module (or op), coloured by kind."""
    import plotly.graph_objects as go

    keys, series = _grouped(report, by, top)
    fig = go.Figure()
    for kind in KINDS:
        if any(series[kind]):
            fig.add_bar(
                name=kind,
                x=keys,
                y=[v / 2**10 for v in series[kind]],
                marker_color=KIND_COLORS[kind],
                hovertemplate="%{x}<br>%{y:.1f} KiB<extra>" + kind + "</extra>",
            )
    fig.update_layout(
        barmode="stack",
        title=f"saved for backward by {by}: {fmt_bytes(report.saved.total_bytes)}",
        yaxis_title="KiB",
        xaxis_tickangle=-40,
        legend_title="kind",
        height=420,
    )
    return fig


def saved_text(report: Report, by: str = "module", top: int = 20) -> str:
    """The plain-text twin of `saved_figure` (rounded, deterministic)."""
    keys, series = _grouped(report, by, top)
    kinds = [k for k in KINDS if any(series[k])]
    width = max([len(by)] + [len(k) for k in keys]) + 2
    lines = [f"{by:<{width}}" + "".join(f"{k:>18}" for k in kinds) + f"{'total':>12}"]
    for i, key in enumerate(keys):
        row = [series[k][i] for k in kinds]
        lines.append(
            f"{key:<{width}}" + "".join(f"{fmt_bytes(v) if v else '-':>18}" for v in row) + f"{fmt_bytes(sum(row)):>12}"
        )
    return "\n".join(lines)


def memory_figure(reports: Mapping[str, Report]):
    """Grouped bars per run: saved for backward, held after forward and peak."""
    import plotly.graph_objects as go

    labels = list(reports)
    fig = go.Figure()
    for name, get in (
        ("saved for backward", lambda r: r.saved.total_bytes),
        ("held after forward", lambda r: r.memory.held_after_forward_bytes),
        ("peak", lambda r: r.memory.peak_bytes),
    ):
        fig.add_bar(
            name=name,
            x=labels,
            y=[get(reports[k]) / 2**20 for k in labels],
            hovertemplate="%{x}<br>%{y:.2f} MiB<extra>" + name + "</extra>",
        )
    fig.update_layout(barmode="group", yaxis_title="MiB", title="memory per run", height=380)
    return fig


def memory_text(reports: Mapping[str, Report]) -> str:
    width = max([5] + [len(k) for k in reports]) + 2
    lines = [f"{'run':<{width}}{'saved':>12}{'held':>12}{'peak':>12}{'recomputed':>12}"]
    for k, r in reports.items():
        lines.append(
            f"{k:<{width}}{fmt_bytes(r.saved.total_bytes):>12}"
            f"{fmt_measured_bytes(r.memory.held_after_forward_bytes):>12}"
            f"{fmt_measured_bytes(r.memory.peak_bytes):>12}{r.recompute.ops:>12}"
        )
    return "\n".join(lines)


def recompute_text(reports: Mapping[str, Report]) -> str:
    """One line per run: what it saves, by kind, and where its recompute happens — forward ops re-run eagerly in
    backward (`eager ops`), forward ops the partitioner placed in compiled backward graphs (`in graph bwd`), compiled
    forwards run again in backward (`graph reruns`, AC(compile(x))) — and whether the gradients match eager
    (`-` where not compared). Deterministic: exact counts and rounded bytes."""
    kinds = [k for k in KINDS if any(k in r.saved.by_kind for r in reports.values())]
    width = max([3] + [len(k) for k in reports]) + 2
    lines = [
        f"{'run':<{width}}{'saved':>10}"
        + "".join(f"{k:>18}" for k in kinds)
        + f"{'eager ops':>11}{'in graph bwd':>14}{'graph reruns':>14}{'grads':>10}"
    ]
    for name, r in reports.items():
        grads = {True: "match", False: "MISMATCH", None: "-"}[r.numerics.grads_match]
        kind_cols = "".join(f"{fmt_bytes(r.saved.by_kind[k]) if k in r.saved.by_kind else '-':>18}" for k in kinds)
        lines.append(
            f"{name:<{width}}{fmt_bytes(r.saved.total_bytes):>10}{kind_cols}{r.recompute.ops:>11}"
            f"{r.recompute.in_compiled_backward:>14}{sum(r.recompute.compiled_reruns.values()):>14}{grads:>10}"
        )
    return "\n".join(lines)


def recompute_figure(report: Report, top: int = 15):
    """Bars of the forward ops re-run in backward, per op."""
    import plotly.graph_objects as go

    items = sorted(report.recompute.by_op.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    fig = go.Figure(go.Bar(x=[k for k, _ in items], y=[v for _, v in items], marker_color="#e45756"))
    fig.update_layout(
        title=f"recomputed in backward: {report.recompute.ops} ops", yaxis_title="ops", xaxis_tickangle=-40, height=380
    )
    return fig


def breaks_text(report: Report) -> str:
    """Graph breaks (reason, file:line) and recompiles as plain text."""
    c = report.compile
    if not c.requested:
        return "compile not requested"
    lines = [
        f"{c.graphs} graphs, {c.graph_breaks} graph breaks, {len(c.recompiles)} recompiles"
        + (" — fell back to eager in " + ", ".join(c.regions_without_graphs) if c.fell_back_to_eager else "")
    ]
    for b in c.breaks:
        lines.append(f"  break  {b.place}  {b.reason.splitlines()[0]}")
    for r in c.recompiles:
        lines.append(f"  recompile  {short_paths(' '.join(r.splitlines()[0].split()))[:140]}")
    return "\n".join(lines)


def breaks_html(report: Report) -> str:
    """`breaks_text` as HTML: its first line, and a where / reason table only when there is a break or recompile."""
    c = report.compile
    head = _escape.html(breaks_text(report).splitlines()[0])
    if not c.breaks and not c.recompiles:
        return f"<b>{head}</b>"  # an empty table would only be a header
    rows = "".join(
        f"<tr><td>{_escape.html(b.place)}</td><td>{_escape.html(b.reason.splitlines()[0])}</td></tr>" for b in c.breaks
    )
    rec = "".join(
        f"<tr><td>recompile</td><td>{_escape.html(short_paths(' '.join(r.splitlines()[0].split()))[:200])}</td></tr>"
        for r in c.recompiles
    )
    return f"<b>{head}</b><table><tr><th>where</th><th>reason</th></tr>{rows}{rec}</table>"


def _module_diffs(a: Report, b: Report, top: int) -> list[str]:
    """The modules whose saved bytes differ most between two runs (largest difference first; equal ones left out)."""
    mods = set(a.saved.by_module) | set(b.saved.by_module)
    diffs = sorted(mods, key=lambda m: (-abs(b.saved.by_module.get(m, 0) - a.saved.by_module.get(m, 0)), m))[:top]
    return [m for m in diffs if a.saved.by_module.get(m, 0) != b.saved.by_module.get(m, 0)]


def compare_text(a: Report, b: Report, names: tuple[str, str] = ("A", "B"), top: int = 12) -> str:
    """Two runs side by side: memory, and the modules whose saved bytes differ most (the text twin of
    `compare_figure`)."""
    lines = [memory_text({names[0]: a, names[1]: b}), "", f"{'module':<36}{names[0]:>12}{names[1]:>12}{'diff':>12}"]
    for m in _module_diffs(a, b, top):
        x, y = a.saved.by_module.get(m, 0), b.saved.by_module.get(m, 0)
        sign = "+" if y > x else "-"
        lines.append(f"{m or '<model>':<36}{fmt_bytes(x):>12}{fmt_bytes(y):>12}{sign + fmt_bytes(abs(y - x)):>12}")
    return "\n".join(lines)


# Run A in a muted blue, run B in orange; a difference is labelled red where B needs more, green where it needs less.
COMPARE_COLORS = {"a": "#4c78a8", "b": "#f58518", "more": "#c0392b", "less": "#1e8449", "same": "#7f7f7f"}


def _signed(delta: int) -> str:
    return ("+" if delta > 0 else "−") + fmt_bytes(abs(delta))


def compare_figure(a: Report, b: Report, names: tuple[str, str] = ("A", "B"), top: int = 12):
    """Two runs side by side as bars: saved bytes per module (the modules that differ most) and memory (saved,
    held after forward, peak), each difference written over its pair in red (B needs more) or green (less).
    Its plain-text twin is `compare_text` with the same arguments."""
    from plotly.subplots import make_subplots

    mods = _module_diffs(a, b, top)
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.64, 0.36],
        horizontal_spacing=0.1,
        subplot_titles=["saved for backward by module: where the runs differ", "memory"],
    )
    keys = [m or "<model>" for m in mods]
    metrics = [
        ("saved", lambda r: r.saved.total_bytes),
        ("held after forward", lambda r: r.memory.held_after_forward_bytes),
        ("peak", lambda r: r.memory.peak_bytes),
    ]
    for name, run, color in ((names[0], a, COMPARE_COLORS["a"]), (names[1], b, COMPARE_COLORS["b"])):
        fig.add_bar(
            name=name,
            legendgroup=name,
            x=keys,
            y=[run.saved.by_module.get(m, 0) / 2**10 for m in mods],
            marker_color=color,
            hovertemplate="%{x}<br>%{y:.1f} KiB<extra>" + name + "</extra>",
            row=1,
            col=1,
        )
        fig.add_bar(
            name=name,
            legendgroup=name,
            showlegend=False,
            x=[k for k, _ in metrics],
            y=[get(run) / 2**20 for _, get in metrics],
            marker_color=color,
            hovertemplate="%{x}<br>%{y:.3f} MiB<extra>" + name + "</extra>",
            row=1,
            col=2,
        )
    # Upright labels would overlap over a dozen narrow pairs: written upwards from the taller bar instead.
    upright = len(mods) <= 5
    for m, key in zip(mods, keys):
        x, y = a.saved.by_module.get(m, 0), b.saved.by_module.get(m, 0)
        fig.add_annotation(
            x=key,
            y=max(x, y) / 2**10,
            text=_signed(y - x),
            showarrow=False,
            textangle=0 if upright else -90,
            yshift=3,
            yanchor="bottom",
            font=dict(size=11, color=COMPARE_COLORS["more" if y > x else "less"]),
            row=1,
            col=1,
        )
    for key, get in metrics:
        x, y = get(a), get(b)
        fig.add_annotation(
            x=key,
            y=max(x, y) / 2**20,
            text=_signed(y - x) if x != y else "same",
            showarrow=False,
            yshift=3,
            yanchor="bottom",
            font=dict(size=11, color=COMPARE_COLORS["same" if x == y else "more" if y > x else "less"]),
            row=1,
            col=2,
        )
    if not mods:
        fig.add_annotation(
            text="no module saves a different amount",
            showarrow=False,
            xref="x domain",
            yref="y domain",
            x=0.5,
            y=0.5,
            row=1,
            col=1,
        )
    fig.update_layout(barmode="group", height=440, title=f"{names[0]} vs {names[1]}", legend_title="run")
    # Head room above the tallest pair for its label (annotations do not widen an axis' range).
    top_kib = max([max(a.saved.by_module.get(m, 0), b.saved.by_module.get(m, 0)) / 2**10 for m in mods] or [1])
    top_mib = max(max(get(a), get(b)) / 2**20 for _, get in metrics) or 1
    fig.update_yaxes(title_text="KiB", range=[0, top_kib * (1.18 if upright else 1.45)], row=1, col=1)
    fig.update_yaxes(title_text="MiB", range=[0, top_mib * 1.18], row=1, col=2)
    fig.update_xaxes(tickangle=-40, row=1, col=1)
    return fig


def tradeoff_figure(reports: Mapping[str, Report], memory: str = "saved"):
    """Memory against recompute, one point per run (a Pareto view of AC choices)."""
    import plotly.graph_objects as go

    labels = list(reports)
    get = {"saved": lambda r: r.saved.total_bytes, "peak": lambda r: r.memory.peak_bytes}[memory]
    recompute = [reports[k].recompute.ops + reports[k].recompute.in_compiled_backward for k in labels]
    fig = go.Figure(
        go.Scatter(
            x=recompute,
            y=[get(reports[k]) / 2**20 for k in labels],
            mode="markers+text",
            text=labels,
            textposition="top center",
            marker=dict(size=11),
        )
    )
    fig.update_layout(
        title=f"{memory} memory vs recomputed forward ops",
        xaxis_title="forward ops recomputed in backward",
        yaxis_title=f"{memory} (MiB)",
        height=420,
    )
    return fig


def compile_text(reports: Mapping[str, Report]) -> str:
    """One line per run: graphs, breaks, recompiles, fallback, and the first break's reason and place."""
    width = max([3] + [len(k) for k in reports]) + 2
    lines = [f"{'run':<{width}}{'outcome':>9}{'graphs':>8}{'breaks':>8}{'recomp':>8}  first break / error"]
    for k, r in reports.items():
        c = r.compile
        if r.error is not None:
            note = f"{r.error.type.rsplit('.', 1)[-1]}: {r.error.message.splitlines()[0][:70]}"
        elif c.breaks:
            b = c.breaks[0]
            note = f"{b.place} {b.reason.splitlines()[0][:60]}"
        else:
            note = "fell back to eager" if c.fell_back_to_eager else ""
        if c.fell_back_to_eager and c.breaks:
            note += " (fell back to eager)"
        lines.append(f"{k:<{width}}{r.outcome:>9}{c.graphs:>8}{c.graph_breaks:>8}{len(c.recompiles):>8}  {note}")
    return "\n".join(lines)


def decisions_text(decisions, ops: tuple[str, ...] = ("mm", "scaled_dot_product", "topk", "_grouped_mm")) -> str:
    """A SAC policy's decisions (from `toolkit.transforms.record_policy_decisions()`), for the ops worth reading."""
    lines = [f"{'#':>3}  {'op':<60}{'rhs shape':<12}{'decision':<18}reason"]
    n = 0
    for d in decisions:
        if not any(o in d.op for o in ops):
            continue
        n += 1
        shape = "x".join(map(str, d.rhs_shape)) if d.rhs_shape else ""
        lines.append(f"{n:>3}  {d.op:<60}{shape:<12}{d.decision:<18}{d.reason}")
    return "\n".join(lines)


def estimate_text(estimates: Mapping[str, Any], top_modules: int = 0) -> str:
    """Plain-text twin of `estimate_figure`: saved, peak and the peak without weight gradients, per estimate."""
    width = max([5] + [len(k) for k in estimates]) + 2
    lines = [f"{'run':<{width}}{'saved':>12}{'peak':>12}{'peak - grads':>14}"]
    for k, e in estimates.items():
        lines.append(
            f"{k:<{width}}{fmt_bytes(e.saved_bytes):>12}{fmt_bytes(e.peak_bytes):>12}"
            f"{fmt_bytes(max(0, e.peak_bytes - e.params_bytes)):>14}"
        )
        for mod, n in sorted(e.saved_by_module.items(), key=lambda kv: -kv[1])[:top_modules]:
            lines.append(f"    {mod or '(model)':<{width + 4}}{fmt_bytes(n):>10}")
    return "\n".join(lines)


def estimate_figure(estimates: Mapping[str, Any]):
    """Grouped bars per estimate: saved for backward, and the peak without the weight gradients (GiB)."""
    import plotly.graph_objects as go

    labels = list(estimates)
    fig = go.Figure()
    for name, get in (
        ("saved for backward", lambda e: e.saved_bytes),
        ("peak minus weight gradients", lambda e: max(0, e.peak_bytes - e.params_bytes)),
    ):
        fig.add_bar(
            name=name,
            x=labels,
            y=[get(estimates[k]) / 2**30 for k in labels],
            hovertemplate="%{x}<br>%{y:.2f} GiB<extra>" + name + "</extra>",
        )
    fig.update_layout(barmode="group", yaxis_title="GiB", title="full-size estimates (fake tensors)", height=380)
    return fig
