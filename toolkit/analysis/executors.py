"""Where a sweep's cells run: this machine, Slurm (submitit) or Ray; each cell one isolated Report.

Where a sweep's cells run — this machine (`LocalExecutor`: warm or cold workers), a Slurm cluster (`SubmititExecutor`)
or a Ray cluster (`RayExecutor`) — each cell one isolated subprocess, one Report.

Every executor yields `(job, report)` as cells finish; the sweep writes them into `results.jsonl` by cell key, so
resume, dedupe and the `kill -9` guarantees are the same wherever a cell ran. A cell lost on the way (a node
preempted or gone, a Slurm time limit, a Ray worker killed) comes back as a `crashed` Report naming why; the next
sweep retries it.
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import os
import pathlib
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, cast

from .._config import ConfigError, check_int
from ..execution import run
from ..execution.isolate import crashed_report, kill_live
from ..measurement import Report, Scenario
from .cells import Cell

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

EXECUTORS = ("local", "submitit", "ray")


@dataclass(frozen=True)
class Job:
    """One cell to measure: its cache key, the cell, and the time limit it runs under."""

    key: str
    cell: Cell
    timeout_s: float | None

    def scenario(self) -> Scenario:
        return self.cell.scenario()


class Executor:
    """Runs jobs and yields `(job, report)` in the order they finish. `folder` is the sweep's output folder."""

    name: ClassVar[str] = ""

    def run(self, jobs: list[Job], folder: pathlib.Path | None) -> Iterator[tuple[Job, Report]]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


# ------------------------------------------------------------------------------------------------------- local


@dataclass(frozen=True, kw_only=True)
class LocalExecutor(Executor):
    """`workers` cells at a time on this machine. `warm=True`: a fork server imports torch once and forks a fresh
    child per cell (`toolkit.execution.forkserver`); `warm=False`: a fresh Python per cell."""

    name: ClassVar[str] = "local"
    workers: int = 1
    """Cells run side by side; each gets `cores // workers` intra-op threads."""
    warm: bool = True
    """Fork each cell from a pre-imported server (Linux); off, or elsewhere, a fresh Python per cell."""
    runner: Callable[[Scenario], Report] | None = None
    """Measures one scenario instead of the isolated run (tests, custom measurement)."""

    def __post_init__(self) -> None:
        check_int("LocalExecutor", "workers", self.workers, 1, 1024)

    def describe(self) -> str:
        if self.runner is not None:
            return f"local ({self.workers} workers, custom runner)"
        return f"local ({self.workers} workers, {'warm pool' if self._warm_ok() else 'a fresh Python per cell'})"

    def _warm_ok(self) -> bool:
        from ..execution.forkserver import WarmPool

        return self.warm and WarmPool.available() is None

    def run(self, jobs: list[Job], folder: pathlib.Path | None) -> Iterator[tuple[Job, Report]]:
        threads = max(1, (os.cpu_count() or 1) // self.workers)
        pool = None
        if self.runner is not None:
            one = lambda job: self.runner(job.scenario())  # noqa: E731
        else:
            one = lambda job: run(job.scenario(), isolate=True, timeout_s=job.timeout_s, threads=threads)  # noqa: E731
            if self._warm_ok() and jobs:
                from ..execution.forkserver import WarmPool

                pool = WarmPool()
                try:
                    pool.start()
                    # Only once the pool started, and `pool` is not reset after: never None when `one` runs.
                    one = lambda job: cast(WarmPool, pool).run(job.scenario(), job.timeout_s, threads)  # noqa: E731
                except (RuntimeError, OSError) as e:  # the cells still run, each in a fresh Python
                    print(f"warning: {e}; running each cell in a fresh Python instead", file=sys.stderr)
                    pool = None
        ex = futures.ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="toolkit-cell")
        todo = {ex.submit(one, job): job for job in jobs}
        finished = False
        try:
            for fut in futures.as_completed(todo):
                yield todo[fut], fut.result()
            finished = True
        finally:
            if not finished:  # interrupted: stop what is queued and kill what runs, then let the threads end
                for fut in todo:
                    fut.cancel()
                kill_live()
            if pool is not None:
                pool.close()
            ex.shutdown(wait=True)


# ------------------------------------------------------------------------------------------------ remote cells


