"""Wall time of the quick composability sweep: cold, cells per minute, and the warm (all cached) re-run.

    python benchmarks/matrix_time.py [--workers 2] [--out DIR]

Targets on 2 CPU cores with aot_eager: cold <= 5 min, warm <= 20 s. The cold run starts from an empty
results folder; the warm run repeats the same command, so every cell comes from results.jsonl.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

from toolkit.analysis.matrix import quick_cells
from toolkit.analysis.sweeps import sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="toolkit-matrix-")
    shutil.rmtree(out, ignore_errors=True)
    cells = quick_cells()
    t = time.perf_counter()
    result = sweep(cells, out=out, workers=args.workers, progress=False)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    sweep(cells, out=out, workers=args.workers, progress=False)
    warm = time.perf_counter() - t
    print(f"quick sweep: {len(result.rows)} cells, {args.workers} workers")
    print(f"  cold: {cold:.1f} s ({len(result.rows) / (cold / 60):.1f} cells/min)  target <= 300 s")
    print(f"  warm (all cached): {warm:.1f} s  target <= 20 s")
    print(f"  {result}")


if __name__ == "__main__":
    main()
