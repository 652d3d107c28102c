"""torch 2.15: a process whose backward raised (a CheckpointError, say) dies of SIGSEGV when it exits.

Symptom: on torch 2.15.0 a script that caught an exception from `backward()` — here the CheckpointError of a
non-reentrant checkpoint whose recompute, with `preserve_rng_state=False`, routes another number of tokens — runs to
its end, prints everything, and is then killed by SIGSEGV (exit status 139) while the interpreter shuts down. 2.13.0
and 2.14.1 exit cleanly. A measuring tool that reports the error and exits looks crashed.

Mechanism: the autograd engine leaves the nodes it had made ready, but not yet run, in the calling thread's
thread-local ready queue when a backward raises (every release does). The queue is freed by the thread's exit
handlers after Python has finalized. A queued node holding a tensor packed by a Python saved-tensor hook
(checkpoint's own, or any `saved_tensors_hooks`) then runs `~PySavedVariableHooks`, which on 2.15 takes the GIL with
no `Py_IsInitialized()` guard (2.14.1's destructor had one): the GIL acquire on a dead interpreter segfaults.
Seen in gdb: `__call_tls_dtors` -> `ReadyQueue` dispose -> `~SinBackward0` -> `~SavedVariable` ->
`~PySavedVariableHooks` -> `gil_scoped_acquire` -> `PyThreadState_New` -> SIGSEGV.

Workaround (`fix`): make a one-node graph before the forward, and run its backward after the failed one. The engine
pops the stale tasks first (they have higher sequence numbers), drops them since their graph failed, and the queue is
empty before exit.

Upstream: no report found (2026-12-04). The destructor's guard dates from pytorch#57488 ("protect destructors of
python bindings that can be kept alive by c++ objects"); the likely change that lost it is pytorch#189160 ("Use
SafePyObject in PyAnomalyMetadata and PySavedVariableHooks"), not confirmed as merged in the stored material.

Run: python c59_failed_backward_segfault_at_exit.py

Each variant runs in a fresh Python (the crash is the process's exit), so it returns the child's exit status.
Shape suffixes: T tokens.
"""

import json
import subprocess
import sys

import torch

CASE = "C59"
NEEDS = "cpu"

_CHILD = r"""
import sys, torch
from torch.utils.checkpoint import CheckpointError, checkpoint

DRAIN = "drain" in sys.argv[1:]
torch.manual_seed(0)


def block(x_T):
    n = int((torch.rand(x_T.shape[0]) > 0.5).sum())  # "routing": another count when the RNG is not restored
    a_T = x_T.sin()  # the older node: ready at the same time as index_add's, run after it
    b_T = torch.zeros_like(x_T).index_add(0, torch.arange(n), x_T[:n])
    return a_T + b_T


x_T = torch.randn(8, requires_grad=True)
if DRAIN:
    older = torch.zeros((), requires_grad=True) * 1.0  # made before the step: the lowest sequence number
y_T = checkpoint(block, x_T, use_reentrant=False, preserve_rng_state=False)
try:
    y_T.sum().backward()
    print("no error")
except CheckpointError:
    print("CheckpointError")
    if DRAIN:
        older.backward()
del y_T, x_T  # the queue now holds the last reference to the stale node
"""

_CHILD_NO_CHECKPOINT = r"""
import torch


class Boom(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("boom")


x = torch.randn(4, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
    y = x.sin() + Boom.apply(x)
try:
    y.sum().backward()
except RuntimeError:
    print("RuntimeError")
del y, x
"""


def _exit(source: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", source, *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )
    return {
        "raised": (out.stdout.split() or ["nothing"])[0],
        "exit_status": out.returncode,
        "killed_by_sigsegv": out.returncode in (-11, 139),
    }


def bug() -> dict:
    """A caught CheckpointError from a checkpointed block, then a normal end of the script."""
    return _exit(_CHILD)


def fix() -> dict:
    """The same, with the stale ready tasks drained by a one-node graph made before the forward."""
    return _exit(_CHILD, "drain")


def variant_no_checkpoint() -> dict:
    """Not checkpoint's own: any backward that raises while a node saved through Python hooks is still queued."""
    return _exit(_CHILD_NO_CHECKPOINT)


if __name__ == "__main__":
    print(torch.__version__)
    print(json.dumps({"bug": bug(), "fix": fix(), "no_checkpoint": variant_no_checkpoint()}, indent=2))
