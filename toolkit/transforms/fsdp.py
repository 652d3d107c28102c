"""`apply_fsdp(model, mode)`: real FSDP2 laid out as torchtitan 0.3.0 shards, on a local gloo group.

`apply_fsdp(model, mode)`: real FSDP2 (`fully_shard`) laid out as torchtitan 0.3.0 shards a decoder, and a 1-rank gloo
process group on 127.0.0.1 when none exists.
"""

from __future__ import annotations

import contextlib
import os
import socket
import typing
from typing import Any, Iterator, Literal, cast

import torch
from torch import nn

from .._config import ConfigError, check_bool, check_choice
from ..models.moe import MoE, experts_child
from .containers import blocks
from .naming import unwrap
from .record import record

FsdpMode = Literal["none", "blocks", "blocks+experts"]
FSDP_MODES: tuple[str, ...] = typing.get_args(FsdpMode)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def process_group() -> Iterator[tuple[int, int]]:
    """`(rank, world size)` of the default process group; when there is none, a 1-rank gloo group on 127.0.0.1
    (loopback only, `GLOO_SOCKET_IFNAME=lo`) for the duration, destroyed after."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        yield dist.get_rank(), dist.get_world_size()
        return
    if not dist.is_available():
        raise ConfigError("Scenario", "fsdp", "this torch build has no torch.distributed.", "use fsdp='none'.")
    old = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
        try:
            yield 0, 1
        finally:
            dist.destroy_process_group()
    finally:
        if old is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = old


def apply_fsdp(
    model: nn.Module, mode: FsdpMode = "blocks", *, mesh: object | None = None, reshard_after_forward: bool = True
) -> nn.Module:
    """Shard `model` with FSDP2 on the default process group, as torchtitan 0.3.0's `apply_fsdp_to_decoder` lays
    it out: `tok_embeddings`; `norm` + the output head together, kept unsharded after the forward; every block of
    `model.layers`; then the root. `mode="blocks+experts"` first gives each MoE's routed experts a unit of their
    own (torchtitan's layout of PR #2052's era, whose FSDP hooks on the experts broke compile: C4). Apply it after
    AC and compile, as torchtitan does; with more than one rank, gradients are reduced by sum (gloo has no
    PREMUL_SUM / AVG reduce-scatter). `mesh`: a 1-D device mesh over the default group's ranks (made here when
    None); `reshard_after_forward=False` keeps each block's gathered parameters from its forward to its backward
    (torchtitan's `reshard_after_forward: never`: less communication, more memory)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    check_choice("apply_fsdp", "mode", mode, FSDP_MODES)
    check_bool("apply_fsdp", "reshard_after_forward", reshard_after_forward)
    if mode == "none":
        return model
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            "apply_fsdp",
            "mode",
            "FSDP2 needs a process group and none is initialized.",
            "use `with toolkit.transforms.fsdp.process_group():` (1 rank, gloo on 127.0.0.1) or run under torchrun.",
        )
    if any(isinstance(m, FSDPModule) for m in model.modules()):
        raise RuntimeError("this model is already sharded with FSDP2 (fully_shard); build a new one.")
    device = "cuda" if next(model.parameters()).is_cuda else "cpu"
    if mesh is None:
        mesh = init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("fsdp",))
    dtype = next(model.parameters()).dtype
    config: dict[str, Any] = dict(  # fully_shard's keyword arguments
        mesh=mesh,
        mp_policy=MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32, cast_forward_inputs=False),
    )
    root = unwrap(model)
    if isinstance(getattr(root, "tok_embeddings", None), nn.Module):
        fully_shard(cast(nn.Module, root.tok_embeddings), **config, reshard_after_forward=True)
    head = next(
        (getattr(root, n) for n in ("lm_head", "output") if isinstance(getattr(root, n, None), nn.Module)), None
    )
    if isinstance(getattr(root, "norm", None), nn.Module) and head is not None:
        fully_shard([cast(nn.Module, root.norm), head], **config, reshard_after_forward=False)
    layers = cast(nn.ModuleDict, root.layers)  # keyed as `blocks` yields them (torchtitan's layout)
    for key, block in blocks(model):
        if mode == "blocks+experts" and getattr(block, "moe_enabled", False):
            moe = unwrap(cast(nn.Module, block.moe))
            experts = (
                cast(MoE, moe).routed_experts_module()  # the toolkit's MoE: the only one with this method
                if hasattr(moe, "routed_experts_module")
                else (unwrap(c) if (c := experts_child(moe)) is not None else None)
            )
            if isinstance(experts, nn.Module):
                fully_shard(experts, **config, reshard_after_forward=reshard_after_forward)
        fully_shard(layers[key], **config, reshard_after_forward=reshard_after_forward)
    fully_shard(model, **config)
    if dist.get_world_size() > 1:
        for unit in model.modules():
            if isinstance(unit, FSDPModule):
                unit.set_force_sum_reduction_for_comms(True)
    record(model).fsdp = mode
    return model
