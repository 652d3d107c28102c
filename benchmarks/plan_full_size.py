"""Will it fit, at full size: one per-rank estimate of DeepSeek-V3 (61 layers) at world size 64, then a plan over the
candidate setups, each in a fresh process with its wall time and peak RSS.

    python benchmarks/plan_full_size.py [--layers 61] [--world-size 64] [--budget 80GiB] [--skip-plan]

Targets (issue 52): the estimate ≤ 60 s and ≤ 4 GB on 2 cores; the plan over about 20 setups ≤ 5 minutes.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(what: str, layers: int, world: int, budget: str) -> dict:
    import torch

    import toolkit as tk

    torch.set_num_threads(2)
    cfg = tk.estimation.LAYER_SHAPES["deepseek_v3_layer"].replace(n_layers=layers)
    scenario = tk.Scenario(model=cfg, ac=tk.ACConfig.of(mode="full"), fsdp="blocks", name=f"deepseek_v3 x{layers}")
    t0 = time.perf_counter()
    if what == "estimate":
        est = tk.estimate(scenario, world_size=world)
        out = {"per_rank": est.per_rank_bytes, "peak": est.peak_bytes, "saved": est.saved_bytes}
    else:
        plan = tk.plan(scenario, budget=budget, world_size=world)
        out = {"verdict": plan.verdict(), "setups": len(plan.rows)}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=61)
    parser.add_argument("--world-size", type=int, default=64)
    parser.add_argument("--budget", default="80GiB")
    parser.add_argument("--skip-plan", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.layers, args.world_size, args.budget)))
        return
    for what in ("estimate",) + (() if args.skip_plan else ("plan",)):
        cmd = [sys.executable, __file__, "--one", what, "--layers", str(args.layers)]
        cmd += ["--world-size", str(args.world_size), "--budget", args.budget]
        child = subprocess.run(cmd, capture_output=True, text=True)
        if child.returncode:
            print(what, "failed:", child.stderr.strip()[-2000:], flush=True)
            continue
        print(what, child.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
