"""The work behind the Explorer's buttons, apart from its widgets: whether a run is isolated, the earlier runs a run is
classified against, the scenario at a full size, the two runs to compare, a repro bundle, and `busy` (a button's
work with the button disabled and a refusal said in its output, never raised into the notebook)."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Callable, TypeVar

import ipywidgets as W

from .._config import ConfigError
from ..analysis.classification import reference_scenarios
from ..estimation import LAYER_SHAPES
from ..measurement import Report, Scenario
from ..transforms.recipes import RECIPES
from .render import esc, red

_T = TypeVar("_T")


def busy(button: W.Button, out: W.HTML, doing: str, refused: str, work: Callable[[], _T]) -> _T | None:
    """Run `work()` with `button` disabled and `out` saying what is being done; a ConfigError is said in `out` (None
    returned), never raised into the notebook."""
    button.disabled = True
    out.value = f"{esc(doing)}…"
    try:
        return work()
    except ConfigError as e:
        out.value = red(f"{refused}: {esc(str(e))}")
        return None
    finally:
        button.disabled = False


def isolated(scenario: Scenario) -> bool:
    """The run goes to a subprocess of its own: inductor's (the recipe's backend, or the compile's)."""
    backend = scenario.recipe_backend if scenario.recipe else scenario.compile.backend
    return backend == "inductor"


def setup_of(scenario: Scenario) -> tuple:
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


def references(scenario: Scenario, history: dict[tuple, Report]) -> dict[str, Report]:
    """The runs `classify` compares `scenario`'s with (the same setup without AC / with full AC) that were run
    before, by their key: never run for it."""
    return {
        key: history[setup_of(ref)] for key, ref in reference_scenarios(scenario).items() if setup_of(ref) in history
    }


def at_full_size(scenario: Scenario, name: str) -> Scenario:
    """`scenario` with the model of the layer `name` (`LAYER_SHAPES`), under a recipe's own rules for its model
    (layout, dtype), as for a run."""
    model = LAYER_SHAPES[name]
    if scenario.recipe is not None:
        model = RECIPES[scenario.recipe].model_config(model, fsdp=scenario.fsdp)
    return dataclasses.replace(scenario, model=model, name=name)


def to_plan(scenario: Scenario, name: str) -> Scenario:
    """`scenario` with the model of the layer `name`, the setups `plan` tries in place of its AC and compile."""
    return dataclasses.replace(scenario, model=LAYER_SHAPES[name], name=name, recipe=None)


def to_compare(pinned: list[tuple[str, Report]], current: Report | None) -> list[tuple[str, Report]]:
    """The last two pinned runs, or the last pinned one and the current run (fewer than two: nothing to compare)."""
    runs = list(pinned[-2:])
    if len(runs) < 2 and current is not None and (not runs or runs[-1][1] is not current):
        runs.append(("current", current))
    return runs


def export_repro(
    scenario: Scenario, report: Report, path: str | pathlib.Path, *, overwrite: bool = False
) -> tuple[pathlib.Path, pathlib.Path]:
    """A standalone `.py` and `.ipynb` reproducing `scenario` and asserting the outcome `report` observed."""
    from ..bugs.repro import export

    bundle = export(report, path, scenario=scenario, overwrite=overwrite)
    return bundle.script, bundle.notebook