def run_chunk(
    cells: list[tuple[str, dict, float | None]], threads: int | None, sweep: tuple[str, int] | None = None
) -> list[tuple[str, dict]]:
    """Run on a node (a Slurm task, a Ray worker): each `(key, cell dict, timeout_s)` as its own isolated
    subprocess; returns `(key, report dict)` pairs. `sweep` = (host, pid) of the sweep: on that same host (submitit's
    local executor) the task exits when the sweep dies, so a `kill -9` leaves nothing running."""
    if sweep is not None and sweep[0] == socket.gethostname():
        _watch(sweep[1])
    pool = None
    if len(cells) > 1:
        from ..execution.forkserver import WarmPool

        if WarmPool.available() is None:
            pool = WarmPool()  # several cells in one task: import torch once for all of them
    out = []
    try:
        for key, cell, timeout_s in cells:
            scenario = Cell(**cell).scenario()
            report = (
                pool.run(scenario, timeout_s, threads)
                if pool is not None
                else run(scenario, isolate=True, timeout_s=timeout_s, threads=threads)
            )
            out.append((key, report.to_dict()))
    finally:
        if pool is not None:
            pool.close()
    return out


def _watch(pid: int) -> None:
    def watch() -> None:
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                os._exit(1)  # the sweep is gone: its cells' workers die with this process (PR_SET_PDEATHSIG)
            except PermissionError:
                pass
            time.sleep(0.5)

    threading.Thread(target=watch, daemon=True, name="toolkit-sweep-watch").start()


def _chunks(jobs: list[Job], size: int) -> list[list[Job]]:
    return [jobs[i : i + size] for i in range(0, len(jobs), size)]


def _payload(chunk: list[Job]) -> list[tuple[str, dict, float | None]]:
    return [(j.key, j.cell.to_dict(), j.timeout_s) for j in chunk]


def _lost(chunk: list[Job], why: str) -> Iterator[tuple[Job, Report]]:
    for job in chunk:
        yield job, crashed_report(job.scenario(), why, "submit")


def _reports(chunk: list[Job], result: list[tuple[str, dict]], where: str) -> Iterator[tuple[Job, Report]]:
    got = dict(result)
    for job in chunk:
        if job.key in got:
            yield job, Report.from_dict(got[job.key])
        else:
            yield from _lost([job], f"{where} returned no report for this cell")


# ---------------------------------------------------------------------------------------------------- submitit


