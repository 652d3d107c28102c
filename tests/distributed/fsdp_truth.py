"""Run under `torchrun` (gloo, 127.0.0.1): per rank, FSDP2-sharded models measured by `toolkit.measurement` and by the
independent truth of tests/_truth.py; writes `rank{R}.json` into the folder given as argv[1]."""

import pathlib
import sys

import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from _helpers import write_rank_rows  # noqa: E402
from _truth import Truth, patch_sac_contexts  # noqa: E402

import toolkit as tk  # noqa: E402
import toolkit.transforms.policies as policies  # noqa: E402


def sharded(ac: str, backend: str | None):
    from torch.distributed.fsdp import fully_shard

    cfg = tk.ModelConfig(n_layers=2, experts_impl="masked")
    model = tk.build_model(cfg)
    tk.apply_ac(model, tk.ACConfig.of(mode=ac))
    if backend:
        tk.apply_compile(model, tk.CompileConfig(scope="blocks", backend=backend, fullgraph=True))
    for block in model.layers.values():
        m = fully_shard(block)
        if hasattr(m, "set_force_sum_reduction_for_comms"):
            m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM / AVG reduce-scatter
    root = fully_shard(model)
    if hasattr(root, "set_force_sum_reduction_for_comms"):
        root.set_force_sum_reduction_for_comms(True)
    return model, tk.make_batch(cfg.replace(seed=dist.get_rank()))


def main(out: str) -> int:
    dist.init_process_group("gloo")
    rows = []
    for ac in ("none", "full", "selective_op"):
        for backend in (None, "aot_eager"):
            model, batch = sharded(ac, backend)
            with tk.transforms.torch_settings(model):
                truth = Truth(model)
                with patch_sac_contexts(truth, policies), truth:
                    output = model(batch.tokens)
                    true_bytes = truth.bytes(output)
                tk.models.loss_fn(output, batch.labels).backward()
                del output
            report = tk.measure(model, batch.tokens, loss_fn=lambda o: tk.models.loss_fn(o, batch.labels))
            rows.append(
                {
                    "ac": ac,
                    "backend": backend or "eager",
                    "outcome": report.outcome,
                    "error": report.error.message[:500] if report.error else "",
                    "saved": report.saved.total_bytes,
                    "truth": true_bytes,
                    "by_kind": report.saved.by_kind,
                    "graphs": report.compile.graphs,
                    "peak": report.memory.peak_bytes,
                }
            )
    write_rank_rows(out, rows)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
