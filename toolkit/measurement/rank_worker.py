"""One rank of `run_distributed`: join the torchrun process group (gloo), measure the scenario, write `rank{R}.json`."""

import pathlib
import sys


def main(spec: str, out: str) -> int:
    import torch.distributed as dist

    from .local import run_here
    from .scenario import Scenario

    dist.init_process_group("gloo")
    try:
        report = run_here(Scenario.from_json(pathlib.Path(spec).read_text()))
        path = pathlib.Path(out, f"rank{dist.get_rank()}.json")
        path.with_suffix(".tmp").write_text(report.to_json())
        path.with_suffix(".tmp").replace(path)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
