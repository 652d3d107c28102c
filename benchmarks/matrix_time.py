"""Wall time of the quick composability sweep, executor by executor, measured in one run and shown as ratios.

    python benchmarks/matrix_time.py [--workers 2] [--only REGEX] [--skip-cold]

Each executor starts from an empty results folder: a fresh Python per cell (`--cold`), the warm pool (the
default: torch imported once, a forked child per cell) and submitit's local executor (one task per worker, each
with its own warm pool). Then the warm pool's sweep again, every cell answered by results.jsonl, and
`python -m toolkit matrix` twice on that folder: the first re-renders the pages and stamps the folder, the second
answers from the stamp without importing torch. Targets on 2 CPU cores with aot_eager: warm pool from empty <= 60 s,
the re-run <= 3 s, the command line's re-run <= 1.5 s.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from toolkit.analysis.cells import quick_cells  # noqa: E402
from toolkit.analysis.sweeps import sweep  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", help="only cells whose label matches (a shorter run)")
    parser.add_argument("--skip-cold", action="store_true", help="leave out the fresh-Python-per-cell run")
    args = parser.parse_args()
    cells = quick_cells()
    if args.only:
        cells = [c for c in cells if re.search(args.only, c.label)]
    root = tempfile.mkdtemp(prefix="toolkit-matrix-bench-")
    cores = os.cpu_count() or 1
    runs = [("warm pool", dict(warm=True))]
    if not args.skip_cold:
        runs.insert(0, ("a fresh Python per cell", dict(warm=False)))
    runs.append(
        (
            "submitit local",
            dict(
                executor="submitit",
                cluster="local",
                cpus_per_cell=max(1, cores // args.workers),
                cells_per_job=math.ceil(len(cells) / args.workers),
            ),
        )
    )
    times: dict[str, float] = {}
    result = None
    try:
        for name, kw in runs:
            out = os.path.join(root, name.replace(" ", "-"))
            t = time.perf_counter()
            r = sweep(cells, out=out, workers=args.workers, progress=False, **kw)
            times[name] = time.perf_counter() - t
            result = result or r
            print(f"  {name:26} {times[name]:6.1f} s  {r}", flush=True)
        t = time.perf_counter()
        sweep(cells, out=os.path.join(root, "warm-pool"), workers=args.workers, progress=False)
        rerun = time.perf_counter() - t
        command = [sys.executable, "-m", "toolkit", "matrix", "--out", os.path.join(root, "warm-pool"), "--no-progress"]
        command += ["--only", args.only] if args.only else []
        cli = []
        for _ in range(2):
            t = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            cli.append(time.perf_counter() - t)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    n = len(result.rows)
    base = times["warm pool"]
    print(f"\nquick sweep: {n} cells, {args.workers} workers, {cores} cores")
    print(f"  {'executor':26} {'seconds':>8} {'cells/min':>10} {'vs warm pool':>13}")
    for name, s in times.items():
        print(f"  {name:26} {s:8.1f} {n / (s / 60):10.1f} {s / base:12.2f}x")
    print(f"  {'re-run (all cached)':26} {rerun:8.2f} {'':>10} {rerun / base:12.3f}x")
    print(f"  {'command line, re-rendered':26} {cli[0]:8.2f} {'':>10} {cli[0] / base:12.3f}x")
    print(f"  {'command line, stamped':26} {cli[1]:8.2f} {'':>10} {cli[1] / base:12.3f}x")
    print(
        f"targets: warm pool from empty <= 60 s ({'met' if base <= 60 else 'NOT met'}), "
        f"re-run <= 3 s ({'met' if rerun <= 3 else 'NOT met'}), "
        f"command line's re-run <= 1.5 s ({'met' if cli[1] <= 1.5 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
