"""Peak and held-after-forward memory of a bare step: profiler replay on CPU, the allocator on CUDA.

Peak and held-after-forward memory of one bare step: the profiler's CPU allocation events replayed, or CUDA's caching
allocator.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import warnings
from typing import Callable, Iterator

import torch

from .. import compat

CPU_METHOD = "profiler allocation events replayed"
CUDA_METHOD = "cuda caching allocator (max_memory_allocated)"


@contextlib.contextmanager
def quiet_fd2() -> Iterator[None]:
    """Silence writes to file descriptor 2 (kineto prints `USDT: ... profiler_start` there, past Python)."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def cpu_step(step: Callable[[Callable[[], None]], None]) -> tuple[int, int] | None:
    """Peak and held-after-forward bytes above the start, from the profiler's allocation events replayed (None
    when this torch's profiler cannot give them).

    Frees of blocks allocated before the window (garbage of an earlier step collected now) are ignored by
    matching each free to an allocation of the same pointer inside the window.
    """
    event_type = compat.profiler_event_type()
    if event_type is None:
        step(lambda: None)
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    def mark() -> None:
        with record_function("toolkit::forward_end"):
            pass

    gc.collect()
    with quiet_fd2(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step(mark)
    allocs, marks = [], []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == event_type.Allocation:
            f = node.extra_fields
            if f.device.type == "cpu":
                allocs.append((node.start_time_ns, f.ptr, f.alloc_size))
        elif node.name == "toolkit::forward_end":
            marks.append(node.start_time_ns)
        stack.extend(node.children)
    allocs.sort()
    live: dict[int, int] = {}
    cum = peak = 0
    held = None
    for t, ptr, size in allocs:
        if held is None and marks and t >= marks[0]:
            held = cum
        if size > 0:
            live[ptr] = size
            cum += size
        elif ptr in live:
            cum -= live.pop(ptr)
        peak = max(peak, cum)
    return peak, held if held is not None else cum


def cuda_step(
    step: Callable[[Callable[[], None]], None], device: torch.device, snapshot_path: str | None
) -> tuple[int, int]:
    """Peak (`max_memory_allocated`) and held-after-forward bytes above the start, optionally writing an
    allocator snapshot for PyTorch's memory viewer."""
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    held: dict[str, int] = {}

    def mark() -> None:
        torch.cuda.synchronize(device)
        held["v"] = torch.cuda.memory_allocated(device) - start

    record = snapshot_path and compat.available("cuda_snapshot")
    if record:
        compat.cuda_memory_history(True)
    try:
        step(mark)
        torch.cuda.synchronize(device)
        if record:
            assert snapshot_path is not None  # `record` is falsy without a path
            compat.cuda_dump_snapshot(snapshot_path)
    finally:
        if record:
            compat.cuda_memory_history(False)
    return torch.cuda.max_memory_allocated(device) - start, held.get("v", 0)
