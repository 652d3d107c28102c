"""`Explorer`: an ipywidgets app to build a scenario, run it on a button, pin and compare runs, and export a repro.

Everything is drivable headless: set the controls' `.value`, call `run()`, read `report`, `classification`,
`stage_text` (the status line: `done: fell_back_to_eager [silent failure] — …`), `status.value`, `summary.value`;
`compare()` returns the comparison's text twin; `estimate()` estimates the scenario at the full size picked in
`full_size` (`toolkit.estimation.LAYER_SHAPES`) on fake tensors, into `estimated`. Callbacks write into widgets and
never print.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import ipywidgets as W

from .. import _escape, _files, compat
from .._config import ConfigError, literal_choices
from ..analysis.blocks import config_of, stack_of
from ..analysis.classification import Classification, classify, describe, headline, reference_scenarios
from ..analysis.plan import Plan, candidates
from ..analysis.plan import plan as plan_setups
from ..estimation import LAYER_SHAPES, Estimate
from ..estimation import estimate as estimate_step
from ..execution import run
from ..measurement import Report, Scenario, check_structure
from ..models import ModelConfig
from ..stacks import get as get_stack
from ..stacks.user import UserModelConfig, preflight, spec_of
from ..transforms import ACConfig, CompileConfig
from ..transforms.ac import MODES, MemoryBudgetAC, PerSubmoduleAC, RematAC, SelectiveLayerAC
from ..transforms.compile import BACKENDS, SCOPES
from ..transforms.fsdp import FSDP_MODES
from ..transforms.recipes import RECIPES
from . import display
from .models import choice_of, choices, sized

# ipywidgets selects nothing (and shows a blank box) for an option whose value is None, so the "not set" choices of
# `order` and `recipe` carry these strings and `build_scenario` maps them back to None.
AUTO_ORDER, NO_RECIPE = "auto", "none"
# The class on the Explorer's box, which the style below is scoped to (it changes nothing else on the page).
EXPLORER_CLASS = "toolkit-explorer"
EXPLORER_CSS = (
    f".{EXPLORER_CLASS} .widget-slider .slider[disabled], .{EXPLORER_CLASS} .widget-slider .noUi-target[disabled]"
    "{opacity:0.7}"
    # A toggle-buttons label is not in an inline box, so it does not get the other labels' right alignment.
    f".{EXPLORER_CLASS} .widget-toggle-buttons > .widget-label{{text-align:right;margin-right:8px;flex:0 0 auto}}"
    f".{EXPLORER_CLASS} .widget-slider .noUi-target[disabled] .noUi-connects{{background:#a0a0a0}}"
)


# The controls named after an ACConfig option: each is enabled, and read, only for the modes whose config has it.
AC_OPTION_CONTROLS = ("layer_every", "submodule_ac", "memory_budget", "offload")
# The controls torchtitan's own transforms have no use for (its model, its AC modes, its compile of whole blocks).
TOOLKIT_ONLY = (
    "block",
    "dim",
    "experts_impl",
    "layer_every",
    "submodule_ac",
    "memory_budget",
    "order",
    "capture_scalar_outputs",
    "capture_dynamic_output_shape_ops",
    "recipe",
)


class Explorer:
    """Controls → Scenario → Run → figures, graph-break table, pinned comparison, exported repro."""

    def __init__(self, scenario: Scenario | None = None):
        # The default is `Scenario()` itself, so the Explorer starts from the model notebooks describe:
        # `tk.ModelConfig()`, eager, no AC.
        s = scenario or Scenario()
        m, ac, c = s.model if isinstance(s.model, ModelConfig) else ModelConfig(), s.ac, s.compile
        # Another stack's model starts the sliders at its own sizes.
        size = {k: getattr(s.config, k, getattr(m, k)) for k in ("n_layers", "n_experts", "top_k")}
        style = {"description_width": "110px"}
        # A control keeps its width: a row too wide for the output area wraps to the next line rather than squeezing
        # its controls (a squeezed slider loses its track, a squeezed label is cut: issue 42's screenshots).
        fixed = W.Layout(flex="0 0 auto", width="260px")
        free = W.Layout(flex="0 0 auto", width="auto")  # a checkbox as wide as its description
        wide = W.Layout(flex="0 0 auto", width="420px")  # the controls alone on their row, whose choices are long
        # The toolkit's model, each installed stack's own, and your model beside them (`notebook/models.py`).
        stacks, stack = choices(s), choice_of(s)
        self.controls: dict[str, W.ValueWidget] = {
            "stack": W.Dropdown(options=stacks, value=stack, description="model from", style=style, layout=wide),
            # A flex box, as the other controls are, so that its label sits left of the buttons, not above them.
            "block": W.ToggleButtons(
                options=["moe", "dense"],
                value="moe" if m.has_moe else "dense",
                description="block",
                style={**style, "button_width": "64px"},
                layout=W.Layout(display="flex", flex=fixed.flex, width=fixed.width),
            ),
            "n_layers": W.IntSlider(
                value=size["n_layers"], min=1, max=8, description="layers", continuous_update=False, style=style
            ),
            "dim": W.Dropdown(
                options=[32, 64, 128, 256],
                value=m.dim if m.dim in (32, 64, 128, 256) else 64,
                description="dim",
                style=style,
                layout=fixed,
            ),
            "n_experts": W.IntSlider(
                value=size["n_experts"], min=1, max=16, description="experts", continuous_update=False, style=style
            ),
            "top_k": W.IntSlider(
                value=size["top_k"], min=1, max=8, description="top-k", continuous_update=False, style=style
            ),
            "experts_impl": W.Dropdown(
                options=list(literal_choices(ModelConfig, "experts_impl")),
                value=m.experts_impl,
                description="experts impl",
                style=style,
                layout=fixed,
            ),
            # "custom" needs a policy function, which a dropdown cannot give.
            # "remat" only where torch_remat is installed, "policy_dict" where torch has it.
            "ac_mode": W.Dropdown(
                options=[
                    mode
                    for mode in MODES
                    if mode != "custom"
                    and (mode != "remat" or compat.available("torch_remat"))
                    and (mode != "policy_dict" or compat.available("checkpoint_policy_dict"))
                ],
                value=ac.mode if ac.mode != "custom" else "none",
                description="AC mode",
                style=style,
                layout=fixed,
            ),
            "remat_policy": W.Dropdown(
                options=[("full recompute", "full"), ("torchtitan main selective", "selective")],
                value="selective" if isinstance(ac, RematAC) and ac.save_regions else "full",
                description="remat policy",
                style=style,
                layout=fixed,
            ),
            # A mode's options exist on its own config only; the controls of the other modes show their defaults.
            "layer_every": W.IntSlider(
                value=_option(ac, SelectiveLayerAC, "layer_every"), min=1, max=4, description="every N-th", style=style
            ),
            "submodule_ac": W.Dropdown(
                options=list(literal_choices(PerSubmoduleAC, "submodule_ac")),
                value=_option(ac, PerSubmoduleAC, "submodule_ac"),
                description="submodule AC",
                style=style,
                layout=fixed,
            ),
            # save_on_cpu around each checkpoint call (transformers' offload=True); any mode that checkpoints.
            "offload": W.Checkbox(
                value=bool(getattr(ac, "offload", False)),
                description="offload to host (save_on_cpu)",
                indent=False,
                layout=free,
            ),
            "memory_budget": W.FloatSlider(
                value=_option(ac, MemoryBudgetAC, "memory_budget"),
                min=0.0,
                max=1.0,
                step=0.05,
                description="budget",
                continuous_update=False,
                style=style,
                layout=fixed,
            ),
            "scope": W.Dropdown(
                options=list(SCOPES),
                value=c.scope if isinstance(c.scope, str) else "none",
                description="compile scope",
                style=style,
                layout=fixed,
            ),
            "backend": W.Dropdown(
                options=list(BACKENDS),
                value=c.backend if isinstance(c.backend, str) else "aot_eager",
                description="backend",
                style=style,
                layout=fixed,
            ),
            "fullgraph": W.Checkbox(value=c.fullgraph, description="fullgraph", layout=free),
            "order": W.Dropdown(
                options=[
                    ("as the scope implies", AUTO_ORDER),
                    ("compile(AC(x))", "compile_outside"),
                    ("AC(compile(x))", "ac_outside"),
                ],
                value=c.order or AUTO_ORDER,
                description="order",
                style=style,
                layout=wide,
            ),
            # How a target is compiled: in place (torchtitan's), the wrapper most users call, or its forward only.
            "method": W.Dropdown(
                options=[
                    ("module.compile()", "module_compile"),
                    ("torch.compile(module)", "torch_compile"),
                    ("forward only", "forward"),
                ],
                value=c.method,
                description="how",
                style=style,
                layout=fixed,
            ),
            "capture_scalar_outputs": W.Checkbox(
                value=c.capture_scalar_outputs, description="capture scalars", layout=free
            ),
            "capture_dynamic_output_shape_ops": W.Checkbox(
                value=c.capture_dynamic_output_shape_ops, description="capture dynamic shapes", layout=free
            ),
            "recipe": W.Dropdown(
                options=[("(none: use the controls)", NO_RECIPE)]
                + [(k, k) for k, r in RECIPES.items() if r.missing() is None],
                value=s.recipe or NO_RECIPE,
                description="recipe",
                style=style,
                layout=wide,
            ),
            "fsdp": W.Dropdown(options=list(FSDP_MODES), value=s.fsdp, description="FSDP2", style=style, layout=fixed),
        }
        # Buttons as wide as their text (ipywidgets' fixed 148 px cuts "Estimate at full size").
        button = W.Layout(width="auto", flex="0 0 auto")
        self.run_button = W.Button(description="Run", button_style="primary", icon="play", layout=button)
        self.pin_button = W.Button(description="Pin", icon="thumb-tack", layout=button)
        self.compare_button = W.Button(description="Compare pinned", icon="columns", layout=button)
        self.export_path = W.Text(value="repro", description="export to", style=style, layout=fixed)
        self.export_button = W.Button(description="Export repro", icon="download", layout=button)
        # The same scenario at a published layer's size, estimated on fake tensors (no memory, eager or compiled).
        self.full_size = W.Dropdown(options=list(LAYER_SHAPES), description="full size", style=style, layout=wide)
        self.estimate_button = W.Button(description="Estimate at full size", icon="calculator", layout=button)
        self.estimated = W.HTML()
        self.estimate_result: Estimate | None = None
        # Will it fit: the same full-size model, one rank of N under FSDP2, the setups that fit a budget.
        self.world_size = W.BoundedIntText(value=64, min=1, max=1 << 20, description="ranks", style=style, layout=fixed)
        self.budget = W.Text(value="80GiB", description="budget / rank", style=style, layout=fixed)
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
        ctl = self.controls

        def row(*children: W.Widget) -> W.HBox:
            return W.HBox(list(children), layout=W.Layout(flex_flow="row wrap"))

        self.widget = W.VBox(
            [
                # ipywidgets draws a disabled slider at 35% opacity, which leaves a grey track on white barely visible.
                W.HTML(f"<style>{EXPLORER_CSS}</style>"),
                W.HTML("<b>model</b>"),
                ctl["stack"],
                row(ctl["block"], ctl["n_layers"], ctl["dim"]),
                row(ctl["n_experts"], ctl["top_k"], ctl["experts_impl"]),
                W.HTML("<b>activation checkpointing</b>"),
                row(ctl["ac_mode"], ctl["remat_policy"], ctl["offload"]),
                row(ctl["layer_every"], ctl["submodule_ac"], ctl["memory_budget"]),
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
        self.widget.add_class(EXPLORER_CLASS)

    # --- state --------------------------------------------------------------------------------------------

    def build_scenario(self) -> Scenario:
        """The Scenario the controls describe (raises ConfigError naming the field when invalid)."""
        v = {k: w.value for k, w in self.controls.items()}
        if stack_of(v["stack"]) == "user":
            # Your model as your build() returns it (its sizes are its own), the toolkit's AC and compile on its blocks.
            cfg = config_of(v["stack"])
            return Scenario(stack="user", model=cfg, ac=_ac_from(v), compile=_compile_from(v))
        if v["stack"] != "toolkit":
            # Another stack's own model at the Explorer's size, with its own AC and compile (`models.sized`).
            name = stack_of(v["stack"])
            st = get_stack(name)
            cfg = sized(v["stack"], n_layers=v["n_layers"], n_experts=v["n_experts"], top_k=v["top_k"])
            comp = CompileConfig.of(v["scope"], backend=v["backend"], fullgraph=v["fullgraph"], method=v["method"])
            return Scenario(stack=name, **{st.config_field: cfg}, ac=_ac_from(v), compile=comp, fsdp=v["fsdp"])
        recipe = None if v["recipe"] == NO_RECIPE else v["recipe"]
        model = ModelConfig(
            n_layers=v["n_layers"],
            dim=v["dim"],
            n_heads=4,
            moe_layers="all" if v["block"] == "moe" else "none",
            n_experts=v["n_experts"],
            top_k=v["top_k"],
            experts_impl=v["experts_impl"],
            moe_hidden=v["dim"],
            ffn_hidden=2 * v["dim"],
        )
        if recipe:
            # The recipe's own rules for its model (its era's layout, dtype, stand-in FSDP hook), as the matrix uses.
            return Scenario(
                model=RECIPES[recipe].model_config(model, fsdp=v["fsdp"]),
                recipe=recipe,
                recipe_backend=v["backend"],
                fsdp=v["fsdp"],
            )
        ac = ACConfig.remat_selective() if v["ac_mode"] == "remat" and v["remat_policy"] == "selective" else _ac_from(v)
        comp = _compile_from(
            v,
            capture_scalar_outputs=v["capture_scalar_outputs"],
            capture_dynamic_output_shape_ops=v["capture_dynamic_output_shape_ops"],
        )
        return Scenario(model=model, ac=ac, compile=comp, fsdp=v["fsdp"])

    def _validate(self, *_: Any) -> None:
        ctl = self.controls
        recipe = ctl["recipe"].value != NO_RECIPE
        for name in (
            "ac_mode",
            "layer_every",
            "submodule_ac",
            "memory_budget",
            "remat_policy",
            "scope",
            "fullgraph",
            "order",
            "method",
            "capture_scalar_outputs",
            "capture_dynamic_output_shape_ops",
        ):
            ctl[name].disabled = recipe
        mode = ctl["ac_mode"].value
        for name in AC_OPTION_CONTROLS:
            ctl[name].disabled = recipe or name not in MODES[mode].options()
        ctl["remat_policy"].disabled = recipe or mode != "remat"
        moe = ctl["block"].value == "moe"
        for name in ("n_experts", "top_k", "experts_impl"):
            ctl[name].disabled = not moe
        if ctl["stack"].value != "toolkit":
            for name in TOOLKIT_ONLY:
                ctl[name].disabled = True
            for name in ("ac_mode", "scope", "fullgraph", "method", "n_experts", "top_k"):
                ctl[name].disabled = False
            for name in ("layer_every", "offload"):  # transformers' every_n_layers and offload
                ctl[name].disabled = name not in MODES[mode].options()
        user = stack_of(ctl["stack"].value) == "user"
        if user:  # its build() sets its sizes; the toolkit's AC modes and both orders apply to its blocks
            for name in ("n_layers", "n_experts", "top_k", "fsdp"):
                ctl[name].disabled = True
            for name in ("order", "memory_budget", "layer_every"):
                ctl[name].disabled = name != "order" and name not in MODES[mode].options()
        # A full-size estimate builds the toolkit's or a stack's model at a published layer's shapes; yours has none.
        self.estimate_button.disabled = user
        try:
            self.scenario = self.build_scenario()
            check_structure(self.scenario)
        except ConfigError as e:
            self.scenario = None
            self.status.value = f"<span style='color:#b30000'>not runnable: {_esc(str(e))}</span>{self._last_run}"
            self.run_button.disabled = True
            return
        self._show_ready()
        self.run_button.disabled = False

    def _show_ready(self) -> None:
        """The status line: what Run would run now, then what the last run ran and found."""
        assert self.scenario is not None  # called only once a runnable scenario is set
        self.status.value = f"ready: {_esc(self.scenario.label)}{self._last_run}"

    # --- actions ------------------------------------------------------------------------------------------

    def run(self) -> Report | None:
        """Run the scenario the controls describe; results go into the widgets (and `self.report`)."""
        self._validate()
        if self.scenario is None:
            return None
        isolate = (
            self.scenario.recipe_backend == "inductor"
            if self.scenario.recipe
            else self.scenario.compile.backend == "inductor"
        )
        self.run_button.disabled = True
        self.stage.value = "running…" + (" (isolated: inductor)" if isolate else "")
        try:
            report = run(
                self.scenario,
                isolate=isolate,
                timeout_s=900 if isolate else None,
                on_stage=None if isolate else self._on_stage,
            )
        finally:
            self.run_button.disabled = False
        self.report = report
        self.history[_setup(self.scenario)] = report
        refs = {
            key: self.history[_setup(ref)]
            for key, ref in reference_scenarios(self.scenario).items()
            if _setup(ref) in self.history
        }
        self.classification = cl = classify(report, refs)
        color = "#1e8449" if cl.label == "works" else "#b30000"
        self._last_run = f"<br>last run: {_esc(self.scenario.label)} → {_esc(cl.label)}"
        self._show_ready()
        self.stage.value = f"<span style='color:{color}'><b>{_esc(headline(report, cl, title='done'))}</b></span>"
        self.summary.value = _pre(describe(report, cl))
        self.breaks.value = display.breaks_html(report) if report.compile.requested else ""
        self.figures.outputs = ()
        if report.ok:
            figs = [
                display.saved_figure(report, by="module"),
                display.saved_figure(report, by="op"),
                display.memory_figure({"this run": report}),
            ]
            if report.recompute.ops:
                figs.append(display.recompute_figure(report))
            self.figures.outputs = tuple(_figure_output(fig) for fig in figs)
        return report

    def estimate(self) -> Estimate | None:
        """The scenario the controls describe, with the model of the layer picked in `full_size`, estimated on fake
        tensors (`tk.estimate`, CUDA rounding); the result goes into `estimated` (and `self.estimate_result`), or why
        the estimate cannot follow it."""
        self._validate()
        self.estimate_result = None
        if self.scenario is None:
            self.estimated.value = (
                "<span style='color:#b30000'>nothing to estimate: the controls are not runnable</span>"
            )
            return None
        name, scenario = self.full_size.value, self.scenario

        def work() -> Estimate:
            model = LAYER_SHAPES[name]
            if scenario.recipe is not None:  # the recipe's own rules for its model (layout, dtype), as for a run
                model = RECIPES[scenario.recipe].model_config(model, fsdp=scenario.fsdp)
            return estimate_step(dataclasses.replace(scenario, model=model, name=name))

        est = _busy(self.estimate_button, self.estimated, f"estimating {name} on fake tensors", "cannot estimate", work)
        self.estimate_result = est
        if est is not None:
            self.estimated.value = _pre(f"{est} ({est.seconds:.0f} s)")
        return est

    def plan(self) -> Plan | None:
        """`tk.plan` for the layer picked in `full_size` at `world_size` ranks and `budget` per rank, over the setups
        on the controls' backend; the table goes into `planned` (and `self.plan_result`), or why it cannot run."""
        self._validate()
        self.plan_result = None
        if self.scenario is None:
            self.planned.value = "<span style='color:#b30000'>nothing to plan: the controls are not runnable</span>"
            return None
        name = self.full_size.value
        backend = self.controls["backend"].value if self.controls["backend"].value == "inductor" else "aot_eager"
        scenario = dataclasses.replace(self.scenario, model=LAYER_SHAPES[name], name=name, recipe=None)
        result = _busy(
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
            self.planned.value = _pre(f"{result} ({result.seconds:.0f} s)")
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
        runs = list(self.pinned[-2:])
        if len(runs) < 2 and self.report is not None and (not runs or runs[-1][1] is not self.report):
            runs.append(("current", self.report))
        if len(runs) < 2:
            self.comparison.value = "pin two runs (or pin one and run another) to compare"
            return ""
        (na, a), (nb, b) = runs[-2], runs[-1]
        text = display.compare_text(a, b, ("A", "B"))
        self.comparison.value = _pre(f"A = {na}\nB = {nb}\n\n{text}")
        self.comparison_figures.outputs = (_figure_output(display.compare_figure(a, b, ("A", "B"))),)
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
            self.stage.value = f"not exported: {_esc(str(e))}"
            return
        self.stage.value = f"exported {_esc(str(py))} and its notebook"


def explore(build: Any, *, blocks: str | None = None) -> Explorer:
    """The Explorer on your own model: `build` is a function defined at the top of a .py file (or
    `"path/to/file.py:build"`, `"package.module:build"`) returning `(model, inputs)` or `(model, inputs, loss_fn)`,
    as for `tk.sweep(model=build)`; `blocks` names the blocks' class (default: found as FSDP's auto-wrap would). Its
    controls toggle the toolkit's AC and compile over those blocks. A file, function or return value that cannot be
    measured is refused here, naming the field (`ConfigError`), before any control is drawn."""
    cfg = UserModelConfig(build=spec_of(build), blocks=blocks)
    preflight(cfg)
    return Explorer(Scenario(stack="user", model=cfg))


def export_repro(
    scenario: Scenario, report: Report, path: str | pathlib.Path, *, overwrite: bool = False
) -> tuple[pathlib.Path, pathlib.Path]:
    """A standalone `.py` and `.ipynb` reproducing `scenario` and asserting the outcome `report` observed."""
    from ..bugs.repro import export

    bundle = export(report, path, scenario=scenario, overwrite=overwrite)
    return bundle.script, bundle.notebook


def _busy(button: W.Button, out: W.HTML, doing: str, refused: str, work: Any) -> Any:
    """Run `work()` with `button` disabled and `out` saying what is being done; a ConfigError is said in `out` (None
    returned), never raised into the notebook."""
    button.disabled = True
    out.value = f"{_esc(doing)}…"
    try:
        return work()
    except ConfigError as e:
        out.value = f"<span style='color:#b30000'>{refused}: {_esc(str(e))}</span>"
        return None
    finally:
        button.disabled = False


def _ac_from(v: dict[str, Any]) -> ACConfig:
    """The AC controls as an ACConfig: the mode, and only the options that mode reads (its config says which)."""
    mode = v["ac_mode"]
    return ACConfig.of(mode=mode, **{name: v[name] for name in AC_OPTION_CONTROLS if name in MODES[mode].options()})


def _compile_from(v: dict[str, Any], **more: Any) -> CompileConfig:
    """The compile controls as a CompileConfig ("as the scope implies" is no order)."""
    return CompileConfig(
        scope=v["scope"],
        backend=v["backend"],
        fullgraph=v["fullgraph"],
        order=None if v["order"] == AUTO_ORDER else v["order"],
        method=v["method"],
        **more,
    )


def _option(ac: ACConfig, mode: type[ACConfig], name: str) -> Any:
    """`ac`'s value of a mode option when `ac` is that mode's config, else the mode's default."""
    return getattr(ac, name) if isinstance(ac, mode) else getattr(mode(), name)


def _setup(scenario: Scenario) -> tuple:
    """What makes two scenarios the same measurement, whatever their names and extra steps."""
    return (
        scenario.stack,
        scenario.config,
        scenario.ac,
        scenario.compile,
        scenario.recipe,
        scenario.recipe_backend,
        scenario.fsdp,
    )


def _figure_output(fig) -> dict:
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


def _pre(text: str) -> str:
    """Monospace text that keeps its lines: JupyterLab wraps a `<pre>` anywhere, mid-word ("lay / ers.1"); a long
    line scrolls sideways instead."""
    return f"<pre style='white-space:pre;overflow-x:auto;word-break:normal'>{_esc(text)}</pre>"


def _esc(text: str) -> str:
    return _escape.html(text)
