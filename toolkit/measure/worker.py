"""Subprocess entry for `run(isolate=True)`: read a Scenario, write its Report; a crash here cannot reach the caller."""

import os
import signal
import sys
import time


def main(spec: str, out: str, stage_file: str) -> int:
    from .runner import run
    from .scenario import Scenario

    # Fault injection for tests of the isolation itself: TOOLKIT_WORKER_FAULT=abort|segv|hang[@stage].
    fault, _, fault_stage = os.environ.get("TOOLKIT_WORKER_FAULT", "").partition("@")

    def on_stage(name: str) -> None:
        with open(stage_file, "w") as f:
            f.write(name)
        if fault and name == (fault_stage or "forward"):
            if fault == "abort":
                os.abort()
            if fault == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            if fault == "hang":
                time.sleep(3600)

    if os.environ.get("TOOLKIT_THREADS"):
        import torch

        torch.set_num_threads(int(os.environ["TOOLKIT_THREADS"]))
    with open(spec) as f:
        scenario = Scenario.from_json(f.read())
    report = run(scenario, on_stage=on_stage)
    with open(out + ".tmp", "w") as f:
        f.write(report.to_json())
    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
