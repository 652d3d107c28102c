"""Warm isolated runs: a server imports torch once and forks a fresh child per Scenario.

Warm isolated runs: one server process imports torch once and forks a fresh child per Scenario, so each run is still its
own process (a crash or hang is a result) without paying torch's import every time.

Fork safety: the server never runs a step, never touches CUDA and stays single-threaded (numpy's OpenBLAS pool
is held at one thread, and the server checks `/proc/self/task` before every fork); intra-op threads are set in
each child. Compiled code is never shared in memory: the server compiles nothing, so every child starts with an
empty Dynamo cache, while the on-disk caches (`TORCHINDUCTOR_CACHE_DIR`, keyed by graph and config) are shared.
Everything dies with the caller: the server with the thread that started it, each child with the server
(PR_SET_PDEATHSIG), and nothing is written to disk (Scenario and Report travel over sockets).

Linux only (fork, SOCK_SEQPACKET, PR_SET_PDEATHSIG); elsewhere `WarmPool.available()` says why not.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback

from . import channel

# Imported before the first fork, so a child finds them loaded (what a compiled cell would import on its own).
PREIMPORT = (
    "toolkit.execution.local",
    "toolkit.execution.any_module",
    "torch._dynamo",
    "torch._dynamo.backends.debugging",
    "torch._functorch.aot_autograd",
    "torch._functorch.partitioners",
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.scheduler",
    "torch._inductor.codegen.cpp",
    "torch.export",
)
_MSG = 1 << 20


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _send(sock: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):
        sock.send(json.dumps(msg).encode())


# --------------------------------------------------------------------------------------------------- server side


def serve(fd: int) -> None:
    """The server's loop: fork a child per request, report each child's pid and exit status; exit with the caller."""
    channel.die_with_parent()
    ctrl = socket.socket(fileno=fd)
    try:
        import importlib

        for name in PREIMPORT:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        import gc

        import torch

        gc.freeze()  # imported objects stay out of the collector, so children share those pages (copy-on-write)
        ready = {"ready": True, "pid": os.getpid(), "threads": _threads(), "torch": torch.__version__}
    except BaseException as e:  # an import that fails here fails in every cell: say so once
        _send(ctrl, {"ready": False, "error": f"{type(e).__name__}: {e}"})
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a byte on wake_w per SIGCHLD: no polling for exits
    _send(ctrl, ready)
    children: dict[int, int] = {}
    try:
        while True:
            watched: list[socket.socket | int] = [ctrl, wake_r]  # typed: the list's inferred join is `object`
            readable, _, _ = select.select(watched, [], [])
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 4096)
                _reap(children, ctrl)
            if ctrl not in readable:
                continue
            try:
                data, fds, _, _ = socket.recv_fds(ctrl, _MSG, 2)
            except OSError:
                break
            if not data:
                break  # the caller closed the socket, or died
            req = json.loads(data)
            why = _unsafe_to_fork()
            if why or len(fds) != 2:
                for f in fds:
                    os.close(f)
                _send(ctrl, {"id": req["id"], "error": why or "expected two sockets with the request"})
                continue
            server = os.getpid()
            pid = os.fork()
            if pid == 0:
                _child(req, fds, ctrl, (wake_r, wake_w), server)
            for f in fds:
                os.close(f)
            children[pid] = req["id"]
            _send(ctrl, {"id": req["id"], "pid": pid})
            _reap(children, ctrl)
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _unsafe_to_fork() -> str | None:
    import torch

    n = _threads()
    if n != 1:
        return f"the warm server has {n} threads; forking it could copy a held lock"
    if torch.cuda.is_initialized():
        return "the warm server initialised CUDA, which a forked child cannot use"
    return None


def _reap(children: dict[int, int], ctrl: socket.socket) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        cid = children.pop(pid, None)
        if cid is not None:
            _send(ctrl, {"id": cid, "exit": os.waitstatus_to_exitcode(status)})


def _child(req: dict, fds: list[int], ctrl: socket.socket, wake: tuple[int, int], server: int) -> None:
    code = 1
    try:
        from .worker import measure

        os.setpgid(0, 0)  # its own group: a timeout kills the child and anything it started
        channel.die_with_parent(server)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ctrl.close()
        for f in wake:
            os.close(f)
        chan_fd, err_fd = fds
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(err_fd, 2)
        os.close(err_fd)
        for k in [
            k for k in os.environ if k.startswith("TOOLKIT_") and k != channel.PARENT_ENV and k not in req["env"]
        ]:
            del os.environ[k]  # the caller's toolkit settings now, not those of when the server started
        os.environ.update(req["env"])
        with os.fdopen(chan_fd, "w") as chan:
            measure(req["scenario"], chan)
        code = 0
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stderr.flush()
        os._exit(code)


# --------------------------------------------------------------------------------------------------- caller side


class _Waiter:
    def __init__(self) -> None:
        self.pid: int | None = None
        self.exit: int | None = None
        self.error: str | None = None
        self.started = threading.Event()
        self.done = threading.Event()


class WarmPool:
    """A warm server shared by any number of threads, each running one isolated Scenario at a time in a forked
    child. `run` has `run_isolated`'s contract: a crash, abort or hang in one child is that run's Report, and the
    server goes on; if the server itself dies, the runs in flight are `crashed` and the next run starts a new one."""

    def __init__(self, *, start_timeout_s: float = 300.0):
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, _Waiter] = {}
        self._ctrl: socket.socket | None = None
        self._proc: subprocess.Popen | None = None
        self._keeper_stop = threading.Event()
        self.server_pid: int | None = None
        self.starts = 0

    @staticmethod
    def available() -> str | None:
        """None when a warm pool can run here, else why not."""
        if not sys.platform.startswith("linux"):
            return f"the warm pool needs Linux (fork, SOCK_SEQPACKET, PR_SET_PDEATHSIG); this is {sys.platform}"
        return None

    def __enter__(self) -> "WarmPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- lifecycle

    def start(self) -> None:
        """Start the server now (else the first `run` does): RuntimeError saying why when it cannot."""
        self._ensure()

    def _ensure(self) -> socket.socket:
        with self._lock:
            if self._ctrl is not None:
                return self._ctrl
            why = self.available()
            if why:
                raise RuntimeError(why)
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            env = channel.child_env(dict(os.environ), None)
            # numpy's OpenBLAS starts a thread pool at import; one thread means none, so the server can fork.
            env.update(OPENBLAS_NUM_THREADS="1", GOTO_NUM_THREADS="1")
            started = threading.Event()
            box: dict = {}

            def keeper() -> None:
                # The server dies with the thread that started it (PR_SET_PDEATHSIG): this thread lives as long
                # as the pool, whichever thread asked for it first.
                try:
                    box["proc"] = subprocess.Popen(
                        [sys.executable, "-m", "toolkit.execution.forkserver", str(theirs.fileno())],
                        pass_fds=[theirs.fileno()],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,
                        env=env,
                    )
                except BaseException as e:
                    box["error"] = e
                started.set()
                self._keeper_stop.wait()

            self._keeper_stop = threading.Event()
            threading.Thread(target=keeper, daemon=True, name="toolkit-warm-pool").start()
            started.wait()
            theirs.close()
            if "error" in box:
                raise box["error"]
            proc = box["proc"]
            mine.settimeout(self.start_timeout_s)
            try:
                hello = json.loads(mine.recv(_MSG) or b'{"ready": false, "error": "exited at start"}')
            except (OSError, ValueError) as e:
                hello = {"ready": False, "error": f"no answer in {self.start_timeout_s:g} s ({e})"}
            if not hello.get("ready"):
                self._stop_proc(proc)
                raise RuntimeError(f"the warm pool's server did not start: {hello.get('error')}")
            if hello.get("threads", 1) != 1:
                self._stop_proc(proc)
                raise RuntimeError(
                    f"the warm pool's server has {hello['threads']} threads after importing torch; forking it is unsafe"
                )
            mine.settimeout(None)
            self._ctrl, self._proc, self.server_pid = mine, proc, hello["pid"]
            self.starts += 1
            threading.Thread(target=self._read, args=(mine, proc), daemon=True, name="toolkit-warm-pool-reader").start()
            return mine

    def _read(self, ctrl: socket.socket, proc: subprocess.Popen) -> None:
        while True:
            try:
                data = ctrl.recv(_MSG)
            except OSError:
                data = b""
            if not data:
                break
            msg = json.loads(data)
            w = self._waiting.get(msg.get("id"))
            if w is None:
                continue
            if "pid" in msg:
                w.pid = msg["pid"]
                w.started.set()
            elif "exit" in msg:
                w.exit = msg["exit"]
                w.started.set()
                w.done.set()
            elif "error" in msg:
                w.error = msg["error"]
                w.started.set()
                w.done.set()
        # The server is gone: every run in flight is lost with it; the next run starts a new server.
        rc = proc.poll()
        if rc is None:
            # Under load the server may take longer than this to exit; `close` (or the next start) reaps it.
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            rc = proc.poll()
        with self._lock:
            if self._ctrl is ctrl:
                self._ctrl = None
        for w in list(self._waiting.values()):
            if not w.done.is_set() and w.error is None and w.exit is None:
                w.error = f"the warm pool's server died ({'exit status ' + str(rc) if rc is not None else 'gone'})"
                w.started.set()
                w.done.set()

    def _stop_proc(self, proc: subprocess.Popen | None) -> None:
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)

    def close(self) -> None:
        """Stop the server (its children die with it) and the thread holding it."""
        with self._lock:
            ctrl, proc = self._ctrl, self._proc
            self._ctrl = self._proc = None
        if ctrl is not None:
            with contextlib.suppress(OSError):
                ctrl.shutdown(socket.SHUT_RDWR)
            ctrl.close()
        if proc is not None:
            try:
                proc.wait(timeout=5)  # it exits on EOF, killing its children
            except subprocess.TimeoutExpired:
                self._stop_proc(proc)
        self._keeper_stop.set()

    # -- one run

    def run(self, scenario, timeout_s: float | None = None, threads: int | None = None):
        """`run_isolated(scenario, timeout_s, threads=threads)`, in a child forked from the warm server."""
        from .isolate import crashed_report, parse_result, timeout_report

        t0 = time.perf_counter()
        try:
            ctrl = self._ensure()
        except (RuntimeError, OSError) as e:
            return crashed_report(scenario, str(e))
        # The caller's toolkit settings and this run's thread cap; the child's parent is the server, not us.
        env = channel.child_env({k: v for k, v in os.environ.items() if k.startswith("TOOLKIT_")}, threads)
        env.pop(channel.PARENT_ENV)
        rid = next(self._ids)
        w = self._waiting[rid] = _Waiter()
        chan_r, chan_w = socket.socketpair()
        err_r, err_w = socket.socketpair()
        try:
            with self._send_lock:
                socket.send_fds(
                    ctrl,
                    [json.dumps({"id": rid, "scenario": scenario.to_json(), "env": env}).encode()],
                    [chan_w.fileno(), err_w.fileno()],
                )
        except OSError as e:
            self._waiting.pop(rid, None)
            for s in (chan_r, chan_w, err_r, err_w):
                s.close()
            return crashed_report(scenario, f"could not reach the warm pool's server ({e})")
        chan_w.close()
        err_w.close()
        out, err = bytearray(), bytearray()
        bufs = {chan_r: out, err_r: err}
        deadline = None if timeout_s is None else t0 + timeout_s
        timed_out = False
        try:
            open_socks = [chan_r, err_r]
            while not w.done.is_set():
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    timed_out = True
                    break
                if open_socks:
                    wait = 0.5 if left is None else min(0.5, left)
                    for s in select.select(open_socks, [], [], wait)[0]:
                        data = s.recv(1 << 16)
                        if data:
                            bufs[s].extend(data)
                        else:
                            open_socks.remove(s)
                else:
                    w.done.wait(0.5 if left is None else min(0.5, left))
            if timed_out:
                w.started.wait(5)
                if w.pid:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(w.pid, signal.SIGKILL)
                w.done.wait(10)
            for s in (chan_r, err_r):  # what the child wrote before it exited (or was killed)
                s.setblocking(False)
                with contextlib.suppress(BlockingIOError, OSError):
                    while data := s.recv(1 << 16):
                        bufs[s].extend(data)
        except BaseException:
            if w.pid:  # the caller was interrupted: the child goes with it
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(w.pid, signal.SIGKILL)
            raise
        finally:
            self._waiting.pop(rid, None)
            chan_r.close()
            err_r.close()
        if timed_out:
            return timeout_report(scenario, timeout_s, bytes(out), time.perf_counter() - t0)
        if w.error is not None:
            return crashed_report(scenario, w.error)
        return parse_result(scenario, bytes(out), bytes(err), w.exit if w.exit is not None else 1)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
