"""A scenario's model, batch and loss built, and its transforms applied, on either stack (toolkit, torchtitan)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .._config import ConfigError
from ..models import build_model, make_batch
from ..models import loss_fn as model_loss_fn
from ..transforms import apply_ac, apply_compile
from ..transforms.fsdp import apply_fsdp
from ..transforms.recipes import apply_recipe
from ..transforms.settings import applied
from .scenario import Scenario
from .step import Stage


@dataclass
class Built:
    model: nn.Module
    tokens: torch.Tensor
    loss_of: Callable[[torch.Tensor], torch.Tensor]
    device: torch.device
    dtype: torch.dtype
    seed: int
    """Seeds the RNG before the measured forward and the reference's (router noise, dropout)."""


def check_ranks_for_ep(ep: int) -> None:
    """Expert parallel needs a process group of `ep` ranks (or a multiple): refused before anything is built."""
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world % ep:
        raise ConfigError(
            "Scenario",
            "ep",
            f"ep={ep} needs {ep} ranks; this process has {world}.",
            f"run it with tk.run_distributed(scenario, nproc={ep}) or `python -m toolkit run --nproc {ep}`.",
        )


def build(scenario: Scenario, *, sharded: bool) -> Built:
    """The model, batch and loss; `sharded=False` builds the unsharded reference (no EP sharding config)."""
    if scenario.stack == "torchtitan":
        from ..stacks import torchtitan as titan

        cfg = scenario.torchtitan_config
        tokens, labels = titan.make_batch(cfg)
        loss = titan.loss_fn(cfg)
        model = titan.build(cfg, ep=scenario.ep if sharded else 1)
        return Built(
            model,
            tokens,
            lambda logits: loss(logits, labels),
            torch.device(cfg.device),
            next(model.parameters()).dtype,
            cfg.seed + 2,
        )
    cfg = scenario.model_config
    batch = make_batch(cfg)
    return Built(
        build_model(cfg),
        batch.tokens,
        lambda logits: model_loss_fn(logits, batch.labels),
        torch.device(cfg.device),
        cfg.torch_dtype,
        cfg.seed + 2,
    )


def transform(scenario: Scenario, model: nn.Module, stage: Stage) -> dict[str, str]:
    """AC, compile (or a recipe), then FSDP — the toolkit's transforms or torchtitan's own; returns the compile
    orders (compile(AC(x)) / AC(compile(x))) per compile target."""
    if scenario.stack == "torchtitan":
        from ..stacks import torchtitan as titan

        n = len(list(model.layers.children()))
        orders = (
            {f"layers.{i}": "compile(AC(x))" for i in range(n)}
            if scenario.compile.enabled and scenario.ac.mode != "none"
            else {}
        )
        if scenario.ep > 1:  # its parallelize_*: EP, then AC, compile and FSDP2
            stage("parallelize")
            titan.parallelize_ep(
                model,
                scenario.torchtitan_config.family,
                ep=scenario.ep,
                ac=scenario.ac.mode,
                compile_backend=scenario.compile.backend if scenario.compile.enabled else None,
            )
            return orders
        stage("ac")
        titan.apply_ac(model, scenario.ac.mode)
        stage("compile")
        if scenario.compile.enabled:
            titan.apply_compile(model, scenario.compile.backend)
        if scenario.fsdp != "none":
            titan.apply_fsdp(model)
        return orders
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
