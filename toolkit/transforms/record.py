"""What the transforms did to a model: the record `apply_ac`, `apply_compile`, `apply_fsdp` and the recipes keep on
it, which undoing them reads and which the torch settings of its steps come from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from torch import nn

_RECORD = "_toolkit_applied"


@dataclass
class Applied:
    """What `apply_ac` / `apply_compile` did to a model (kept on the model as `model._toolkit_applied`)."""

    ac: Any = None
    """The ACConfig applied, or None."""
    ac_wrapped: list[str] = field(default_factory=list)
    """Canonical names of the modules wrapped in a CheckpointWrapper, or given a torch_remat checkpoint `forward`
    (the blocks)."""
    ac_patched: list[str] = field(default_factory=list)
    """Canonical names of the modules whose `forward` torch_remat mode replaced: the blocks (their regions are
    declared in the model code and only configured)."""
    compile: Any = None
    """The CompileConfig applied, or None."""
    compiled: list[str] = field(default_factory=list)
    """Canonical names of the compile targets."""
    compile_orders: dict[str, str] = field(default_factory=dict)
    """Per compile target touching an AC region: 'compile(AC(x))' or 'AC(compile(x))'."""
    recipe: str | None = None
    """Name of the recipe that applied both, if any."""
    dynamo_config: dict[str, Any] = field(default_factory=dict)
    functorch_config: dict[str, Any] = field(default_factory=dict)
    inductor_config: dict[str, Any] = field(default_factory=dict)
    disable_lru_cache: bool = False
    fsdp: str = "none"
    """FSDP2 layout applied by `apply_fsdp` ("none", "blocks", "blocks+experts"); it cannot be undone."""
    compile_undo: list = field(default_factory=list, repr=False)
    """How to undo each compile target: ("module", obj) for in-place compile, ("wrapper", (parent, attr, obj))."""
    local_compiled: dict = field(default_factory=dict, repr=False)
    """This model's compiled local functions (`CompileConfig(functions=...)`), name → compiled function: bound while
    one of its steps runs (`torch_settings`), never for the process."""

    def copy(self) -> "Applied":
        return dataclasses.replace(
            self,
            ac_wrapped=list(self.ac_wrapped),
            ac_patched=list(self.ac_patched),
            compiled=list(self.compiled),
            compile_orders=dict(self.compile_orders),
            dynamo_config=dict(self.dynamo_config),
            functorch_config=dict(self.functorch_config),
            inductor_config=dict(self.inductor_config),
            compile_undo=list(self.compile_undo),
            local_compiled=dict(self.local_compiled),
        )

    @property
    def empty(self) -> bool:
        return self == Applied()


def applied(model: nn.Module) -> Applied:
    """The record of toolkit transforms on `model` (an empty record, not stored, if none were applied)."""
    rec = model.__dict__.get(_RECORD)
    return rec if rec is not None else Applied()


def record(model: nn.Module) -> Applied:
    """The record a transform writes into (created on the model the first time)."""
    rec = model.__dict__.get(_RECORD)
    if rec is None:
        rec = model.__dict__[_RECORD] = Applied()
    return rec


def forget(model: nn.Module) -> None:
    """Drop the record once every transform is undone, so the model is as it was built."""
    rec = model.__dict__.get(_RECORD)
    if rec is not None and rec.empty:
        del model.__dict__[_RECORD]