@dataclass(frozen=True, kw_only=True)
class SubmititExecutor(Executor):
    """Slurm through submitit: one array job, `cells_per_job` cells per task. Where there is no Slurm
    (`cluster=None` finds none, or `cluster="local"`), submitit runs the same tasks as local processes."""

    name: ClassVar[str] = "submitit"
    cluster: str | None = None
    """None: Slurm when `sbatch` is found, else local processes; or "slurm", "local", "debug" (in process)."""
    folder: str | None = None
    """submitit's logs and pickles; default `OUT/submitit`."""
    partition: str | None = None
    """Slurm partition (`--partition`)."""
    time_min: int = 60
    """Time limit of each task in minutes (Slurm `--time`); a task past it is lost and its cells `crashed`."""
    gpus_per_cell: int = 0
    """GPUs per task (Slurm `--gpus-per-node`)."""
    cpus_per_cell: int = 2
    """CPUs per task (Slurm `--cpus-per-task`); also the cells' intra-op threads."""
    cells_per_job: int = 1
    """Cells per array task, run one after another (each isolated; torch imported once per task)."""
    array_parallelism: int = 64
    """Array tasks running at once (Slurm `--array=...%N`)."""
    slurm: dict = field(default_factory=dict)
    """Any other submitit Slurm parameter, e.g. {"account": "...", "qos": "...", "constraint": "h100"}."""

    def __post_init__(self) -> None:
        own = "SubmititExecutor"
        if self.cluster not in (None, "slurm", "local", "debug"):
            raise ConfigError(
                own,
                "cluster",
                f"{self.cluster!r} is not a submitit cluster.",
                "pass None (auto), 'slurm', 'local' or 'debug'.",
            )
        check_int(own, "time_min", self.time_min, 1)
        check_int(own, "gpus_per_cell", self.gpus_per_cell, 0)
        check_int(own, "cpus_per_cell", self.cpus_per_cell, 1)
        check_int(own, "cells_per_job", self.cells_per_job, 1)
        check_int(own, "array_parallelism", self.array_parallelism, 1)

    def _executor(self, folder: pathlib.Path | None):
        try:
            import submitit
        except ImportError as e:
            raise ConfigError(
                "SubmititExecutor",
                "cluster",
                f"submitit is not installed ({e}).",
                'pip install "toolkit[cluster]" (or pip install submitit).',
            ) from None
        where = pathlib.Path(self.folder) if self.folder else (folder or pathlib.Path("matrix-out")) / "submitit"
        ex = submitit.AutoExecutor(folder=str(where / "%j"), cluster=self.cluster)
        params: dict[str, Any] = dict(
            timeout_min=self.time_min,
            gpus_per_node=self.gpus_per_cell,
            cpus_per_task=self.cpus_per_cell,
            tasks_per_node=1,
            nodes=1,
            name="toolkit-matrix",
            slurm_array_parallelism=self.array_parallelism,
        )
        if self.partition:
            params["slurm_partition"] = self.partition
        params.update({k if k.startswith("slurm_") else f"slurm_{k}": v for k, v in self.slurm.items()})
        ex.update_parameters(**params)
        return ex

    def describe(self) -> str:
        return f"submitit ({self.cluster or 'auto'}, {self.cells_per_job} cells per task)"

    def run(self, jobs: list[Job], folder: pathlib.Path | None) -> Iterator[tuple[Job, Report]]:
        ex = self._executor(folder)
        me = (socket.gethostname(), os.getpid())
        chunks = _chunks(jobs, self.cells_per_job)
        pending: dict[Any, list[Job]] = {}
        waiting = list(chunks)
        if getattr(ex, "cluster", "slurm") == "slurm":
            with ex.batch():  # one Slurm array for the whole sweep; Slurm schedules it
                pending = {ex.submit(run_chunk, _payload(c), self.cpus_per_cell, me): c for c in waiting}
            waiting = []
        # Without Slurm, submitit runs each task as a local process, all at once (a load of 52 on 2 cores): this
        # machine's cores decide how many run together, as for the local executor.
        at_once = max(1, (os.cpu_count() or 1) // self.cpus_per_cell)
        try:
            while pending or waiting:
                while waiting and len(pending) < at_once:
                    chunk = waiting.pop(0)
                    pending[ex.submit(run_chunk, _payload(chunk), self.cpus_per_cell, me)] = chunk
                finished = [j for j in pending if j.done()]
                if not finished:
                    time.sleep(0.2)
                    continue
                for sj in finished:
                    chunk = pending.pop(sj)
                    try:
                        result = sj.result()
                    except Exception as e:  # the task itself was lost: preempted, timed out, node failure
                        yield from _lost(chunk, f"submitit job {sj.job_id} lost: {_first_line(e)}")
                        continue
                    yield from _reports(chunk, result, f"submitit job {sj.job_id}")
        finally:
            for sj in pending:  # interrupted: don't leave tasks queued or running for a sweep that is gone
                try:
                    sj.cancel(check=False)
                except Exception as e:  # whatever the scheduler raises: the sweep is ending either way
                    _cancel_failed(f"submitit job {sj.job_id}", e)


def _cancel_failed(what: str, e: BaseException) -> None:
    """One line on stderr: a task the ending sweep could not cancel may still be running on the cluster."""
    print(f"warning: could not cancel {what} ({_first_line(e)}); it may still run: cancel it by hand", file=sys.stderr)


def _first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # submitit puts the remote traceback first; the last line is what went wrong.
    return (lines[-1] if len(lines) > 1 else lines[0])[:300] if lines else type(e).__name__


# --------------------------------------------------------------------------------------------------------- ray


@dataclass(frozen=True, kw_only=True)
class RayExecutor(Executor):
    """A Ray cluster: one task per `cells_per_task` cells; GPU cells request `num_gpus=1`, CPU cells none.
    `address` is an existing cluster's (`ray start --head` prints it; "auto" finds one on this machine); None starts
    a private single-machine Ray."""

    name: ClassVar[str] = "ray"
    address: str | None = None
    """The cluster to join, e.g. "ray://head:10001" or "auto"; None: start Ray on this machine only."""
    cpus_per_cell: int = 1
    """CPUs each task requests; also the cells' intra-op threads."""
    cells_per_task: int = 1
    """Cells per Ray task, run one after another (each isolated)."""
    init: dict = field(default_factory=dict)
    """Extra `ray.init` arguments (e.g. {"runtime_env": {...}})."""

    def __post_init__(self) -> None:
        check_int("RayExecutor", "cpus_per_cell", self.cpus_per_cell, 1)
        check_int("RayExecutor", "cells_per_task", self.cells_per_task, 1)

    def describe(self) -> str:
        return f"ray ({self.address or 'this machine'})"

    def run(self, jobs: list[Job], folder: pathlib.Path | None) -> Iterator[tuple[Job, Report]]:
        try:
            import ray
        except ImportError as e:
            raise ConfigError(
                "RayExecutor",
                "address",
                f"ray is not installed ({e}).",
                'pip install "ray[default]>=2.60" on every machine of the cluster, or use --executor submitit / local.',
            ) from None
        started = not ray.is_initialized()
        if started:
            # A private Ray needs no dashboard; an existing cluster keeps whatever it was started with.
            own = {"include_dashboard": False} if self.address is None else {}
            ray.init(address=self.address, **{**own, "log_to_driver": False, **self.init})
        task = ray.remote(max_retries=0)(run_chunk)  # a lost cell is recorded `crashed`; the next sweep retries it
        refs = {}
        for chunk in _chunks(jobs, self.cells_per_task):
            gpu = any(j.scenario().model_config.device_type == "cuda" for j in chunk)
            ref = task.options(num_cpus=self.cpus_per_cell, num_gpus=1 if gpu else 0).remote(
                _payload(chunk), self.cpus_per_cell, None
            )
            refs[ref] = chunk
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1)
                for ref in done:
                    chunk = refs.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as e:  # worker or node died, task cancelled
                        yield from _lost(chunk, f"ray task lost: {_first_line(e)}")
                        continue
                    yield from _reports(chunk, result, "ray task")
        finally:
            for ref in refs:
                try:
                    ray.cancel(ref, force=True)
                except Exception as e:  # whatever Ray raises (a task already done, a node gone): the sweep ends
                    _cancel_failed(f"ray task {ref}", e)
            if started:
                ray.shutdown()


