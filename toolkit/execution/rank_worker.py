"""One rank of `run_distributed` (join the torchrun process group, measure, write `rank{R}.json`), and the launcher
that runs torchrun for it: every process dies with the one that started it, on every exit path (kill -9 included)."""

import os
import pathlib
import runpy
import sys

from .. import _files
from . import channel


def main(spec: str, out: str) -> int:
    import torch.distributed as dist

    from ..measurement.scenario import Scenario
    from .local import run_here

    channel.watch_parent(int(os.environ[channel.PARENT_ENV]))  # torchrun, which the launcher below runs
    dist.init_process_group("gloo")
    try:
        report = run_here(Scenario.from_json(_files.read_capped(spec, "Scenario", "", name="the scenario file")))
        path = pathlib.Path(out, f"rank{dist.get_rank()}.json")
        _files.write_text(path, report.to_json())  # whole or not at all: the launcher reads only finished reports
    finally:
        dist.destroy_process_group()
    return 0


def launch(argv: list[str]) -> None:
    """torchrun with `argv`, in this process: it dies with the toolkit process that started it (PARENT_ENV), and its
    ranks with it (they watch this pid; torchrun starts each in a session of its own, out of reach of a signal to
    this process group)."""
    channel.watch_parent(int(os.environ[channel.PARENT_ENV]))
    os.environ[channel.PARENT_ENV] = str(os.getpid())
    sys.argv = ["torchrun", *argv]
    runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--launch"]:
        launch(sys.argv[2:])
    else:
        raise SystemExit(main(*sys.argv[1:3]))
