"""The Explorer's controls, as a `Form`: made for a Scenario, read back into one (`scenario`), and each enabled where
that scenario reads it (`enable`).

Each control is a config field's, made from the schema by `controls` (ModelConfig's sizes, the AC mode and its
options, CompileConfig, Scenario's recipe and FSDP2), or one of the Explorer's own (whose model, its block, the remat
policy). The AC options shown are read from the modes' classes (`MODES[mode].options()`): every option of an offered
mode that a control can show is one, but those in `LEFT_AT_DEFAULT`, enabled for the modes that read it. Adding an
option to a mode adds its control; the config's constructor checks what it is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ipywidgets as W

from .._config import ConfigError, field_default
from ..analysis.blocks import config_of, stack_of
from ..measurement import Scenario
from ..models import ModelConfig
from ..stacks import get as get_stack
from ..transforms import ACConfig, CompileConfig
from ..transforms.ac import MODES, RematAC
from ..transforms.compile import AC_OUTSIDE, BACKENDS, COMPILE_OUTSIDE
from ..transforms.recipes import RECIPES
from .controls import Look, fields, make, presentable, read
from .models import choice_of, choices, sized

# ipywidgets selects nothing (and shows a blank box) for an option whose value is None, so the "not set" choices of
# `order` and `recipe` carry these strings and `Form.scenario` reads them back as None.
AUTO_ORDER, NO_RECIPE = "auto", "none"

# A control keeps its width: a row too wide for the output area wraps to the next line rather than squeezing its
# controls (a squeezed slider loses its track, a squeezed label is cut: issue 42's screenshots). W.Layout's keywords.
STYLE = {"description_width": "110px"}
FIXED = {"flex": "0 0 auto", "width": "260px"}
FREE = {"flex": "0 0 auto", "width": "auto"}  # a checkbox as wide as its description
WIDE = {"flex": "0 0 auto", "width": "420px"}  # the controls alone on their row, whose choices are long


def _box(label: str | None, layout: Mapping[str, str] = FIXED, **look: Any) -> Look:
    """A labelled control of fixed width (a dropdown, a text box, a budget slider)."""
    return Look(label, widget={"style": STYLE, "layout": layout}, **look)


def _tick(label: str | None = None, **widget: Any) -> Look:
    """A checkbox as wide as its description."""
    return Look(label, widget={"layout": FREE, **widget})


# The ModelConfig fields the Explorer sets (the rest: `Form.scenario`'s, and ModelConfig's defaults).
MODEL = {
    "n_layers": Look("layers", slider=(1, 8), widget={"style": STYLE}),
    "dim": _box("dim", choices=(32, 64, 128, 256)),
    "n_experts": Look("experts", slider=(1, 16), widget={"style": STYLE}),
    "top_k": Look("top-k", slider=(1, 8), widget={"style": STYLE}),
    "experts_impl": _box("experts impl"),
}
# The sizes another stack's model takes from the Explorer (`Stack.sized`), and starts them at.
SIZES = ("n_layers", "n_experts", "top_k")

# How the AC options look; an option not named here gets a plain labelled control.
AC_LOOKS = {
    "layer_every": Look("every N-th", slider=(1, 4), widget={"style": STYLE}),
    "submodule_ac": _box("submodule AC"),
    # save_on_cpu around each checkpoint call (transformers' offload=True); any mode that checkpoints.
    "offload": _tick("offload to host (save_on_cpu)", indent=False),
    "memory_budget": _box("budget", slider=(0.0, 1.0, 0.05)),
}
# The AC options the Explorer leaves at each mode's default, and why.
_SWITCH = (
    "a switch of torch.utils.checkpoint (torch_remat's for remat) at each mode's own default: one control shared by "
    "the modes would carry one mode's default into another (remat's preserve_rng_state is False, as in main)"
)
LEFT_AT_DEFAULT = {
    "preserve_rng_state": _SWITCH,
    "early_stop": _SWITCH,
    "determinism_check": _SWITCH,
    "debug": _SWITCH,
    "wrap_inductor_compiled_regions": "an inductor option that most torch releases lack",
    "save_regions": "main's two fixed remat policies are `remat_policy`'s choices",
    "recompute_regions": "main's two fixed remat policies are `remat_policy`'s choices",
    "policy_save": "the dict policy's keys, at their default",
}
# The AC options other stacks' own AC takes (transformers' every_n_layers and offload); your model's blocks take the
# toolkit's, but per-submodule AC, which names the toolkit's own submodules.
OTHER_STACKS_AC = ("layer_every", "offload")
NOT_ON_YOUR_BLOCKS = ("submodule_ac",)

COMPILE = {
    "scope": _box("compile scope"),
    "backend": _box("backend", choices=BACKENDS),
    "method": _box(
        "how",
        # How a target is compiled: in place (torchtitan's), the wrapper most users call, or its forward only.
        names={
            "module_compile": "module.compile()",
            "torch_compile": "torch.compile(module)",
            "forward": "forward only",
        },
    ),
    "order": _box(
        "order",
        WIDE,
        names={"compile_outside": COMPILE_OUTSIDE, "ac_outside": AC_OUTSIDE},
        unset=("as the scope implies", AUTO_ORDER),
    ),
    "fullgraph": _tick(),
    "capture_scalar_outputs": _tick("capture scalars"),
    "capture_dynamic_output_shape_ops": _tick("capture dynamic shapes"),
}
# What the toolkit's own stack reads beyond what your model's does.
CAPTURE = ("capture_scalar_outputs", "capture_dynamic_output_shape_ops")
# What another stack's compile takes (`CompileConfig.of`: the options only when something is compiled).
OTHER_STACKS_COMPILE = ("backend", "fullgraph", "method")

RECIPE = _box("recipe", WIDE, choices=tuple(RECIPES), unset=("(none: use the controls)", NO_RECIPE))
FSDP = _box("FSDP2")

# The controls torchtitan's and transformers' own transforms have no use for (beside the AC options they do not take).
TOOLKIT_ONLY = ("block", "dim", "experts_impl", "order", *CAPTURE, "recipe")


def offered_modes() -> tuple[str, ...]:
    """The AC modes whose config builds from its defaults: not "custom" (a policy function, which a dropdown cannot
    give), "remat" only where torch_remat is installed, "policy_dict" where torch has it."""
    out = []
    for mode, config in MODES.items():
        try:
            config()
        except ConfigError:
            continue
        out.append(mode)
    return tuple(out)


def ac_options(modes: tuple[str, ...]) -> dict[str, type[ACConfig]]:
    """Each AC option of `modes` a control shows (not `LEFT_AT_DEFAULT`), with the first mode's config that reads
    it (its annotation and default), in the modes' order."""
    out: dict[str, type[ACConfig]] = {}
    for mode in modes:
        for name in MODES[mode].options():
            if name not in out and name not in LEFT_AT_DEFAULT and presentable(MODES[mode], name):
                out[name] = MODES[mode]
    return out


