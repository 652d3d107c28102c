"""What an estimate reads of a scenario: the `ScenarioLike` protocol, and `BareModel`, the one a ModelConfig makes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .._config import PlainData
from ..models import ModelConfig
from ..transforms import ACConfig, CompileConfig
from ..transforms.compile import check_ac_compile
from ..transforms.fsdp import FsdpMode


@runtime_checkable
class ScenarioLike(Protocol):
    """The fields and methods of `tk.Scenario` an estimate reads, and nothing else: a Scenario is one, as is
    `BareModel`; the estimation layer never imports the Scenario class."""

    @property
    def stack(self) -> str: ...

    @property
    def model(self) -> ModelConfig: ...

    @property
    def ac(self) -> ACConfig: ...

    @property
    def compile(self) -> CompileConfig: ...

    @property
    def recipe(self) -> str | None: ...

    @property
    def recipe_backend(self) -> str: ...

    @property
    def fsdp(self) -> FsdpMode: ...

    @property
    def ep(self) -> int: ...

    @property
    def label(self) -> str:
        """The scenario's name in the Estimate's text and record."""

    def replace(self, **changes: Any) -> ScenarioLike:
        """A copy with `changes` (`ac=`), checked as the original was."""

    def to_dict(self) -> dict[str, Any]:
        """Its fields as `Scenario.to_dict()` writes them (the Estimate's `scenario`)."""


@dataclass(frozen=True)
class BareModel(PlainData):
    """A ModelConfig estimated as built, with `ac` and nothing else: no compile, no recipe, one rank, the toolkit's
    own model (`tk.estimate(cfg, ac=...)`). Checked as `Scenario(model=cfg, ac=ac)` checks them."""

    model: ModelConfig
    ac: ACConfig = field(default_factory=ACConfig.of)
    name: str = "estimate"
    stack: str = field(default="toolkit", init=False)
    compile: CompileConfig = field(default_factory=CompileConfig, init=False)
    recipe: str | None = field(default=None, init=False)
    recipe_backend: str = field(default="aot_eager", init=False)
    fsdp: FsdpMode = field(default="none", init=False)
    ep: int = field(default=1, init=False)

    def __post_init__(self) -> None:
        check_ac_compile(self.ac, self.compile)  # an AC mode that needs compile (a memory budget) is refused

    @property
    def label(self) -> str:
        return self.name

    def _record(self) -> dict[str, Any]:
        """The Scenario fields it stands for, as `Scenario.to_dict()` writes them (`Scenario.from_dict` reads it);
        what only a run reads (device, numerics, timing steps) is left out."""
        return {
            "model": self.model.to_dict(),
            "ac": self.ac.to_dict(),
            "compile": self.compile.to_dict(),
            "recipe": self.recipe,
            "recipe_backend": self.recipe_backend,
            "name": self.name,
        }
