"""Every compiled estimate against a real CPU step: expert type × dropout × AC mode × order × compile scope × backend.

    python benchmarks/estimate_grid.py [--experts IMPL ...] [--backends BACKEND ...] [--scopes SCOPE ...]
        [--dropout P ...]

tests/test_estimate.py checks a chosen slice of this grid in CI (each mode once under inductor, the orders and
scopes that differ); this runs all of it, in one process, by the tests' own comparison (`_assert_exact`'s): saved
storages op for op against an outer `saved_tensors_hooks` on the real step, the peak against the storages alive
past the op that made them, and the profiler's raw peak beside it. The models are the tests' two: bf16 `grouped_mm`
experts in both blocks, and fp32 `masked` experts with a dense first block, each without and with residual
dropout (p=0.1: the cells whose compiled checkpoints stash an RNG state per random op). A combination the toolkit
refuses (remat with AC outside the compiled block) is printed with its refusal. One line per combination, its
seconds, then the counts. Run two at once, one per core, split by --experts.
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import sys
import time

MODES = ("none", "full", "selective_op", "selective_layer", "memory_budget", "remat")
ORDERS = (None, "ac_outside")
SCOPES = ("blocks", "model", "moe", "attention")
BACKENDS = ("aot_eager", "inductor")
EXPERTS = ("grouped_mm", "masked")
DROPOUT = (0.0, 0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experts", nargs="+", choices=EXPERTS, default=list(EXPERTS))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--scopes", nargs="+", choices=SCOPES, default=list(SCOPES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--dropout", nargs="+", type=float, default=list(DROPOUT))
    args = parser.parse_args(argv)

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    import torch
    from test_estimate import GROUPED, MASKED, _compare, _compiled, _eager_masked_slices

    import toolkit as tk

    counts = {"exact": 0, "peak off": 0, "refused": 0, "SAVED DIFFERS": 0, "ERROR": 0}
    start = time.perf_counter()
    print(f"torch {torch.__version__}")
    print(
        f"{'experts':10} {'dropout':7} {'backend':9} {'scope':9} {'AC mode':15} {'order':10} verdict   seconds  "
        "saved B (RNG stash B) / peak B"
    )
    for impl, p, backend, scope, mode, order in itertools.product(
        args.experts, args.dropout, args.backends, args.scopes, args.modes, ORDERS
    ):
        cfg = {"grouped_mm": GROUPED, "masked": MASKED}[impl].replace(residual_dropout=p)
        label = f"{impl:10} {p:<7} {backend:9} {scope:9} {mode:15} {order or 'default':10}"
        t0 = time.perf_counter()
        try:
            scenario = _compiled(cfg, mode, backend=backend, scope=scope, order=order)
            c = _compare(scenario, _eager_masked_slices(cfg, scope))
        except tk.ConfigError as e:
            verdict, detail = "refused", str(e).split(". Fix:")[0][:110]
        except Exception as e:  # noqa: BLE001 - one combination's crash is a result, the grid goes on
            verdict, detail = "ERROR", f"{type(e).__name__}: {e}"[:300]
        else:
            # The tests' rule (`Compared`): saved storages equal op for op, the peak equals the real step's storages
            # that outlive their op (plus what only fake tensors hold); raw is the profiler's every allocation.
            est, off = c.est, c.peak_off
            verdict = "exact" if c.saved_equal and off == 0 else ("peak off" if c.saved_equal else "SAVED DIFFERS")
            detail = (
                f"{est.saved_bytes} vs {sum(c.sizes)} ({est.rng_state_bytes}) / {est.peak_bytes} vs {c.outliving} "
                f"outliving ({off:+d} B, {off / c.outliving:+.4%}), {c.raw} raw: {c.raw - c.outliving} B of kernel "
                f"scratch the estimate leaves out ({(c.raw - est.peak_bytes) / c.raw:+.2%})"
            )
        counts[verdict] += 1
        print(f"{label} {verdict:9} {time.perf_counter() - t0:6.1f}  {detail}", flush=True)
    print(f"{counts} in {time.perf_counter() - start:.0f} s")
    return 1 if counts["SAVED DIFFERS"] or counts["ERROR"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
