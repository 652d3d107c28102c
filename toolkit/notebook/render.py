"""What the Explorer writes into its output widgets: monospace text, a refusal in red, a run's headline and figures as
an Output widget's state."""

from __future__ import annotations

from typing import Any

from .. import _escape, _files
from ..analysis.classification import Classification, headline
from ..measurement import Report
from . import display

RED, GREEN = "#b30000", "#1e8449"


def esc(text: str) -> str:
    return _escape.html(text)


def pre(text: str) -> str:
    """Monospace text that keeps its lines: JupyterLab wraps a `<pre>` anywhere, mid-word ("lay / ers.1"); a long
    line scrolls sideways instead."""
    return f"<pre style='white-space:pre;overflow-x:auto;word-break:normal'>{esc(text)}</pre>"


def red(markup: str) -> str:
    """`markup` (already escaped) in the colour of a refusal or a failure."""
    return f"<span style='color:{RED}'>{markup}</span>"


def headline_html(report: Report, cl: Classification) -> str:
    """The stage line after a run: its classification in bold, green when it works, red otherwise."""
    color = GREEN if cl.label == "works" else RED
    return f"<span style='color:{color}'><b>{esc(headline(report, cl, title='done'))}</b></span>"


def run_figures(report: Report) -> tuple[dict, ...]:
    """A finished run's figures, as Output-widget state: saved bytes by module and by op, memory, and the recompute
    when anything was recomputed; none for a run that failed."""
    if not report.ok:
        return ()
    figs = [
        display.saved_figure(report, by="module"),
        display.saved_figure(report, by="op"),
        display.memory_figure({"this run": report}),
    ]
    if report.recompute.ops:
        figs.append(display.recompute_figure(report))
    return tuple(figure_output(fig) for fig in figs)


def figure_output(fig: Any) -> dict:
    """The display_data message of a plotly figure, written into an Output widget's state.

    Not `Output.append_display_data(fig)`: plotly figures display themselves through `_ipython_display_`, so the
    formatter returns an empty bundle and the figure goes to whichever cell is current — in JupyterLab, after a
    button click, nowhere (caught by tests/test_browser.py)."""
    import plotly.io as pio

    title = fig.layout.title.text or "figure"
    return {
        "output_type": "display_data",
        "metadata": {},
        "data": {
            "application/vnd.plotly.v1+json": _files.loads(pio.to_json(fig, validate=False), "figure", ""),
            "text/plain": f"<plotly figure: {title}>",
        },
    }
