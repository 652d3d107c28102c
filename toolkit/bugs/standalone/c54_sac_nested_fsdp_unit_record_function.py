"""SAC around a block holding its own FSDP2 unit: the recompute dispatches a profiler op the forward did not.

Symptom: per-op SAC (`create_selective_checkpoint_contexts`) on a block whose experts are an FSDP2 unit of their own
raises in backward: "profiler._record_function_enter_new.default invocation index 2 encountered during backward but
not found in storage". SAC replays the forward op by op, counting every op it sees, profiler ops included. In the
forward the experts' FSDP pre-forward hook opens one `record_function`; when the recompute starts before the experts'
pre-backward hook has run (the block's output needs a saved tensor first: here a `tanh`, in the toolkit's model
the residual stream), FSDP takes its forward path again, and its root pre-forward (reset at the end of the real
forward) opens one more: `FSDP::root_pre_forward`. Full AC does not count ops and runs; eager without AC runs.

Fix: no FSDP unit inside a SAC region — shard the experts with their block (one unit per block, torchtitan's
default) — or full AC around such blocks. pytorch#196862 proposes to keep FSDP's all-gather internals and profiler
record-function ops out of SAC's bookkeeping; 2.13.0 and 2.14.1 do not have it.

Upstream: pytorch#196862 ([FSDP] Exclude all-gather internals from selective checkpointing).

Run: python c54_sac_nested_fsdp_unit_record_function.py

Shape suffixes: T tokens, D model dim, H expert hidden dim, E experts.
"""

import functools
import json
import re
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

CASE = "C54"
NEEDS = "cpu"

T, D, H, E = 32, 64, 128, 4


def _msg(e: BaseException) -> str:
    first = (str(e).splitlines() or [""])[0]
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    return f"{type(e).__name__}: {first}"


class Experts(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1_EDH = nn.Parameter(torch.randn(E, D, H) * 0.1)
        self.w2_EHD = nn.Parameter(torch.randn(E, H, D) * 0.1)

    def forward(self, x_TD, weights_TE):
        h_ETH = torch.relu(x_TD.unsqueeze(0) @ self.w1_EDH)
        return ((h_ETH @ self.w2_EHD) * weights_TE.T.unsqueeze(-1)).sum(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.wo = nn.Linear(D, D)
        self.gate = nn.Linear(D, E)
        self.experts = Experts()

    def forward(self, x_TD):
        h_TD = x_TD + self.wo(x_TD)
        # tanh's backward reads its output: the recompute starts before the experts' pre-backward hook runs.
        return torch.tanh(h_TD + self.experts(h_TD, torch.softmax(self.gate(h_TD), dim=-1)))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block()])

    def forward(self, x_TD):
        for layer in self.layers:
            x_TD = layer(x_TD)
        return x_TD


def _save_matmuls(ctx, func, *args, **kwargs):
    """A per-op policy: keep the matmuls, recompute the rest (what it decides does not matter here)."""
    if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


class _OneRank:
    """A 1-rank gloo group on 127.0.0.1 for the duration (an existing 1-rank group is used as it is)."""

    def __enter__(self):
        self.own = not dist.is_initialized()
        if self.own:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        return self

    def __exit__(self, *exc):
        if self.own:
            dist.destroy_process_group()


def _step(*, selective: bool, experts_unit: bool) -> dict:
    """torchtitan's order: the block checkpointed (checkpoint_wrapper), then FSDP2 units — the experts' own, the
    block's, the model's — then one training step."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Model()
    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
    kwargs = {"context_fn": context_fn} if selective else {}
    model.layers[0] = checkpoint_wrapper(model.layers[0], preserve_rng_state=False, **kwargs)
    error = None
    with _OneRank():
        if experts_unit:
            fully_shard(model.layers[0]._checkpoint_wrapped_module.experts)
        fully_shard(model.layers[0])
        fully_shard(model)
        try:
            model(torch.randn(T, D)).sum().backward()
        except Exception as e:  # noqa: BLE001 - the error is the observation
            error = _msg(e)
    return {"error": error, "profiler_op_not_in_storage": error is not None and "_record_function_enter_new" in error}


def bug() -> dict:
    """Per-op SAC around a block whose experts are an FSDP2 unit of their own: the recompute raises."""
    return _step(selective=True, experts_unit=True)


def fix() -> dict:
    """The experts sharded with their block (no FSDP unit inside the SAC region): the step runs."""
    return _step(selective=True, experts_unit=False)


def variant_full_ac() -> dict:
    """Full AC around the same nested units: plain checkpoint does not count ops, and the step runs."""
    return _step(selective=False, experts_unit=True)


USER_MODELS_NEED = "process_group"  # `user_models()` shards with FSDP2: call it, and measure, inside one


def user_models() -> dict:
    """C54 as a user's training code holds it, inside a process group the caller opened: per-op SAC on the block
    (checkpoint_wrapper), then FSDP2 units — the experts', the block's, the model's; and its input."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Model()
    context_fn = functools.partial(create_selective_checkpoint_contexts, _save_matmuls)
    model.layers[0] = checkpoint_wrapper(model.layers[0], preserve_rng_state=False, context_fn=context_fn)
    fully_shard(model.layers[0]._checkpoint_wrapped_module.experts)
    fully_shard(model.layers[0])
    fully_shard(model)
    return {"C54": {"model": model, "inputs": (torch.randn(T, D),)}}


if __name__ == "__main__":
    print("torch", torch.__version__)
    for name in ("bug", "fix", "variant_full_ac"):
        print(name, json.dumps(globals()[name]()))
