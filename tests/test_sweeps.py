"""Sweeps as a new user runs them: limits, folders, kill -9, torn files, executors, progress and summary.

Sweeps as a new user runs them: limits, output folders, `kill -9`, torn files, two sweeps at once, the warm pool,
submitit's and Ray's executors, the progress bar and the summary.
"""

import fcntl
import json
import os
import pathlib
import pty
import shutil
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time

import psutil
import pytest
from _helpers import extra

import toolkit as tk
from toolkit.analysis.cells import Cell, full_cells
from toolkit.analysis.progress import Progress
from toolkit.analysis.store import load_results, merge_results
from toolkit.analysis.sweeps import sweep
from toolkit.execution.forkserver import WarmPool
from toolkit.execution.isolate import crashed_report, timeout_report

ROOT = pathlib.Path(tk.__file__).parents[1]
DENSE = Cell("dense")
DENSE_FULL = Cell("dense", "full")


def _env(**extra):
    # A terminal width of its own: the summary cuts its lines to the terminal, and pytest-xdist's workers say 80.
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "COLUMNS": "160"}
    env.update(extra)
    return env


def _cli(*args, timeout=600, **env):
    return subprocess.run(
        [sys.executable, "-m", "toolkit", "matrix", *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _fast(scenario):
    return tk.run(scenario.replace(check_numerics=False, measure_memory=False, steady_steps=0))


def _lines(path):
    return pathlib.Path(path).read_text().splitlines()


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------------------------------------ limits, folders


@pytest.mark.parametrize("bad", ["-1", "0", "nan", "inf"])
def test_invalid_time_limit_refused_before_anything_runs(tmp_path, bad):
    out = tmp_path / "out"
    p = _cli("--timeout-s", bad, "--out", str(out), timeout=120)
    assert p.returncode == 2
    assert "--timeout-s" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()  # nothing ran, nothing written


def test_invalid_limits_in_python_name_the_field(tmp_path):
    for kwargs, field in (
        (dict(timeout_s=0), "timeout_s"),
        (dict(timeout_s=-1), "timeout_s"),
        (dict(workers=0), "workers"),
    ):
        with pytest.raises(tk.ConfigError) as e:
            sweep([DENSE], out=tmp_path / "x", progress=False, runner=_fast, **kwargs)
        assert e.value.field == field and "Fix:" in str(e.value)
    assert not (tmp_path / "x").exists()
    with pytest.raises(tk.ConfigError) as e:
        sweep([DENSE], out=tmp_path / "x", progress=False, executor="slurm")
    assert e.value.field == "executor" and "'submitit'" in str(e.value)


def test_out_that_is_a_file_is_an_error_not_a_traceback(tmp_path):
    f = tmp_path / "taken"
    f.write_text("mine\n")
    p = _cli("--out", str(f), "--only", "^dense \\| AC none \\| eager", timeout=120)
    assert p.returncode == 2
    assert "is a file, not a folder" in p.stderr and "Traceback" not in p.stderr
    assert f.read_text() == "mine\n"


def test_read_only_out_fails_before_the_first_cell(tmp_path):
    calls = []

    def runner(scenario):
        calls.append(scenario.name)
        return _fast(scenario)

    with pytest.raises(tk.ConfigError) as e:
        sweep([DENSE], out="/proc/self/toolkit-out", progress=False, runner=runner)
    assert e.value.field == "out" and calls == []
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("no user+mount namespace here to make a read-only folder (root ignores chmod)")
    ro = tmp_path / "ro"
    ro.mkdir()
    # A real read-only folder: a tmpfs remounted read-only, in a mount namespace of our own.
    script = (
        f"mount -t tmpfs tmpfs {ro} && mkdir {ro}/out && mount -o remount,ro {ro} && "
        f"exec {sys.executable} -m toolkit matrix --only '^dense \\| AC none \\| eager' --out {ro}/out"
    )
    t = time.perf_counter()
    p = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2, p.stderr
    assert "cannot write into" in p.stderr and "Read-only file system" in p.stderr
    assert "Traceback" not in p.stderr and time.perf_counter() - t < 60  # refused up front, not after the sweep


# ---------------------------------------------------------------------------------------------- results.jsonl


def test_crashed_cells_retry_and_timeouts_are_keyed_by_their_limit(tmp_path):
    calls = []
    fail = {DENSE.label: "crash", DENSE_FULL.label: "timeout"}

    def runner(scenario):
        calls.append(scenario.name)
        how = fail.get(scenario.name)
        if how == "crash":
            return crashed_report(scenario, "killed by SIGKILL (-9)", "forward")
        if how == "timeout":
            return timeout_report(scenario, 5, b"stage forward\n", 5.0)
        return _fast(scenario)

    cells = [DENSE, DENSE_FULL, Cell("dense", "selective_op")]
    first = sweep(cells, out=tmp_path, timeout_s=5, progress=False, runner=runner)
    assert {r.cell: r.classification.label for r in first.rows} == {
        DENSE: "crashed",
        DENSE_FULL: "timeout",
        cells[2]: "works",
    }
    assert len(calls) == 3
    del fail[DENSE.label]
    # Same limit: the crash is retried, and so is the timeout, once (a load spike is not a result).
    second = sweep(cells, out=tmp_path, timeout_s=5, progress=False, runner=runner)
    assert sorted(calls[3:]) == sorted([DENSE.label, DENSE_FULL.label])
    assert {r.cell: r.classification.label for r in second.rows}[DENSE] == "works"
    # Timed out twice under 5 s: kept.
    sweep(cells, out=tmp_path, timeout_s=5, progress=False, runner=runner)
    assert len(calls) == 5
    # A longer limit retries the timeout.
    fail.clear()
    third = sweep(cells, out=tmp_path, timeout_s=600, progress=False, runner=runner)
    assert calls[5:] == [DENSE_FULL.label]
    assert [r.classification.label for r in third.rows] == ["works"] * 3
    recs = [json.loads(line) for line in _lines(tmp_path / "results.jsonl")]
    assert len(recs) == 6 and [r["limit_s"] for r in recs] == [5, 5, 5, 5, 5, 600]
    assert len(load_results(tmp_path / "results.jsonl")) == 3  # the last record of a key wins


def test_torn_last_line_is_repaired_before_appending(tmp_path):
    cells = [DENSE, DENSE_FULL, Cell("dense", "selective_op")]
    sweep(cells[:2], out=tmp_path, progress=False, runner=_fast)
    results = tmp_path / "results.jsonl"
    whole = results.read_bytes()
    lines = whole.splitlines(keepends=True)
    # kill -9 mid-write: half of the second record, no newline.
    results.write_bytes(lines[0] + lines[1][: len(lines[1]) // 2])
    calls = []

    def runner(scenario):
        calls.append(scenario.name)
        return _fast(scenario)

    sweep(cells, out=tmp_path, progress=False, runner=runner)
    assert calls == [DENSE_FULL.label, cells[2].label]  # the torn record's cell ran again
    recs = [json.loads(line) for line in _lines(results)]  # every line parses
    assert len(recs) == 3 and len({r["key"] for r in recs}) == 3
    # A whole record that only lost its newline is kept, and the next record starts on its own line.
    results.write_bytes(results.read_bytes().rstrip(b"\n"))
    calls.clear()
    sweep(cells + [Cell("dense", "none", "blocks")], out=tmp_path, progress=False, runner=runner)
    assert calls == [Cell("dense", "none", "blocks").label]
    assert len([json.loads(line) for line in _lines(results)]) == 4


def test_merge_results_from_two_machines_by_key(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    sweep([DENSE, DENSE_FULL], out=a, progress=False, runner=_fast)
    lost = lambda s: crashed_report(s, "node gone", "forward") if s.name == DENSE_FULL.label else _fast(s)  # noqa: E731
    sweep([DENSE_FULL, Cell("dense", "selective_op")], out=b, progress=False, runner=lost)
    c.mkdir()
    # b's crashed record first, then a's measured one replaces it; a's DENSE and b's selective_op are added.
    assert merge_results([b / "results.jsonl", a / "results.jsonl"], c / "results.jsonl") == 4
    assert merge_results([a / "results.jsonl", b / "results.jsonl"], c / "results.jsonl") == 0
    calls = []
    result = sweep(
        [DENSE, DENSE_FULL, Cell("dense", "selective_op")],
        out=c,
        progress=False,
        runner=lambda s: calls.append(s) or _fast(s),
    )
    assert calls == [] and [r.classification.label for r in result.rows] == ["works"] * 3
    # The same through the CLI (a first, so b's crashed record is never taken): --merge, then nothing left to run.
    d = tmp_path / "d"
    only = ("--only", "^dense \\| AC (none|full|selective_op) \\| eager")
    # A dry run counts what the merge would bring: b alone leaves its crashed cell and the one it lacks to run.
    for merged, to_run in (([b], 2), ([a, b], 0)):
        dry = _cli("--merge", *(str(x / "results.jsonl") for x in merged), "--out", str(d), *only, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert f"{to_run} to run on" in dry.stdout and f"{3 - to_run} already in" in dry.stdout, dry.stdout
        # The cells it would run, by label: b lacks DENSE, and its DENSE_FULL crashed.
        listed = [line.strip() for line in dry.stdout.splitlines()[1:]]
        assert listed == ([DENSE.label, DENSE_FULL.label] if to_run else []), dry.stdout
        assert not d.exists()
    p = _cli(
        "--merge",
        str(a / "results.jsonl"),
        str(b / "results.jsonl"),
        "--out",
        str(d),
        "--only",
        "^dense \\| AC (none|full|selective_op) \\| eager",
        "--no-progress",
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "merged 3 records" in p.stderr and "3 cells: 3 works" in p.stdout
    assert len(_lines(d / "results.jsonl")) == 3


def _sweep_script(out, cells, **kw):
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    return textwrap.dedent(f"""
        from toolkit.analysis.cells import Cell
        from toolkit.analysis.sweeps import sweep
        sweep([Cell(*c) for c in {cells!r}], out={str(out)!r}, progress=False, {args})
    """)


def test_two_sweeps_into_one_folder_the_second_is_refused(tmp_path):
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", _sweep_script(out, [("dense",)], timeout_s=120)],
        cwd=ROOT,
        env=_env(TOOLKIT_WORKER_FAULT="hang@forward"),
    )
    try:
        lock = out / ".sweep.lock"
        deadline = time.time() + 120
        while time.time() < deadline and not (lock.exists() and lock.read_text().strip()):
            time.sleep(0.2)
        assert f"pid {first.pid}" in lock.read_text()
        p = _cli("--out", str(out), "--only", "^dense \\| AC none \\| eager", timeout=120)
        assert p.returncode == 1 and "Traceback" not in p.stderr  # a condition of the moment, not bad input
        assert "another sweep is writing into" in p.stderr and f"pid {first.pid}" in p.stderr
    finally:
        first.kill()
        first.wait()
    # The kernel dropped the dead sweep's lock: the folder is usable again at once.
    result = sweep([DENSE], out=out, progress=False, runner=_fast)
    assert [r.classification.label for r in result.rows] == ["works"]


# ------------------------------------------------------------------------------------------------------ kill -9


@pytest.mark.parametrize("how", ["warm", "cold", "submitit"])
def test_kill_minus_nine_leaves_no_worker_and_no_temp_folder(tmp_path, how):
    if how == "submitit":
        extra("submitit")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "out"
    kw = (
        dict(executor="submitit", cluster="local", cpus_per_cell=1, cells_per_job=2)
        if how == "submitit"
        else dict(workers=2, warm=how == "warm")
    )
    script = _sweep_script(out, [("dense",), ("dense", "full")], timeout_s=300, **kw)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, env=_env(TOOLKIT_WORKER_FAULT="hang@forward", TMPDIR=str(tmp))
    )
    sweep_proc = psutil.Process(proc.pid)
    # warm: the server and its two forked children; cold: two workers; submitit: its controller, the task, the
    # task's warm server and the cell forked from it.
    want = {"warm": 3, "cold": 2, "submitit": 4}[how]
    deadline = time.time() + 180
    workers = []
    while time.time() < deadline:
        workers = [p for p in sweep_proc.children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
        if len(workers) >= want:
            break
        time.sleep(0.3)
    assert len(workers) >= want, [p.cmdline() for p in workers]
    time.sleep(1.0)  # let the cells reach the hang
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 15
    while time.time() < deadline and any(_alive(p.pid) for p in workers):
        time.sleep(0.1)
    assert [p.cmdline() for p in workers if _alive(p.pid)] == []
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("toolkit-run-")) == []
    assert load_results(out / "results.jsonl") == {}


# ------------------------------------------------------------------------------------------------- warm pool


def _tasks(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.skipif(WarmPool.available() is not None, reason="the warm pool needs Linux")
def test_warm_pool_one_server_survives_crashes_and_hangs(monkeypatch):
    sc = tk.Scenario(model=tk.ModelConfig(moe_layers="none"), ac=tk.ACConfig.of(mode="full"), steady_steps=0)
    cold = tk.run(sc, isolate=True, timeout_s=300, threads=1)
    with WarmPool() as pool:
        first = pool.run(sc, 300, threads=1)
        server = pool.server_pid
        assert _tasks(server) == 1  # forks from a single-threaded process only
        monkeypatch.setenv("TOOLKIT_WORKER_FAULT", "abort@forward")
        aborted = pool.run(sc, 300, threads=1)
        monkeypatch.setenv("TOOLKIT_WORKER_FAULT", "segv@backward")
        segv = pool.run(sc, 300, threads=1)
        monkeypatch.setenv("TOOLKIT_WORKER_FAULT", "hang@forward")
        t = time.perf_counter()
        hung = pool.run(sc, 4, threads=1)
        assert time.perf_counter() - t < 20
        monkeypatch.delenv("TOOLKIT_WORKER_FAULT")
        after = pool.run(sc, 300, threads=1)
        assert (pool.server_pid, pool.starts, _alive(server)) == (server, 1, True)
        assert [r.outcome for r in (first, aborted, segv, hung, after)] == ["ok", "crashed", "crashed", "timeout", "ok"]
        assert aborted.error.message == "killed by SIGABRT (-6)" and aborted.error.stage == "forward"
        assert segv.error.message == "killed by SIGSEGV (-11)" and segv.error.stage == "backward"
        assert hung.error.message == "no result after 4 s" and hung.error.stage == "forward"
        # A forked child measures what a fresh Python measures.
        for r in (first, after):
            assert r.saved.total_bytes == cold.saved.total_bytes > 0
            assert r.numerics.grads_match is True and r.environment["threads"] == 1
        assert [c for c in psutil.Process(server).children() if c.status() != psutil.STATUS_ZOMBIE] == []
        # The server itself killed: the run in flight is crashed and named so; the next run gets a new server.
        monkeypatch.setenv("TOOLKIT_WORKER_FAULT", "hang@forward")
        import threading

        killer = threading.Timer(3.0, lambda: os.kill(server, signal.SIGKILL))
        killer.start()
        lost = pool.run(sc, 120, threads=1)
        killer.join()
        monkeypatch.delenv("TOOLKIT_WORKER_FAULT")
        assert lost.outcome == "crashed" and "server died" in lost.error.message
        again = pool.run(sc, 300, threads=1)
        assert again.outcome == "ok" and pool.starts == 2 and pool.server_pid != server
    assert not _alive(pool.server_pid)


# ------------------------------------------------------------------------------------------------- executors


def test_submitit_local_executor_same_results_and_a_lost_task_is_retried(tmp_path, monkeypatch):
    extra("submitit")
    out = tmp_path / "out"
    cells = [DENSE, Cell("moe:for_loop", "full", "blocks")]
    result = sweep(cells, out=out, progress=False, executor="submitit", cluster="local", cpus_per_cell=1, timeout_s=300)
    cls = {r.cell: r.classification for r in result.rows}
    assert cls[cells[0]].label == "works"
    assert cls[cells[1]].label == "fell_back_to_eager" and "C2" in cls[cells[1]].cases
    # The two cells, and the one that fell back rerun bare, through the same executor.
    assert [json.loads(line)["cell"].get("bare", False) for line in _lines(out / "results.jsonl")] == [
        False,
        False,
        True,
    ]
    assert list((out / "submitit").glob("*/*_result.pkl"))  # it went through submitit's own job files
    # A task that dies (a node gone, a preemption) loses its cell: `crashed`, naming the job; the re-run retries it.
    monkeypatch.setenv("TOOLKIT_WORKER_FAULT", "hang@forward")
    me = psutil.Process()
    import threading

    def kill_task():
        deadline = time.time() + 120
        while time.time() < deadline:
            for p in me.children(recursive=True):
                with_submit = " ".join(p.cmdline())
                if "submitit.core._submit" in with_submit:
                    time.sleep(2)
                    p.kill()
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_task)
    killer.start()
    lost_out = tmp_path / "lost"
    lost = sweep(
        [DENSE], out=lost_out, progress=False, executor="submitit", cluster="local", cpus_per_cell=1, timeout_s=300
    )
    killer.join()
    rep = lost.rows[0].report
    assert rep.outcome == "crashed" and "submitit job" in rep.error.message and "lost" in rep.error.message
    monkeypatch.delenv("TOOLKIT_WORKER_FAULT")
    again = sweep(
        [DENSE], out=lost_out, progress=False, executor="submitit", cluster="local", cpus_per_cell=1, timeout_s=300
    )
    assert again.rows[0].classification.label == "works" and len(_lines(lost_out / "results.jsonl")) == 2


@pytest.mark.parametrize("name", ["submitit", "ray"])
def test_a_cluster_executor_without_its_package_says_how_to_install_it(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # `import name` now fails as if it were not installed
    with pytest.raises(tk.ConfigError) as e:
        sweep([DENSE], out=tmp_path, progress=False, executor=name)
    assert f"{name} is not installed" in str(e.value) and "pip install" in e.value.fix
    assert not (tmp_path / "results.jsonl").exists()  # refused before the sweep made anything in its folder
    assert [r.classification.label for r in sweep([DENSE], out=tmp_path, progress=False, runner=_fast).rows] == [
        "works"
    ]


def _netns_ok():
    return (
        shutil.which("unshare") is not None
        and subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0
    )


@pytest.mark.skipif(not _netns_ok(), reason="no user+network namespace here to keep Ray on loopback")
def test_ray_executor_in_a_loopback_only_namespace(tmp_path):
    extra("ray")
    # Ray binds the machine's own address even when told 127.0.0.1, so it runs where there is no other: a network
    # namespace of its own with only `lo`. The script checks every socket of every Ray process against 127.0.0.1.
    script = textwrap.dedent(f"""
        import json, os, socket, psutil, ray
        from toolkit.analysis.cells import Cell
        from toolkit.analysis.sweeps import sweep
        names = [n for _, n in socket.if_nameindex()]
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        result = sweep([Cell("dense"), Cell("dense", "full", "blocks")], out={str(tmp_path / "out")!r},
                       progress=False, executor="ray", timeout_s=300)
        procs = [psutil.Process()] + psutil.Process().children(recursive=True)
        addrs = set()
        for p in procs:
            try:
                conns = p.net_connections(kind="inet")
            except psutil.Error:
                continue
            for c in conns:
                addrs.update(a.ip for a in (c.laddr, c.raddr) if a)
        ray.shutdown()
        print(json.dumps({{"ifaces": names, "addrs": sorted(addrs), "ray_procs": len(procs),
                          "labels": [r.classification.label for r in result.rows]}}))
    """)
    path = tmp_path / "ray_sweep.py"
    path.write_text(script)
    p = subprocess.run(
        ["unshare", "-rn", "sh", "-c", f"ip link set lo up && exec {sys.executable} {path}"],
        cwd=ROOT,
        env=_env(RAY_USAGE_STATS_ENABLED="0"),
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["ifaces"] == ["lo"]
    assert got["ray_procs"] >= 3 and got["addrs"]  # Ray really ran, with sockets to look at
    assert set(got["addrs"]) <= {"127.0.0.1", "::ffff:127.0.0.1"}, got["addrs"]
    assert got["labels"] == ["works", "works"]
    assert len(_lines(tmp_path / "out" / "results.jsonl")) == 2


# ------------------------------------------------------------------------------------------- progress, summary


class _Pty:
    def __init__(self, cols):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
        self.stream = os.fdopen(slave, "w")

    def read(self):
        self.stream.flush()
        chunks = []
        os.set_blocking(self.master, False)
        try:
            while True:
                chunks.append(os.read(self.master, 1 << 16))
        except (BlockingIOError, OSError):
            pass
        return b"".join(chunks).decode()


@pytest.mark.parametrize("cols", [80, 120])
def test_progress_bar_fits_the_terminal_and_counts_findings_not_failures(cols):
    term = _Pty(cols)
    bar = Progress(5, done=1, stream=term.stream)
    start = term.read()
    bar.finish(Cell("moe:for_loop", recipe="torchtitan_2025_09"), "error")
    bar.finish(Cell("moe:for_loop", "selective_op", "blocks", fullgraph=True, order="ac_outside"), "works")
    bar.finish(Cell("dense", "full"), "crashed")
    bar.close()
    late = term.read()
    screens = [s for s in (start + late).replace("\r\n", "\r").replace("\n", "\r").split("\r") if s.strip()]
    assert screens and all(len(s) <= cols for s in screens), max(map(len, screens))
    assert "1/5" in start and "00:00<?" in start  # no time left claimed before a cell has finished
    last = screens[-1]
    assert "4/5" in last and "1 findings, 1 lost" in last and "last: crashed dense | AC full" in last


def test_cli_summary_lists_every_cell_that_is_not_works(tmp_path):
    p = _cli(
        "--only",
        "^moe:for_loop \\| (recipe torchtitan_2025_09|AC full \\| blocks \\| aot_eager)",
        "--out",
        str(tmp_path),
        "--timeout-s",
        "300",
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "MatrixResult: 2 cells: 1 error, 1 fell_back_to_eager" in out
    tail = out[out.index("not works (2):") :].splitlines()
    assert tail[1].split()[0] == "error" and "recipe torchtitan_2025_09" in tail[1] and "[C4]" in tail[1]
    assert "Unsupported" in tail[2]
    assert tail[3].split()[0] == "fell_back_to_eager" and "C2" in tail[3] and "ran eagerly" in tail[4]
    # Off a terminal: a line per cell, and the deliberate C4 error is a finding, not a failure.
    assert "1 findings" in p.stderr and "lost" not in p.stderr


def test_central_list_command_on_a_subset_of_the_full_sweep(tmp_path):
    out = tmp_path / "docs" / "central-list"
    pattern = "^dense \\| AC none \\| (eager|blocks|blocks \\(fullgraph\\)) \\|"  # not the FSDP2 cells
    want = [c for c in full_cells() if __import__("re").search(pattern, c.label)]
    assert len(want) == 3  # eager, blocks, blocks fullgraph
    p = _cli("--full", "--only", pattern, "--out", str(out), "--no-progress", timeout=600)
    assert p.returncode == 0, p.stderr
    data = json.loads((out / "matrix.json").read_text())
    assert sorted(c["label"] for c in data["cells"]) == sorted(c.label for c in want)
    assert data["environment"]["torch"] == __import__("torch").__version__
    md = (out / "matrix.md").read_text()
    assert md.startswith("# AC × compile × MoE: the central list") and f"torch {data['environment']['torch']}" in md
    assert "3 cells" in md and (out / "matrix.html").stat().st_size > 1_000_000
    assert "Changed between torch releases" not in md
    # The same folder regenerated on another torch release: its records sit beside these (the key holds the
    # torch version), and the list marks the cells whose classification changed.
    results = out / "results.jsonl"
    recs = [json.loads(line) for line in _lines(results)]
    with open(results, "a") as f:
        for rec in recs:
            other = dict(rec, key=rec["key"] + "-2.99")
            if rec["cell"]["scope"] == "blocks" and not rec["cell"]["fullgraph"]:
                other["report"] = crashed_report(Cell(**rec["cell"]).scenario(), "killed by SIGSEGV (-11)").to_dict()
            other["report"]["environment"] = dict(other["report"]["environment"], torch="2.99.0")
            f.write(json.dumps(other) + "\n")
    p = _cli("--full", "--only", pattern, "--out", str(out), "--no-progress", timeout=300)
    assert p.returncode == 0, p.stderr
    md = (out / "matrix.md").read_text()
    changed = md[md.index("## Changed between torch releases (1)") : md.index("### works")]
    (line,) = [ln for ln in changed.splitlines() if ln.startswith("| dense \\| AC none \\| blocks \\| aot_eager |")]
    assert line.startswith("| dense \\| AC none \\| blocks \\| aot_eager | works, ") and "KiB | crashed |" in line
    assert "| classified crashed there" in line and "1 × classified crashed there" in changed
    assert "eager | eager" not in changed and "fullgraph" not in changed
    assert "changed from another torch release (1):" in p.stdout and "was crashed on 2.99.0" in p.stdout
    assert "Changed between torch releases (1)" in (out / "matrix.html").read_text()


def test_the_isolation_channel_has_one_format_and_one_environment():
    """What a child sends (`stage` lines, then one `report` line) and the environment it gets (its parent, its
    threads) come from `execution.channel` for both isolations: a fresh Python and the warm pool's children."""
    import io

    from toolkit.execution import channel

    buf = io.StringIO()
    channel.send_stage(buf, "build")
    channel.send_stage(buf, "forward")
    channel.send_report(buf, '{"outcome":\n"ok"}')
    out = buf.getvalue().encode()
    assert channel.read(out) == (["build", "forward"], '{"outcome": "ok"}')
    assert channel.read(out[:-1]) == (["build", "forward"], None)  # a torn last line is no report
    env = channel.child_env({"TOOLKIT_THREADS": "8", channel.PARENT_ENV: "1", "KEEP": "x"}, 2)
    assert env == {
        "KEEP": "x",
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "TOOLKIT_THREADS": "2",
        "TORCHINDUCTOR_COMPILE_THREADS": "2",
        channel.PARENT_ENV: str(os.getpid()),
    }
    assert channel.child_env({"TOOLKIT_THREADS": "8"}, None) == {channel.PARENT_ENV: str(os.getpid())}
    for module in ("isolate", "forkserver", "worker"):
        src = (ROOT / "toolkit" / "execution" / f"{module}.py").read_text()
        assert "TOOLKIT_PARENT_PID" not in src and "OMP_NUM_THREADS" not in src and '"report "' not in src, module
