"""Nested FSDP2 units inside one activation-checkpointed layer: does the recompute all-gather a unit twice?

Symptom reported (pytorch#175406, 2026-02): a transformer layer that is both an FSDP unit and an AC unit, with its
attention and MLP as FSDP units of their own (llama-2 style nested sharding). In backward the recompute runs the
attention's forward hooks; its post-forward reshards the parameters again, so backward all-gathers the attention twice
per layer and the backward prefetch order breaks.

What this script measures: two such layers on 2 gloo ranks (127.0.0.1), one training step with and without full AC
(checkpoint_wrapper, non-reentrant), counting FSDP2's parameter all-gathers in forward and backward per unit. On
2.13.0, 2.14.1 and 2.15.0 backward all-gathers each unit once, with AC as without: the report does not reproduce on
these releases at this size. FSDP2's `_pre_forward` / `_post_forward` there leave a unit whose state is PRE_BACKWARD
alone during a recompute; whether the report needs CUDA's prefetching (its trace was on CUDA ranks) is not
isolated.

Fix: none needed here (the counts match); pytorch#175406 proposed a graph-task check in `_post_forward`.

Upstream: pytorch#175406 (closed).

Run: python c79_nested_fsdp_units_in_ac_unit_all_gathers.py

Shape suffixes: T tokens, D dim.
"""

import json
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

CASE = "C79"
NEEDS = "cpu"

T, D = 32, 64


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(D)
        self.attention = nn.Linear(D, D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D))

    def forward(self, x_TD):
        h_TD = x_TD + torch.tanh(self.attention(self.norm(x_TD)))
        return h_TD + torch.tanh(self.mlp(h_TD))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Layer(), Layer()])

    def forward(self, x_TD):
        for layer in self.layers:
            x_TD = layer(x_TD)
        return x_TD


def _rank(rank: int, port: int, out: str) -> None:
    """One rank: each configuration's all-gathers, by phase and unit (written by rank 0)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    original, seen, phase, unit = _fsdp_param_group.foreach_all_gather, [], ["forward"], {}

    def counting(fsdp_params, *args, **kwargs):
        # A unit is named by the module owning its first parameter: the layer's own (its norm), attention, mlp.
        seen.append((phase[0], unit.get(id(fsdp_params[0]._module_info.module), "?") if fsdp_params else "?"))
        return original(fsdp_params, *args, **kwargs)

    _fsdp_param_group.foreach_all_gather = counting  # this process only, for its lifetime
    found = {}
    try:
        for ac in (False, True):
            torch.manual_seed(0)
            model = Model()
            for i, layer in enumerate(model.layers):
                unit.update({id(layer.norm): "layer", id(layer.attention): "attention", id(layer.mlp[0]): "mlp"})
                fully_shard(layer.attention)
                fully_shard(layer.mlp)
                if ac:
                    model.layers[i] = checkpoint_wrapper(layer)
                fully_shard(model.layers[i])
            fully_shard(model)
            seen.clear()
            phase[0] = "forward"
            out_TD = model(torch.randn(T, D))
            phase[0] = "backward"
            out_TD.sum().backward()
            found["full_ac" if ac else "no_ac"] = {
                p: sorted(f"{n}:{sum(1 for q, m in seen if q == p and m == n)}" for n in {m for _, m in seen})
                for p in ("forward", "backward")
            }
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(found, f)


def _run() -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        mp.spawn(_rank, args=(port, out), nprocs=2, join=True)
        with open(out) as f:
            return json.load(f)
    finally:
        os.remove(out)


def bug() -> dict:
    """Backward all-gathers per unit with full AC, against the same model without AC."""
    found = _run()
    return {
        **found,
        "ac_adds_all_gathers": found["full_ac"]["backward"] != found["no_ac"]["backward"],
    }


def fix() -> dict:
    """Nothing to fix where the counts match: the same numbers, said plainly."""
    found = _run()["full_ac"]
    return {"backward_equals_forward": found["backward"] == found["forward"]}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
