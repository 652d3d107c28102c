"""`Explorer`: an ipywidgets app to build a scenario, run it on a button, pin and compare runs, and export a repro.

Everything is drivable headless: set the controls' `.value`, call `run()`, read `report`, `classification`,
`stage_text` (the status line: `done: fell_back_to_eager [silent failure] — …`), `status.value`, `summary.value`;
`compare()` returns the comparison's text twin; `estimate()` estimates the scenario at the full size picked in
`full_size` (`toolkit.estimation.LAYER_SHAPES`) on fake tensors, into `estimated`. Callbacks write into widgets and
never print.

This module is the app: its layout, its callbacks and the buttons' methods. Its controls are `form`'s (made from the
configs' schema by `controls`), the work behind its buttons `actions`', what it writes into its outputs `render`'s.
"""

from __future__ import annotations

import pathlib
from typing import Any

import ipywidgets as W

from .._config import ConfigError
from ..analysis.classification import Classification, classify, describe
from ..analysis.plan import Plan, candidates
from ..analysis.plan import plan as plan_setups
from ..estimation import LAYER_SHAPES, Estimate
from ..estimation import estimate as estimate_step
from ..execution import run
from ..measurement import Report, Scenario, check_structure
from ..stacks.user import UserModelConfig, preflight, spec_of
from . import actions, display, render
from .actions import export_repro
from .form import AUTO_ORDER, FIXED, NO_RECIPE, STYLE, WIDE, Form
from .render import esc, pre, red

__all__ = ["AUTO_ORDER", "NO_RECIPE", "Explorer", "explore", "export_repro"]

# The class on the Explorer's box, which the style below is scoped to (it changes nothing else on the page).
EXPLORER_CLASS = "toolkit-explorer"
EXPLORER_CSS = (
    f".{EXPLORER_CLASS} .widget-slider .slider[disabled], .{EXPLORER_CLASS} .widget-slider .noUi-target[disabled]"
    "{opacity:0.7}"
    # A toggle-buttons label is not in an inline box, so it does not get the other labels' right alignment.
    f".{EXPLORER_CLASS} .widget-toggle-buttons > .widget-label{{text-align:right;margin-right:8px;flex:0 0 auto}}"
    f".{EXPLORER_CLASS} .widget-slider .noUi-target[disabled] .noUi-connects{{background:#a0a0a0}}"
)


