"""`train_step`: one forward, loss and backward of the toolkit's model under the torch settings its transforms need."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .._config import check_bool, check_instance
from .settings import torch_settings


def train_step(model: nn.Module, batch: Any, *, zero_grad: bool = True) -> torch.Tensor:
    """Forward, loss and backward under the torch settings the applied transforms need; returns the detached loss."""
    from ..models import Batch, ModelConfig, loss_fn
    from ..models.transformer import check_tokens

    check_instance("train_step", "model", model, nn.Module, "pass the model (tk.build_model(cfg)).")
    check_instance("train_step", "batch", batch, Batch, "pass tk.make_batch(cfg), a Batch of tokens and labels.")
    check_bool("train_step", "zero_grad", zero_grad)
    cfg = getattr(model, "config", None)
    if isinstance(cfg, ModelConfig) and isinstance(getattr(batch, "tokens", None), torch.Tensor):
        check_tokens(cfg, batch.tokens, "train_step")
    if zero_grad:
        model.zero_grad(set_to_none=True)
    with torch_settings(model):
        loss = loss_fn(model(batch.tokens), batch.labels)
        loss.backward()
    return loss.detach()
