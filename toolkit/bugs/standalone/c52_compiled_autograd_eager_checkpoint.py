"""Compiled autograd makes an eager checkpoint outside torch.compile save nothing at the peak (pytorch#143176).

Symptom: blocks checkpointed eagerly (`checkpoint(block, x, use_reentrant=False)`, not compiled) hold little after
the forward, as they should; but when the backward runs under compiled autograd, the backward's peak is higher
than with no checkpointing at all: compiled autograd gathers every saved tensor before it runs its graph, so every
block is recomputed up front and all the recomputed activations are alive at once, where eager autograd recomputes
one block at a time. Nothing warns. pytorch#143176 lists this as "non-reentrant: doesn't error, but no memory
savings expected"; the same holds for SAC.

Fix (pytorch#143176's "full support" row): checkpoint inside the compiled region, `torch.compile(checkpoint(...))`,
whose recompute the partitioner places in the compiled backward; or leave compiled autograd off.

Upstream: pytorch#143176 (compiled autograd + activation checkpointing / offloading).

Run: python c52_compiled_autograd_eager_checkpoint.py

Shapes: T tokens, D model dim, F = 4·D hidden; L blocks. Peaks are CPU allocations replayed from the profiler's
memory events (bytes alive above the start of the step), in MiB.
"""

import contextlib
import json
import os

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

CASE = "C52"
NEEDS = "cpu"

T, D, L = 1024, 128, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1_DF, self.w2_FD = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x_TD):
        return x_TD + self.w2_FD(torch.relu(self.w1_DF(x_TD)))


@contextlib.contextmanager
def _quiet_fd2():
    """Some builds' profiler logs start/stop lines straight to file descriptor 2: keep them out of the output."""
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _peak_mib(step) -> int:
    """Peak bytes alive during `step()` above its start (CPU allocation events of the profiler, replayed)."""
    from torch.profiler import ProfilerActivity, profile

    with _quiet_fd2(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocs, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == torch._C._profiler._EventType.Allocation and node.extra_fields.device.type == "cpu":
            allocs.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live, cum, peak = {}, 0, 0
    for _, ptr, size in sorted(allocs):
        if size > 0:
            live[ptr] = size
            cum += size
        elif ptr in live:
            cum -= live.pop(ptr)
        peak = max(peak, cum)
    return round(peak / 2**20)


def _run(*, ac: str, compiled_autograd: bool) -> int:
    """The peak of one training step of L blocks; `ac`: "none", "eager" (checkpoint outside compile) or
    "compiled" (each block compiled with its checkpoint inside). A first step compiles; the second is measured."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(L))
    x0_TD = torch.randn(T, D)
    if ac == "compiled":
        calls = [
            torch.compile(lambda x, b=b: checkpoint(b, x, use_reentrant=False), backend="aot_eager") for b in blocks
        ]
    elif ac == "eager":
        calls = [lambda x, b=b: checkpoint(b, x, use_reentrant=False) for b in blocks]
    else:
        calls = list(blocks)

    def step():
        h_TD = x0_TD.clone().requires_grad_()
        for call in calls:
            h_TD = call(h_TD)
        loss = h_TD.sum()
        with (
            torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager"))
            if compiled_autograd
            else contextlib.nullcontext()
        ):
            loss.backward()
        for p in blocks.parameters():
            p.grad = None

    step()
    return _peak_mib(step)


def bug() -> dict:
    """Eager checkpoints outside compile, backward under compiled autograd: the peak rises above no AC at all."""
    none, eager = _run(ac="none", compiled_autograd=True), _run(ac="eager", compiled_autograd=False)
    under_ca = _run(ac="eager", compiled_autograd=True)
    return {
        "peak_no_ac": none,
        "peak_ac": eager,
        "peak_ac_compiled_autograd": under_ca,
        "ac_saves_nothing": under_ca >= none,
    }


def fix() -> dict:
    """The checkpoint inside the compiled region: compiled autograd keeps the saving."""
    none, inside = _run(ac="none", compiled_autograd=True), _run(ac="compiled", compiled_autograd=True)
    return {"peak_no_ac": none, "peak_ac_compiled_autograd": inside, "ac_saves_nothing": inside >= none}


if __name__ == "__main__":
    print("torch", torch.__version__)
    print("bug", json.dumps(bug()))
    print("fix", json.dumps(fix()))
