"""Full-size estimates: time and resident memory of each `tk.estimate` figure, one fresh process per figure.

    python benchmarks/estimate_full_size.py [--layers LAYER ...] [--modes MODE ...] [--backends BACKEND ...]

For each layer of `tk.estimation.LAYER_SHAPES` × AC mode × eager / aot_eager / inductor (the block compiled whole,
fullgraph), a child process runs one estimate and reports its wall time and peak RSS (`ru_maxrss`, the whole process:
Python, torch and the compiler included); the parent prints a table with the estimate's saved bytes and peak. Target:
≤ 60 s and ≤ 4 GB each on 2 cores. A memory budget needs a compile, so it has no eager figure.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MODES = ("none", "full", "selective_op", "selective_layer", "memory_budget", "remat")
BACKENDS = ("eager", "aot_eager", "inductor")


def one(layer: str, mode: str, backend: str) -> dict:
    """One estimate in this process: its figures, seconds and peak RSS."""
    import torch

    import toolkit as tk

    torch.set_num_threads(2)
    t0 = time.perf_counter()
    compile = (
        tk.CompileConfig(scope="blocks", backend=backend, fullgraph=True) if backend != "eager" else tk.CompileConfig()
    )
    scenario = tk.Scenario(
        model=tk.estimation.LAYER_SHAPES[layer], ac=tk.ACConfig.of(mode=mode), compile=compile, name=layer
    )
    est = tk.estimate(scenario)
    return {
        "seconds": round(time.perf_counter() - t0, 1),  # building the fake model and the estimate; not the imports
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "saved": est.saved_bytes,
        "peak": est.peak_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", nargs="+", default=None, help="keys of tk.estimation.LAYER_SHAPES (default: all)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--one", nargs=3, metavar=("LAYER", "MODE", "BACKEND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(*args.one)))
        return
    if args.layers is None:
        from toolkit.estimation import LAYER_SHAPES

        args.layers = list(LAYER_SHAPES)
    gib = 2**30
    print(f"{'layer':<22} {'mode':<16} {'backend':<10} {'seconds':>8} {'RSS MiB':>8} {'saved GiB':>10} {'peak GiB':>9}")
    for layer in args.layers:
        for mode in args.modes:
            for backend in args.backends:
                if mode == "memory_budget" and backend == "eager":
                    continue  # the budget is the compiled partitioner's knapsack
                child = subprocess.run(
                    [sys.executable, __file__, "--one", layer, mode, backend], capture_output=True, text=True
                )
                if child.returncode:
                    error = (child.stderr.strip().splitlines() or ["?"])[-1][:60]
                    print(f"{layer:<22} {mode:<16} {backend:<10} failed: {error}", flush=True)
                    continue
                r = json.loads(child.stdout.strip().splitlines()[-1])
                print(
                    f"{layer:<22} {mode:<16} {backend:<10} {r['seconds']:>8.1f} {r['rss_mib']:>8} "
                    f"{r['saved'] / gib:>10.2f} {r['peak'] / gib:>9.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
