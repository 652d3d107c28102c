"""The prepared GPU check: run a fixed set of scenarios on CUDA and on CPU, print CUDA/CPU ratios, write JSON.

    python benchmarks/gpu_validation.py [--out gpu_validation.json] [--quick]

Meant for the few sessions that are lent a GPU: one command, well under 5 minutes on one H200. Without CUDA it
says so and exits 0. Per scenario it prints the measured CUDA peak and saved bytes next to the same scenario's CPU
measurement and next to `tk.estimate` (fake tensors, CUDA rounding; compiled ones follow the CPU lowering, so
inductor's Triton fusion may differ in temporaries; a scenario it refuses says why in the JSON), as ratios (CUDA picks
other attention kernels, so ratios near but not exactly 1 are expected), the attention kernel CUDA used, whether
gradients matched eager on the GPU, and the compile graphs/breaks. The first scenario also writes an allocator
snapshot (`--snapshot`, loadable at https://pytorch.org/memory_viz) and checks that it unpickles.
Not run yet on a GPU: the first session with one should run it and record the numbers in its notes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

import toolkit as tk


def scenarios(quick: bool) -> dict[str, tk.Scenario]:
    moe = tk.ModelConfig(
        n_layers=4,
        dim=256,
        n_heads=8,
        moe_hidden=256,
        n_experts=8,
        seq_len=512,
        batch=4,
        dtype="bfloat16",
        experts_impl="grouped_mm",
    )
    medium = moe.replace(n_layers=2, dim=1024, n_heads=16, moe_hidden=1024, n_experts=16, seq_len=2048, batch=2)
    out = {
        "bf16 grouped_mm, no AC": tk.Scenario(model=moe),
        "medium bf16 layer, selective_op": tk.Scenario(model=medium, ac=tk.ACConfig.of(mode="selective_op")),
        "bf16 grouped_mm, full AC": tk.Scenario(model=moe, ac=tk.ACConfig.of(mode="full")),
        "bf16 grouped_mm, selective_op": tk.Scenario(model=moe, ac=tk.ACConfig.of(mode="selective_op")),
        "bf16 grouped_mm, today's recipe (inductor)": tk.Scenario(
            model=moe, recipe="torchtitan_0_3_0", recipe_backend="inductor"
        ),
        "bf16 grouped_mm, full AC, compiled blocks (inductor)": tk.Scenario(
            model=moe, ac=tk.ACConfig.of(mode="full"), compile=tk.CompileConfig(scope="blocks", backend="inductor")
        ),
        "bf16 grouped_mm, memory budget 0.5 (inductor)": tk.Scenario(
            model=moe,
            ac=tk.ACConfig.of(mode="memory_budget", memory_budget=0.5),
            compile=tk.CompileConfig(scope="blocks", backend="inductor"),
        ),
    }
    if not quick:
        out["fp32 for_loop, C2 fallback"] = tk.Scenario(
            model=moe.replace(dtype="float32", experts_impl="for_loop"),
            ac=tk.ACConfig.of(mode="full"),
            compile=tk.CompileConfig(scope="blocks"),
        )
        out["flex attention, selective_op"] = tk.Scenario(
            model=moe.replace(attention="flex", device="cuda"), ac=tk.ACConfig.of(mode="selective_op")
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="gpu_validation.json")
    parser.add_argument("--quick", action="store_true", help="the first seven scenarios only")
    parser.add_argument("--snapshot", default="gpu_snapshot.pickle", help="allocator snapshot of the first scenario")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing to validate (this script is for sessions lent a GPU)")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    rows = []
    t0 = time.perf_counter()
    for i, (name, base) in enumerate(scenarios(args.quick).items()):
        snapshot = args.snapshot if i == 0 else None
        gpu = tk.run(base.replace(device="cuda", steady_steps=3, memory_snapshot=snapshot), isolate=True, timeout_s=240)
        est, refused = None, None
        try:  # compiled scenarios too: the estimate follows aot_eager's and inductor's partitions on fake tensors
            est = tk.estimate(base)
        except tk.ConfigError as e:  # what fake tensors cannot follow (for_loop experts, flex): said in the row
            refused = str(e)
        if base.model.attention == "flex":
            cpu = None  # FlexAttention has no CPU backward
        else:
            cpu = tk.run(
                base.replace(
                    device="cpu",
                    steady_steps=0,
                    check_numerics=False,
                    recipe_backend="aot_eager" if base.recipe else base.recipe_backend,
                ),
                isolate=True,
                timeout_s=240,
            )
        row = {
            "scenario": name,
            "gpu_outcome": gpu.outcome,
            "gpu_error": gpu.error.message[:300] if gpu.error else None,
            "gpu_peak": gpu.memory.peak_bytes,
            "gpu_saved": gpu.saved.total_bytes,
            "gpu_grads_match": gpu.numerics.grads_match,
            "gpu_graphs": gpu.compile.graphs,
            "gpu_breaks": gpu.compile.graph_breaks,
            "gpu_step_s": gpu.timing.steady_step_s,
            "cpu_peak": cpu.memory.peak_bytes if cpu else None,
            "cpu_saved": cpu.saved.total_bytes if cpu else None,
        }
        row["attention_ops"] = sorted(op for op in gpu.saved.by_op if "attention" in op)
        row["est_peak"], row["est_saved"] = (est.peak_bytes, est.saved_bytes) if est else (None, None)
        row["est_refused"] = refused
        row["est_peak_ratio"] = row["gpu_peak"] / est.peak_bytes if est and est.peak_bytes else None
        row["est_saved_ratio"] = row["gpu_saved"] / est.saved_bytes if est and est.saved_bytes else None
        if snapshot:
            import pickle

            with open(snapshot, "rb") as f:
                row["snapshot_segments"] = len(pickle.load(f).get("segments", []))
        row["peak_ratio"] = row["gpu_peak"] / row["cpu_peak"] if cpu and row["cpu_peak"] else None
        row["saved_ratio"] = row["gpu_saved"] / row["cpu_saved"] if cpu and row["cpu_saved"] else None
        rows.append(row)
        ratio = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
        print(
            f"{name:44} {gpu.outcome:6} peak {tk.measurement.fmt_bytes(row['gpu_peak']):>10} "
            f"(x{ratio(row['peak_ratio'])} CPU)  "
            f"saved {tk.measurement.fmt_bytes(row['gpu_saved']):>10} (x{ratio(row['saved_ratio'])} CPU)  "
            f"vs estimate peak x{ratio(row['est_peak_ratio'])} saved x{ratio(row['est_saved_ratio'])}  "
            f"grads {'match' if row['gpu_grads_match'] else 'DIFFER'}  {row['gpu_graphs']} graphs  "
            f"attention {','.join(row['attention_ops']) or '-'}"
        )
        sys.stdout.flush()
    with open(args.out, "w") as f:
        json.dump(
            {
                "torch": torch.__version__,
                "gpu": torch.cuda.get_device_name(0),
                "rows": rows,
                "seconds": time.perf_counter() - t0,
            },
            f,
            indent=2,
        )
    print(f"wrote {args.out} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
