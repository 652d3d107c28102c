"""`Stack`: the one small interface through which a training stack's own model, loss, AC and compile are measured.

A stack is whose code builds the model and applies the transforms: the toolkit's own (`stacks/toolkit.py`),
torchtitan's (`stacks/torchtitan.py`), Hugging Face transformers' (`stacks/transformers.py`) or a user's own model
(`stacks/user.py`). The measurement asks a stack only what is here: check, build, transform, what ran, undo and
randomness. Methods receive the `Scenario` being measured as a plain object (this layer sits below the measurement).
How the matrix addresses a stack's models and sweeps them (`analysis/blocks.py`, `analysis/grids.py`) and what the
Explorer offers of them (`notebook/models.py`) live with those layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol

if TYPE_CHECKING:  # annotations only: the registry is read without importing torch (the CLI's stamp replay)
    from typing import Self  # Python 3.11; the package runs on 3.10

    import torch
    from torch import nn


class StackConfig(Protocol):
    """A stack's model config (`Stack.config_type`): a frozen dataclass that a `Scenario` holds, records as JSON and
    reads back, with its device and seed overridable."""

    @property
    def device(self) -> str: ...

    @property
    def seed(self) -> int: ...

    def to_dict(self) -> dict[str, Any]: ...

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self: ...

    def replace(self, **changes: Any) -> Self: ...


@dataclass
class Built:
    """A stack's model and batch, ready for one training step."""

    model: nn.Module
    inputs: Any
    """The step's inputs (token ids, …): the census does not count them as activations."""
    call: Callable[[nn.Module], Any]
    """Runs a model on the batch (the measured one, or the reference built alike): `call(model)` → its output."""
    loss_of: Callable[[Any], torch.Tensor]
    """The stack's own loss of that output, the scalar the step differentiates."""
    device: torch.device
    dtype: torch.dtype
    seed: int
    """Seeds the RNG before the measured forward and the reference's (router noise, dropout)."""


class Stack(Protocol):
    """What the measurement asks of a training stack (an object per stack, `stacks.get(name)`)."""

    name: str

    @property
    def config_type(self) -> type[StackConfig]:
        """Its model config's class (called with no arguments: the stack's default model). Read-only, so that a
        stack's own config class stands for any `StackConfig`."""

    config_field: str
    """The `Scenario` field that holds that config ("model"; torchtitan's is "torchtitan", as it was first written)."""

    def available(self) -> bool:
        """Its package is installed (found, not imported)."""

    def require(self, owner: str, field: str) -> None:
        """Raise ConfigError naming the install line when the stack's package is missing or not a checked release."""

    def release(self) -> str | None:
        """Its package's version where results differ by it, part of a matrix cell's key (None: the torch version
        alone keys it: the toolkit's own, and torchtitan, pinned at one release)."""

    def check(self, scenario: Any) -> None:
        """Raise ConfigError, before anything is built, for what this stack cannot apply (an AC mode, a scope, …)."""

    def step_context(self, scenario: Any) -> ContextManager[None]:
        """What the whole step runs inside, entered before the model is built (torchtitan's parallel state for
        expert parallel); a null context for most."""

    def build(self, scenario: Any, *, sharded: bool) -> Built:
        """Its model (same seed → same weights), batch and loss; `sharded=False` builds the unsharded reference."""

    def transform(self, scenario: Any, model: nn.Module, stage: Callable[[str], None]) -> dict[str, str]:
        """Apply AC, compile (and FSDP) its own way, in its own order; returns the compile order per compile target
        ("compile(AC(x))" / "AC(compile(x))")."""

    def called(self, model: nn.Module) -> nn.Module:
        """The module the step calls, and the probes watch: the model itself, or the wrapper the stack's compile put
        around it (`torch.compile(model)`), so that no probe hook lands inside a compiled region."""

    def applied(self, model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(modules AC was asked to checkpoint, modules compiled), as the stack's own code set them; None if unknown."""

    def undo(self, model: nn.Module) -> None:
        """Take the transforms off again (the model is discarded after the step either way)."""

    def label(self, scenario: Any) -> str:
        """The scenario's one-line name in reports and tables."""

    def draws_random(self, config: Any) -> bool:
        """The model draws random numbers in training (dropout, router noise): the reference must draw alike."""

    def blocks(self, model: nn.Module) -> list[str]:
        """The names of its repeated blocks (the modules its AC and per-block compile target)."""


__all__ = ["Built", "Stack", "StackConfig"]