_CLASSES: dict[str, type[Executor]] = {"local": LocalExecutor, "submitit": SubmititExecutor, "ray": RayExecutor}


def _check_options(executor: str, options: dict[str, Any]) -> None:
    """An option the chosen executor does not read would be dropped without a word (`partition=` on the local
    executor): refuse it, naming the executor that reads it."""
    chosen = cast("type[DataclassInstance]", _CLASSES[executor])  # every executor class but the base is a dataclass
    own = {f.name for f in dataclasses.fields(chosen)} - {"workers", "warm", "runner"}
    for name in options:
        if name in own:
            continue
        readers = [
            n
            for n, cls in _CLASSES.items()
            if n != executor and name in {f.name for f in dataclasses.fields(cast("type[DataclassInstance]", cls))}
        ]
        where = f"an option of executor={readers[0]!r}" if readers else "not an option of any executor"
        mine = ", ".join(sorted(own)) or "none besides workers and warm"
        raise ConfigError(
            "sweep",
            name,
            f"is {where}, not of executor={executor!r}, which would ignore it.",
            (f"pass executor={readers[0]!r}, or drop {name}=." if readers else f"use {executor!r}'s options: {mine}."),
        )


def make(
    executor: str | Executor,
    *,
    workers: int = 1,
    warm: bool = True,
    runner: Callable[[Scenario], Report] | None = None,
    **options: Any,
) -> Executor:
    """An Executor from its name (`local`, `submitit`, `ray`) and options, or the one given."""
    if isinstance(executor, Executor):
        if runner is not None and not isinstance(executor, LocalExecutor):
            raise ConfigError(
                "sweep",
                "runner",
                "a custom runner only runs on this machine.",
                "drop runner=, or use executor='local'.",
            )
        given = [*options, *(["workers"] if workers != 1 else []), *(["warm"] if warm is not True else [])]
        if given:
            raise ConfigError(
                "sweep",
                given[0],
                f"is given beside an Executor instance ({type(executor).__name__}), which has its options already "
                "and would ignore it.",
                f"set it on the executor, e.g. {type(executor).__name__}({given[0]}=...), and drop it here.",
            )
        return executor
    if isinstance(executor, str) and executor in _CLASSES:
        _check_options(executor, options)
    if executor in ("submitit", "ray"):
        from .._extras import EXTRAS, available

        local_only = [*(["workers"] if workers != 1 else []), *(["warm"] if warm is not True else [])]
        if local_only:
            raise ConfigError(
                "sweep",
                local_only[0],
                f"is an option of executor='local'; {executor} runs the cells as jobs of its own and would ignore it.",
                f"drop {local_only[0]}=, or use executor='local'.",
            )
        if not available(executor):  # before the sweep makes its folder
            raise ConfigError("sweep", "executor", f"{executor} is not installed.", EXTRAS[executor].install + ".")
    if executor == "local":
        return LocalExecutor(workers=workers, warm=warm, runner=runner)
    if runner is not None:
        raise ConfigError(
            "sweep", "runner", "a custom runner only runs on this machine.", "drop runner=, or use executor='local'."
        )
    if executor == "submitit":
        return SubmititExecutor(**options)
    if executor == "ray":
        return RayExecutor(**options)
    raise ConfigError(
        "sweep",
        "executor",
        f"{executor!r} is not an executor.",
        f"pass one of {', '.join(map(repr, EXECUTORS))}, or an Executor instance.",
    )
