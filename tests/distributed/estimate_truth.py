"""Run under `torchrun` (gloo, 127.0.0.1): per rank, what a real FSDP2 step keeps for backward and peaks at, by the
independent truth of tests/_truth.py (outer saved-tensor hooks; the profiler's allocation events), for the setups
tests/test_plan.py estimates at the same world size; writes `rank{R}.json` into the folder given as argv[1]."""

import pathlib
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from _helpers import write_rank_rows  # noqa: E402
from _truth import Truth, cpu_peaks, patch_sac_contexts  # noqa: E402

import toolkit as tk  # noqa: E402
import toolkit.transforms.policies as policies  # noqa: E402
from toolkit.transforms.fsdp import apply_fsdp  # noqa: E402

SETUPS = [  # (experts_impl, AC mode, compile backend or None, reshard_after_forward)
    ("grouped_mm", "none", None, True),
    ("grouped_mm", "full", None, True),
    ("grouped_mm", "selective_op", None, True),
    ("grouped_mm", "full", None, False),
    ("masked", "none", "aot_eager", True),
    ("masked", "full", "aot_eager", True),
]


def config(impl: str) -> tk.ModelConfig:
    return tk.ModelConfig(experts_impl=impl, dtype="bfloat16" if impl == "grouped_mm" else "float32")


def main(out: str) -> int:
    dist.init_process_group("gloo")
    rows = []
    for impl, ac, backend, reshard in SETUPS:
        torch._dynamo.reset()
        cfg = config(impl)
        model = tk.build_model(cfg)
        tk.apply_ac(model, tk.ACConfig.of(mode=ac))
        if backend:
            tk.apply_compile(model, tk.CompileConfig(scope="blocks", backend=backend))
        apply_fsdp(model, "blocks", reshard_after_forward=reshard)
        tokens, labels = tk.make_batch(cfg)

        def step():
            tk.models.loss_fn(model(tokens), labels).backward()

        with tk.transforms.torch_settings(model):
            step()  # the first step compiles
            model.zero_grad(set_to_none=True)
            truth = Truth(model)
            with patch_sac_contexts(truth, policies), truth:
                output = model(tokens)
                sizes = truth.sizes(output)
            tk.models.loss_fn(output, labels).backward()
            del output
            model.zero_grad(set_to_none=True)
            raw, outliving = cpu_peaks(step)
            model.zero_grad(set_to_none=True)
            _, main_thread = cpu_peaks(step, main_thread_only=True)
        rows.append(
            {"impl": impl, "ac": ac, "backend": backend, "reshard": reshard, "saved": sum(sizes), "sizes": sizes}
            | {"raw": raw, "outliving": outliving, "main_thread": main_thread}
        )
    write_rank_rows(out, rows)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
