"""Sweeping your own model: a `matrix --model` sweep of a transformers family, cold and cached, and one cell's cost
against the same cell built by the transformers stack.

    python benchmarks/your_model_sweep.py [--out DIR] [--family qwen3_moe]

Writes a `build()` file for a tiny transformers model (the one `TransformersConfig(family=...)` describes, built
from its config object with its own checkpointing switch left to the sweep) and runs
`python -m toolkit matrix --model FILE:build --full --backend eager --backend aot_eager` twice into one folder:
cold (every cell measured, warm fork server) and cached (nothing to run: the folder's stamp). Then the same cell
(full AC, blocks compiled, aot_eager) through `stack="user"` and `stack="transformers"`, three times each in this
process, median. Prints the times and their ratios, measured in this run; nothing is asserted.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

BUILD = """
import torch
from transformers import AutoModelForCausalLM

from toolkit.stacks.transformers import TransformersConfig, hf_config, make_batch


def build():
    cfg = TransformersConfig(family={family!r})
    model = AutoModelForCausalLM.from_config(hf_config(cfg)).train()
    ids = make_batch(cfg)
    return model, {{"input_ids": ids, "labels": ids}}
"""


def _matrix(args: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "toolkit", "matrix", *args], capture_output=True, text=True)
    if done.returncode not in (0, 3):
        raise SystemExit(done.stderr[-3000:])
    return time.perf_counter() - t0, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="sweep folder (default: a temporary one)")
    parser.add_argument("--family", default="qwen3_moe")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(args.out or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        model_file = folder / "hf_model.py"
        model_file.write_text(BUILD.format(family=args.family))
        spec = f"{model_file}:build"
        sweep = ["--model", spec, "--full", "--backend", "eager", "--backend", "aot_eager", "--out", str(folder / "m")]
        cold, out = _matrix([*sweep, "--no-progress"])
        cells = next((line for line in out.splitlines() if line.startswith("MatrixResult:")), out[-300:])
        cached, _ = _matrix([*sweep, "--no-progress"])
        print(f"matrix --model ({args.family}): {cells}")
        print(f"  cold   {cold:7.1f} s")
        print(f"  cached {cached:7.1f} s   (cold / cached = {cold / cached:.0f}x)")

        import toolkit as tk
        from toolkit.stacks.transformers import TransformersConfig
        from toolkit.stacks.user import UserModelConfig

        common = dict(
            ac=tk.ACConfig.of(mode="full"),
            compile=tk.CompileConfig(scope="blocks", backend="aot_eager"),
            steady_steps=0,
        )
        scenarios = {
            "user": tk.Scenario(stack="user", model=UserModelConfig(build=spec), **common),
            "transformers": tk.Scenario(stack="transformers", model=TransformersConfig(family=args.family), **common),
        }
        times: dict[str, list[float]] = {name: [] for name in scenarios}
        for _ in range(3):
            for name, scenario in scenarios.items():
                t0 = time.perf_counter()
                tk.run(scenario)
                times[name].append(time.perf_counter() - t0)
        user, hf = (statistics.median(times[n]) for n in ("user", "transformers"))
        print("one cell (full AC, blocks compiled, aot_eager), median of 3 in one process:")
        print(f"  stack='user'         {user:6.2f} s")
        print(f"  stack='transformers' {hf:6.2f} s   (user / transformers = {user / hf:.2f})")


if __name__ == "__main__":
    main()
