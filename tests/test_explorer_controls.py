"""The Explorer's controls are made from the configs' schema (`toolkit.notebook.controls`): a widget per field from its
annotation and default, read back through the config's own constructor; a new option of an AC mode is a new control."""

from dataclasses import dataclass
from typing import Literal

import ipywidgets as W
import pytest

from toolkit._config import ConfigError, check_int
from toolkit.notebook.controls import Look, fields, make, presentable
from toolkit.notebook.widgets import Explorer
from toolkit.transforms.ac import MODES, SelectiveLayerAC


@dataclass(frozen=True, kw_only=True)
class Demo:
    kind: Literal["a", "b"] = "a"
    maybe: Literal["x", "y"] | None = None
    on: bool = False
    count: int = 3
    share: float = 0.5
    names: tuple[str, ...] = ("p", "q")
    width: int | None = None


def test_each_annotation_gets_its_widget_and_reads_back_into_the_config():
    ctl = {f: make(Demo, f, getattr(Demo(), f)) for f in ("kind", "maybe", "on", "count", "share", "names")}
    assert [type(w) for w in ctl.values()] == [W.Dropdown, W.Dropdown, W.Checkbox, W.IntText, W.FloatText, W.Text]
    assert ctl["kind"].options == ("a", "b") and ctl["names"].value == "p, q"
    assert ctl["maybe"].value == "(not set)" and ctl["maybe"].label == "(not set)"  # never a blank choice
    assert Demo(**fields(Demo, ctl, {}, ctl)) == Demo()
    ctl["maybe"].value, ctl["on"].value, ctl["count"].value, ctl["names"].value = "y", True, 7, " r,, s "
    assert Demo(**fields(Demo, ctl, {}, ctl)) == Demo(maybe="y", on=True, count=7, names=("r", "s"))
    assert not presentable(Demo, "width")  # no widget holds "not set" for a number
    # A look: the label, a slider's bounds, labelled choices with None as one of them, a value not offered → default.
    slider = make(Demo, "count", 3, Look("how many", slider=(1, 4)))
    assert isinstance(slider, W.IntSlider) and (slider.min, slider.max, slider.description) == (1, 4, "how many")
    labelled = make(Demo, "maybe", "z", Look(names={"x": "ex"}, unset=("auto", "auto")))
    assert labelled.options == (("auto", "auto"), ("ex", "x"), ("y", "y")) and labelled.value == "auto"


def test_a_new_option_of_an_ac_mode_is_a_new_control_checked_by_its_config(monkeypatch):
    """The Explorer reads the AC options from the modes' classes: an option added to a mode gets its control (from its
    annotation), enabled for that mode only, read into that mode's config, whose own check refuses a bad value."""

    @dataclass(frozen=True, kw_only=True)
    class WithKnob(SelectiveLayerAC):
        knob: int = 1

        def __post_init__(self) -> None:
            super().__post_init__()
            check_int("ACConfig", "knob", self.knob, 1)

    monkeypatch.setitem(MODES, "selective_layer", WithKnob)
    ex = Explorer()
    c = ex.controls
    assert isinstance(c["knob"], W.IntText) and c["knob"].value == 1 and c["knob"].disabled
    c["n_layers"].value, c["ac_mode"].value = 4, "selective_layer"
    assert not c["knob"].disabled and ex.scenario.ac == WithKnob(knob=1)
    c["knob"].value = 3
    assert ex.scenario.ac == WithKnob(knob=3)
    c["knob"].value = 0
    assert ex.scenario is None and ex.run_button.disabled and "ACConfig.knob" in ex.status.value
    with pytest.raises(ConfigError, match="ACConfig.knob"):
        ex.build_scenario()
    c["ac_mode"].value = "full"  # full AC's config has no knob: not handed it
    assert c["knob"].disabled and ex.scenario.ac.mode == "full"
