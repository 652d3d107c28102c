"""`run(scenario)`: one measured step of a Scenario, in this process or isolated in a subprocess.

`run(scenario)`: one measured training step of a Scenario, in this process or isolated in a subprocess (a fresh Python,
or a child forked from the warm server), whose Report comes back the same either way.
"""

from __future__ import annotations

from typing import Callable

from .._config import MAX_THREADS, ConfigError, check_bool, check_instance, check_int, check_seconds
from ..measurement.report import Report
from ..measurement.scenario import Scenario
from .any_module import measure
from .local import run_here


def run(
    scenario: Scenario,
    *,
    isolate: bool = False,
    timeout_s: float | None = None,
    on_stage: Callable[[str], None] | None = None,
    threads: int | None = None,
) -> Report:
    """Build, transform and measure one training step. Errors come back as a Report, never as an exception
    (except an invalid Scenario, which fails when it is constructed). `isolate=True` runs it in a subprocess
    so a segfault, abort or hang comes back as `crashed` / `timeout`; `threads` caps its intra-op threads
    (several isolated runs side by side must share the cores, or OpenMP oversubscription slows each 10x).

    In process, `run` forgets Dynamo's compiled graphs before and after (its model's code objects are shared
    with every earlier run, whose cache entries would count as recompiles); `isolate=True` leaves this process
    untouched."""
    check_instance(
        "run", "scenario", scenario, Scenario, "pass a tk.Scenario(...) (or a preset: tk.measurement.preset(name))."
    )
    check_bool("run", "isolate", isolate)
    check_seconds("run", "timeout_s", timeout_s)
    if on_stage is not None and not callable(on_stage):
        raise ConfigError("run", "on_stage", f"{on_stage!r} is not callable.", "pass a function of the stage's name.")
    if threads is not None:
        check_int("run", "threads", threads, 1, MAX_THREADS, "intra-op threads")
    if timeout_s is not None and not isolate:
        raise ConfigError(
            "run",
            "timeout_s",
            "a time limit needs a subprocess to stop.",
            "pass isolate=True together with timeout_s, or drop timeout_s.",
        )
    if isolate:
        from .isolate import run_isolated

        return run_isolated(scenario, timeout_s, on_stage, threads)
    return run_here(scenario, on_stage)


__all__ = ["Scenario", "run", "measure"]
