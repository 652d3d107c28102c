"""Subprocess entry for `run(isolate=True)`: read a Scenario, write its Report; a crash here cannot reach the caller."""

import sys


def main(spec: str, out: str, stage_file: str) -> int:
    from .runner import Scenario, run

    def on_stage(name: str) -> None:
        with open(stage_file, "w") as f:
            f.write(name)

    with open(spec) as f:
        scenario = Scenario.from_json(f.read())
    report = run(scenario, on_stage=on_stage)
    with open(out + ".tmp", "w") as f:
        f.write(report.to_json())
    import os

    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:4]))