class Explorer:
    """Controls → Scenario → Run → figures, graph-break table, pinned comparison, exported repro."""

    def __init__(self, scenario: Scenario | None = None):
        # The default is `Scenario()` itself, so the Explorer starts from the model notebooks describe:
        # `tk.ModelConfig()`, eager, no AC.
        self.form = Form(scenario or Scenario())
        self.controls: dict[str, W.ValueWidget] = self.form.controls
        # Buttons as wide as their text (ipywidgets' fixed 148 px cuts "Estimate at full size").
        button = W.Layout(width="auto", flex="0 0 auto")
        self.run_button = W.Button(description="Run", button_style="primary", icon="play", layout=button)
        self.pin_button = W.Button(description="Pin", icon="thumb-tack", layout=button)
        self.compare_button = W.Button(description="Compare pinned", icon="columns", layout=button)
        self.export_path = W.Text(value="repro", description="export to", style=STYLE, layout=W.Layout(**FIXED))
        self.export_button = W.Button(description="Export repro", icon="download", layout=button)
        # The same scenario at a published layer's size, estimated on fake tensors (no memory, eager or compiled).
        self.full_size = W.Dropdown(
            options=list(LAYER_SHAPES), description="full size", style=STYLE, layout=W.Layout(**WIDE)
        )
        self.estimate_button = W.Button(description="Estimate at full size", icon="calculator", layout=button)
        self.estimated = W.HTML()
        self.estimate_result: Estimate | None = None
        # Will it fit: the same full-size model, one rank of N under FSDP2, the setups that fit a budget.
        self.world_size = W.BoundedIntText(
            value=64, min=1, max=1 << 20, description="ranks", style=STYLE, layout=W.Layout(**FIXED)
        )
        self.budget = W.Text(value="80GiB", description="budget / rank", style=STYLE, layout=W.Layout(**FIXED))
        self.plan_button = W.Button(description="Will it fit?", icon="balance-scale", layout=button)
        self.planned = W.HTML()
        self.plan_result: Plan | None = None
        # What Run would run now ("ready: …"), and after a run what it ran and found ("last run: …").
        self.status = W.HTML()
        self._last_run = ""
        self.stage = W.HTML()
        self.summary = W.HTML()
        self.breaks = W.HTML()
        self.figures = W.Output()
        self.comparison = W.HTML()
        self.comparison_figures = W.Output()
        self.report: Report | None = None
        self.classification: Classification | None = None
        self.pinned: list[tuple[str, Report]] = []
        self.scenario: Scenario | None = None
        # Every run's report by its setup, so a later run finds the references `classify` compares with
        # (the same setup without AC / with full AC) when they were run before, without running them itself.
        self.history: dict[tuple, Report] = {}
        for w in self.controls.values():
            w.observe(self._validate, names="value")
        self.run_button.on_click(lambda _: self.run())
        self.pin_button.on_click(lambda _: self.pin())
        self.compare_button.on_click(lambda _: self.compare())
        self.export_button.on_click(lambda _: self._export_clicked())
        self.estimate_button.on_click(lambda _: self.estimate())
        self.plan_button.on_click(lambda _: self.plan())
        self._validate()
        self.widget = self._layout()

    def _layout(self) -> W.VBox:
        ctl = self.controls

        def row(*children: W.Widget) -> W.HBox:
            return W.HBox(list(children), layout=W.Layout(flex_flow="row wrap"))

        # The AC options, each read from the modes' configs: the checkboxes beside the mode, the rest below.
        options = [ctl[name] for name in self.form.ac_options]
        ticks = [w for w in options if isinstance(w, W.Checkbox)]
        box = W.VBox(
            [
                # ipywidgets draws a disabled slider at 35% opacity, which leaves a grey track on white barely visible.
                W.HTML(f"<style>{EXPLORER_CSS}</style>"),
                W.HTML("<b>model</b>"),
                ctl["stack"],
                row(ctl["block"], ctl["n_layers"], ctl["dim"]),
                row(ctl["n_experts"], ctl["top_k"], ctl["experts_impl"]),
                W.HTML("<b>activation checkpointing</b>"),
                row(ctl["ac_mode"], ctl["remat_policy"], *ticks),
                row(*(w for w in options if w not in ticks)),
                W.HTML("<b>compile</b>"),
                row(ctl["scope"], ctl["backend"], ctl["method"], ctl["order"]),
                row(ctl["fullgraph"], ctl["capture_scalar_outputs"], ctl["capture_dynamic_output_shape_ops"]),
                W.HTML("<b>FSDP2</b> (one gloo rank on 127.0.0.1)"),
                ctl["fsdp"],
                ctl["recipe"],
                self.status,
                row(self.run_button, self.pin_button, self.compare_button),
                row(self.export_path, self.export_button),
                row(self.full_size, self.estimate_button),
                self.stage,
                self.summary,
                self.breaks,
                self.figures,
                self.comparison,
                self.comparison_figures,
                self.estimated,
                W.HTML("<b>will it fit</b> (the full-size model above, one rank of N under FSDP2, on fake tensors)"),
                row(self.world_size, self.budget, self.plan_button),
                self.planned,
            ]
        )
        box.add_class(EXPLORER_CLASS)
        return box

    # --- state --------------------------------------------------------------------------------------------

    def build_scenario(self) -> Scenario:
        """The Scenario the controls describe (raises ConfigError naming the field when invalid)."""
        return self.form.scenario()

    def _validate(self, *_: Any) -> None:
        self.form.enable()
        # A full-size estimate builds the toolkit's or a stack's model at a published layer's shapes; yours has none.
        self.estimate_button.disabled = self.form.yours
        try:
            self.scenario = self.build_scenario()
            check_structure(self.scenario)
        except ConfigError as e:
            self.scenario = None
            self.status.value = red(f"not runnable: {esc(str(e))}") + self._last_run
            self.run_button.disabled = True
            return
        self._show_ready()
        self.run_button.disabled = False

    def _show_ready(self) -> None:
        """The status line: what Run would run now, then what the last run ran and found."""
        assert self.scenario is not None  # called only once a runnable scenario is set
        self.status.value = f"ready: {esc(self.scenario.label)}{self._last_run}"

    # --- actions ------------------------------------------------------------------------------------------

    def run(self) -> Report | None:
        """Run the scenario the controls describe; results go into the widgets (and `self.report`)."""
        self._validate()
        if self.scenario is None:
            return None
        scenario, isolate = self.scenario, actions.isolated(self.scenario)
        self.run_button.disabled = True
        self.stage.value = "running…" + (" (isolated: inductor)" if isolate else "")
        try:
            report = run(
                scenario,
                isolate=isolate,
                timeout_s=900 if isolate else None,
                on_stage=None if isolate else self._on_stage,
            )
        finally:
            self.run_button.disabled = False
        self.report = report
        self.history[actions.setup_of(scenario)] = report
        self.classification = cl = classify(report, actions.references(scenario, self.history))
        self._last_run = f"<br>last run: {esc(scenario.label)} → {esc(cl.label)}"
        self._show_ready()
        self.stage.value = render.headline_html(report, cl)
        self.summary.value = pre(describe(report, cl))
        self.breaks.value = display.breaks_html(report) if report.compile.requested else ""
        self.figures.outputs = render.run_figures(report)
        return report

    def estimate(self) -> Estimate | None:
        """The scenario the controls describe, with the model of the layer picked in `full_size`, estimated on fake
        tensors (`tk.estimate`, CUDA rounding); the result goes into `estimated` (and `self.estimate_result`), or why
        the estimate cannot follow it."""
        self._validate()
        self.estimate_result = None
        if self.scenario is None:
            self.estimated.value = red("nothing to estimate: the controls are not runnable")
            return None
        name, scenario = self.full_size.value, self.scenario
        est = actions.busy(
            self.estimate_button,
            self.estimated,
            f"estimating {name} on fake tensors",
            "cannot estimate",
            lambda: estimate_step(actions.at_full_size(scenario, name)),
        )
        self.estimate_result = est
        if est is not None:
            self.estimated.value = pre(f"{est} ({est.seconds:.0f} s)")
        return est

    def plan(self) -> Plan | None:
        """`tk.plan` for the layer picked in `full_size` at `world_size` ranks and `budget` per rank, over the setups
        on the controls' backend; the table goes into `planned` (and `self.plan_result`), or why it cannot run."""
        self._validate()
        self.plan_result = None
        if self.scenario is None:
            self.planned.value = red("nothing to plan: the controls are not runnable")
            return None
        name = self.full_size.value
        backend = self.controls["backend"].value if self.controls["backend"].value == "inductor" else "aot_eager"
        scenario = actions.to_plan(self.scenario, name)
        result = actions.busy(
            self.plan_button,
            self.planned,
            f"sizing {name} at {self.world_size.value} ranks on fake tensors",
            "cannot plan",
            lambda: plan_setups(
                scenario, budget=self.budget.value, world_size=self.world_size.value, setups=candidates((backend,))
            ),
        )
        self.plan_result = result
        if result is not None:
            self.planned.value = pre(f"{result} ({result.seconds:.0f} s)")
        return result

    @property
    def stage_text(self) -> str:
        """The status line without its markup: `done: fell_back_to_eager [silent failure] — …`."""
        import html
        import re

        return html.unescape(re.sub(r"<[^>]+>", "", self.stage.value))

    def _on_stage(self, stage: str) -> None:
        self.stage.value = f"running: {stage}…"

    def pin(self) -> None:
        if self.report is not None:
            self.pinned.append((f"#{len(self.pinned) + 1} {self.report.scenario.name}", self.report))
            self.stage.value = f"pinned {len(self.pinned)} run(s)"

    def compare(self) -> str:
        """The last two pinned runs side by side (or the last pinned one against the current run)."""
        runs = actions.to_compare(self.pinned, self.report)
        if len(runs) < 2:
            self.comparison.value = "pin two runs (or pin one and run another) to compare"
            return ""
        (na, a), (nb, b) = runs[-2], runs[-1]
        text = display.compare_text(a, b, ("A", "B"))
        self.comparison.value = pre(f"A = {na}\nB = {nb}\n\n{text}")
        self.comparison_figures.outputs = (render.figure_output(display.compare_figure(a, b, ("A", "B"))),)
        return text

    def export(self, path: str | pathlib.Path, *, overwrite: bool = False) -> tuple[pathlib.Path, pathlib.Path]:
        """Write `path.py` and `path.ipynb` that rebuild this scenario, print the environment and assert the outcome
        (`repro.export`'s rules: an existing file is kept unless `overwrite=True`)."""
        if self.report is None or self.scenario is None:
            raise RuntimeError("run a scenario before exporting it")
        return export_repro(self.scenario, self.report, path, overwrite=overwrite)

    def _export_clicked(self) -> None:
        # An exception in a button callback is shown nowhere in JupyterLab: the refusal goes to the stage line.
        try:
            py, _ = self.export(self.export_path.value)
        except (ConfigError, RuntimeError, OSError) as e:
            self.stage.value = f"not exported: {esc(str(e))}"
            return
        self.stage.value = f"exported {esc(str(py))} and its notebook"


def explore(build: Any, *, blocks: str | None = None) -> Explorer:
    """The Explorer on your own model: `build` is a function defined at the top of a .py file (or
    `"path/to/file.py:build"`, `"package.module:build"`) returning `(model, inputs)` or `(model, inputs, loss_fn)`,
    as for `tk.sweep(model=build)`; `blocks` names the blocks' class (default: found as FSDP's auto-wrap would). Its
    controls toggle the toolkit's AC and compile over those blocks. A file, function or return value that cannot be
    measured is refused here, naming the field (`ConfigError`), before any control is drawn."""
    cfg = UserModelConfig(build=spec_of(build), blocks=blocks)
    preflight(cfg)
    return Explorer(Scenario(stack="user", model=cfg))