class Form:
    """The Explorer's controls (`controls`: name → widget), started from a Scenario."""

    def __init__(self, s: Scenario):
        m, ac, c = s.model if isinstance(s.model, ModelConfig) else ModelConfig(), s.ac, s.compile
        ctl: dict[str, W.ValueWidget] = {"stack": _stack_control(s)}
        # A flex box, as the other controls are, so that its label sits left of the buttons, not above them.
        ctl["block"] = W.ToggleButtons(
            options=["moe", "dense"],
            value="moe" if m.has_moe else "dense",
            description="block",
            style={**STYLE, "button_width": "64px"},
            layout=W.Layout(display="flex", **FIXED),
        )
        for name, look in MODEL.items():
            # Another stack's model starts the sliders at its own sizes.
            value = getattr(s.config, name, getattr(m, name)) if name in SIZES else getattr(m, name)
            ctl[name] = make(ModelConfig, name, value, look)
        modes = offered_modes()
        ctl["ac_mode"] = make(ACConfig, "mode", ac.mode, _box("AC mode", choices=modes))
        ctl["remat_policy"] = W.Dropdown(
            options=[("full recompute", "full"), ("torchtitan main selective", "selective")],
            value="selective" if isinstance(ac, RematAC) and ac.save_regions else "full",
            description="remat policy",
            style=STYLE,
            layout=W.Layout(**FIXED),
        )
        for name, look in COMPILE.items():
            ctl[name] = make(CompileConfig, name, getattr(c, name), look)
        recipes = tuple(k for k, r in RECIPES.items() if r.missing() is None)
        ctl["recipe"] = make(Scenario, "recipe", s.recipe, dataclasses.replace(RECIPE, choices=recipes))
        ctl["fsdp"] = make(Scenario, "fsdp", s.fsdp, FSDP)
        self.ac_options = ac_options(modes)
        """Each AC option shown → the config whose annotation made its control."""
        for name, config in self.ac_options.items():
            if name in ctl:
                raise TypeError(f"the AC option {name!r} has the name of another of the Explorer's controls")
            # A mode's options exist on its own config only; the controls of the other modes show their defaults.
            value = getattr(ac, name) if name in type(ac).options() else field_default(config, name)
            ctl[name] = make(config, name, value, AC_LOOKS.get(name, _box(None)))
        self.controls = ctl

    @property
    def yours(self) -> bool:
        """The model is yours (`tk.explore`)."""
        return stack_of(self.controls["stack"].value) == "user"

    def scenario(self) -> Scenario:
        """The Scenario the controls describe (raises ConfigError naming the field when invalid)."""
        ctl = self.controls
        stack = ctl["stack"].value
        if self.yours:
            # Your model as your build() returns it (its sizes are its own), the toolkit's AC and compile on its blocks.
            cfg = config_of(stack)
            comp = CompileConfig(**fields(CompileConfig, ctl, COMPILE, (n for n in COMPILE if n not in CAPTURE)))
            return Scenario(stack="user", model=cfg, ac=self._ac(), compile=comp)
        if stack != "toolkit":
            # Another stack's own model at the Explorer's size, with its own AC and compile (`models.sized`).
            name = stack_of(stack)
            st = get_stack(name)
            cfg = sized(stack, **fields(ModelConfig, ctl, MODEL, SIZES))
            comp = CompileConfig.of(ctl["scope"].value, **fields(CompileConfig, ctl, COMPILE, OTHER_STACKS_COMPILE))
            return Scenario(stack=name, **{st.config_field: cfg}, ac=self._ac(), compile=comp, fsdp=ctl["fsdp"].value)
        dim = ctl["dim"].value
        model = ModelConfig(
            **fields(ModelConfig, ctl, MODEL, MODEL),
            n_heads=4,
            moe_layers="all" if ctl["block"].value == "moe" else "none",
            moe_hidden=dim,
            ffn_hidden=2 * dim,
        )
        recipe = read(Scenario, "recipe", ctl["recipe"], RECIPE)
        if recipe:
            # The recipe's own rules for its model (its era's layout, dtype, stand-in FSDP hook), as the matrix uses.
            return Scenario(
                model=RECIPES[recipe].model_config(model, fsdp=ctl["fsdp"].value),
                recipe=recipe,
                recipe_backend=ctl["backend"].value,
                fsdp=ctl["fsdp"].value,
            )
        remat_selective = ctl["ac_mode"].value == "remat" and ctl["remat_policy"].value == "selective"
        ac = ACConfig.remat_selective() if remat_selective else self._ac()
        comp = CompileConfig(**fields(CompileConfig, ctl, COMPILE, COMPILE))
        return Scenario(model=model, ac=ac, compile=comp, fsdp=ctl["fsdp"].value)

    def _ac(self) -> ACConfig:
        """The AC controls as an ACConfig: the mode, and only the options that mode reads (its config says which)."""
        mode = self.controls["ac_mode"].value
        own = MODES[mode]
        names = [name for name in own.options() if name in self.ac_options]
        return ACConfig.of(mode=mode, **fields(own, self.controls, AC_LOOKS, names))

    def enable(self) -> None:
        """Each control enabled where the scenario reads it: a recipe's AC and compile are its own, a mode's options
        are its own, a dense block has no experts, another stack's model has its own transforms, yours its sizes."""
        ctl = self.controls
        recipe = ctl["recipe"].value != NO_RECIPE
        mode = ctl["ac_mode"].value
        reads = MODES[mode].options()
        for name in ("ac_mode", *COMPILE):
            ctl[name].disabled = recipe and name != "backend"  # the recipe's backend stays a choice
        for name in self.ac_options:
            ctl[name].disabled = recipe or name not in reads
        ctl["remat_policy"].disabled = recipe or mode != "remat"
        moe = ctl["block"].value == "moe"
        for name in ("n_experts", "top_k", "experts_impl"):
            ctl[name].disabled = not moe
        if ctl["stack"].value != "toolkit":
            for name in TOOLKIT_ONLY:
                ctl[name].disabled = True
            for name in ("ac_mode", "scope", "fullgraph", "method", "n_experts", "top_k"):
                ctl[name].disabled = False
            for name in self.ac_options:
                ctl[name].disabled = name not in OTHER_STACKS_AC or name not in reads
        if self.yours:  # its build() sets its sizes; the toolkit's AC modes and both orders apply to its blocks
            for name in ("n_layers", "n_experts", "top_k", "fsdp"):
                ctl[name].disabled = True
            ctl["order"].disabled = False
            for name in self.ac_options:
                ctl[name].disabled = name in NOT_ON_YOUR_BLOCKS or name not in reads


def _stack_control(s: Scenario) -> W.Dropdown:
    """Whose model: the toolkit's, each installed stack's own, and yours beside them (`notebook/models.py`)."""
    return W.Dropdown(
        options=choices(s), value=choice_of(s), description="model from", style=STYLE, layout=W.Layout(**WIDE)
    )
