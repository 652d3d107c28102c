"""The toolkit's own stack: its torchtitan-shaped model (`toolkit.models`) and its own transforms, recipes and FSDP2."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch import nn

from .._config import ConfigError
from ..models import ModelConfig, build_model, loss_fn, make_batch
from ..transforms import apply_ac, apply_compile
from ..transforms.containers import blocks
from ..transforms.fsdp import apply_fsdp
from ..transforms.lifecycle import reset
from ..transforms.recipes import apply_recipe
from ..transforms.record import applied
from .base import Built, Stack


class ToolkitStack:
    """The toolkit's own model behind the `Stack` interface."""

    name = "toolkit"
    config_type = ModelConfig
    config_field = "model"

    def available(self) -> bool:
        return True

    def require(self, owner: str, field: str) -> None:
        return None  # nothing to install: it is the toolkit's own

    def release(self) -> None:
        return None

    def check(self, scenario: Any) -> None:
        if scenario.ep > 1:
            raise ConfigError(
                "Scenario",
                "ep",
                "expert parallel runs torchtitan's own token dispatcher and parallelize.",
                "pass stack='torchtitan' with ep, or ep=1.",
            )

    def step_context(self, scenario: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def build(self, scenario: Any, *, sharded: bool) -> Built:
        cfg = scenario.model_config
        batch = make_batch(cfg)
        return Built(
            build_model(cfg),
            batch.tokens,
            lambda model: model(batch.tokens),
            lambda logits: loss_fn(logits, batch.labels),
            torch.device(cfg.device),
            cfg.torch_dtype,
            cfg.seed + 2,
        )

    def transform(self, scenario: Any, model: nn.Module, stage: Callable[[str], None]) -> dict[str, str]:
        """AC and compile (or a recipe), then FSDP: the toolkit's transforms, in torchtitan's order."""
        if scenario.recipe is not None:
            stage("compile")
            apply_recipe(model, scenario.recipe, backend=scenario.recipe_backend)
        else:
            stage("ac")
            apply_ac(model, scenario.ac)
            stage("compile")
            apply_compile(model, scenario.compile)
        if scenario.fsdp != "none":
            apply_fsdp(model, scenario.fsdp)
        return dict(applied(model).compile_orders)

    def called(self, model: nn.Module) -> nn.Module:
        return model  # its compiles sit inside the model (in place, or a wrapper in the module's slot)

    def applied(self, model: nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
        rec = applied(model)
        return tuple(rec.ac_wrapped), tuple(rec.compiled)

    def undo(self, model: nn.Module) -> None:
        reset(model, dynamo=False)

    def label(self, scenario: Any) -> str:
        fsdp = f" | FSDP {scenario.fsdp}" if scenario.fsdp != "none" else ""
        if scenario.recipe:
            return f"recipe {scenario.recipe}{fsdp}"
        c = scenario.compile
        scope = c.scope if isinstance(c.scope, str) else ",".join(c.scope)
        comp = "eager" if not c.enabled else f"compile {scope} ({c.backend_name}{', fullgraph' if c.fullgraph else ''})"
        m = scenario.model
        return f"{m.experts_impl if m.has_moe else 'dense'} | AC {scenario.ac.mode} | {comp}{fsdp}"

    def draws_random(self, config: ModelConfig) -> bool:
        return config.draws_random

    def blocks(self, model: nn.Module) -> list[str]:
        return [f"layers.{key}" for key, _ in blocks(model)]


STACK: Stack = ToolkitStack()
