"""Steady-state cost of the measurement probes on an eager 4-layer tiny MoE step, as ratios to the bare step.

    python benchmarks/overhead.py [--iters 30]

Prints the bare forward+backward time, the fully instrumented step (what a measured step runs: `Probes.active()`, the
tracker in the forward, the end-of-forward census) as a ratio, and each probe alone. Ratios come from one run on this
machine. Printed last for scale: the dispatch tracker cannot cost less than an empty TorchDispatchMode, and the two
other ways to name each storage's producer cost at least what the probes cost without the tracker (names read from
autograd's graph after the forward) or what the C++ profiler costs over the forward (its op and allocation record).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import torch

import toolkit as tk
from toolkit.compat import TorchDispatchMode
from toolkit.instrument.probes import Probes, _older_objects_frozen


def ratio(fn, base, iters: int) -> tuple[float, float]:
    """Median CPU time of `fn` and of `base` (one intra-op thread: the process's CPU time is the step's work, which
    other processes on a shared machine do not inflate as they do wall time), measured interleaved."""
    for _ in range(3):
        fn()
        base()
    a, b = [], []
    for _ in range(iters):
        t = time.process_time()
        base()
        b.append(time.process_time() - t)
        t = time.process_time()
        fn()
        a.append(time.process_time() - t)
    return statistics.median(a), statistics.median(b)


class _EmptyMode(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier ratios on a shared 2-core machine
    # Default: the feasibility study's block size (dim 128, E=8, batch 2 x seq 128), four layers.
    cfg = tk.ModelConfig(
        n_layers=4, dim=args.dim, n_experts=args.experts, seq_len=args.seq, moe_hidden=args.dim, ffn_hidden=2 * args.dim
    )
    model = tk.build_model(cfg)
    batch = tk.make_batch(cfg)

    def step(probes: Probes | None = None, census: bool = False, tracker: bool = False, forward_under=None):
        """`forward_under`: a context manager (factory) the forward alone runs under, a probe's alternative."""
        model.zero_grad(set_to_none=True)
        scope = probes.phase_scope if tracker else (lambda phase: contextlib.nullcontext())
        if probes is not None and not tracker:
            probes.state.phase = "forward"
        with scope("forward"), (forward_under or contextlib.nullcontext)():
            out = model(batch.tokens)
        if census:
            probes.census(out)
        loss = tk.models.loss_fn(out, batch.labels)
        del out
        if probes is not None and not tracker:
            probes.state.phase = "backward"
        with scope("backward"):
            loss.backward()
        if probes is not None:
            probes.state.phase = "idle"

    def with_parts(*parts: str, census: bool = False):
        def run():
            p = Probes(model, batch.tokens)
            with contextlib.ExitStack() as stack:
                if census:  # as in a measured step: the census collects only what the step made
                    stack.enter_context(_older_objects_frozen())
                if "patches" in parts:
                    stack.enter_context(p.compiled.patches())
                    stack.enter_context(p.checkpoints.patches())
                    stack.enter_context(p.trace.listening())
                if "module hooks" in parts:
                    stack.enter_context(p.modules.hooks())
                if "saved-tensor hooks" in parts:
                    stack.enter_context(torch.autograd.graph.saved_tensors_hooks(p._pack, lambda t: t))
                step(p, census, tracker="dispatch tracker" in parts)

        return run

    def instrumented():
        # What a measured step runs: Probes.active() (patches, module and saved-tensor hooks, the trace listener,
        # older objects frozen for the census's collection), the tracker in the forward, the census.
        p = Probes(model, batch.tokens)
        with p.active():
            step(p, census=True, tracker=True)

    full, bare = ratio(instrumented, step, args.iters)
    print(
        f"bare eager step (4-layer MoE, dim {cfg.dim}, {cfg.batch}x{cfg.seq_len} tokens, "
        f"{torch.get_num_threads()} threads): {bare * 1e3:.2f} ms"
    )
    print(f"fully instrumented step: {full * 1e3:.2f} ms = {full / bare:.2f}x")
    for part in ("dispatch tracker", "module hooks", "saved-tensor hooks", "patches"):
        t, b = ratio(with_parts(part), step, args.iters)
        print(f"  {part:20} alone: {t / b:.2f}x")
    t, b = ratio(with_parts(census=True), step, args.iters)
    print(f"  {'census':20} alone: {t / b:.2f}x")

    # The floors of the two other designs a producer record could have: every probe but the tracker (what a design
    # that names producers from autograd's graph after the forward would cost before naming any), and the C++
    # profiler recording each op and allocation over the forward (its events not even read back).
    def all_but_tracker():
        p = Probes(model, batch.tokens)
        with p.active():
            step(p, census=True)

    def empty():
        with _EmptyMode():
            step()

    def profiled():
        step(
            forward_under=lambda: torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
        )

    print("for scale:")
    for label, fn in (
        ("every probe but the tracker", all_but_tracker),
        ("an empty dispatch mode", empty),
        ("the profiler over the forward", profiled),
    ):
        t, b = ratio(fn, step, args.iters)
        print(f"  {label:30} {t / b:.2f}x")


if __name__ == "__main__":
    main()
