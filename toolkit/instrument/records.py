"""What the instrument records of one step: the tensors saved for backward, the graph breaks, memory and numerics,
as frozen dataclasses a Report holds; and how their byte counts and file paths are shown."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

Kind = Literal["autograd", "compiled", "sac_cache", "remat_save", "checkpoint_input", "offloaded", "other"]
KINDS: tuple[str, ...] = typing.get_args(Kind)


@dataclass(frozen=True)
class SavedTensor:
    """One storage held for backward at the end of the forward."""

    module: str
    """Canonical name of the module whose op produced it ("" = the model itself, outside any submodule)."""
    op: str
    """The producing op (e.g. "aten.mm.default"), or "unknown" when no probe saw it being made."""
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    """Bytes of the whole storage (views of one storage count once)."""
    kind: Kind
    """"autograd" (saved by an eager op outside checkpoints), "compiled" (saved by a compiled graph),
    "sac_cache" (cached by a selective-checkpoint policy), "remat_save" (kept by a torch_remat region declared
    `recompute=False`: saved for backward, or its output persisted for the recompute), "checkpoint_input" (held
    by a checkpoint region to re-run it), "offloaded" (the host copy `torch.autograd.graph.save_on_cpu` keeps in
    place of a saved tensor: transformers' offload=True; on a GPU it is host memory, not device memory), "other"
    (alive and reachable from the graph, reason unknown)."""
    is_input: bool = False
    """True when the storage is one of the step's inputs (e.g. the token ids)."""


@dataclass(frozen=True)
class GraphBreak:
    reason: str
    file: str
    line: int

    @property
    def place(self) -> str:
        """`toolkit/models/moe.py:96`: the same in every checkout and on every machine."""
        return f"{short_path(self.file)}:{self.line}"


@dataclass(frozen=True)
class Memory:
    device: str = "cpu"
    peak_bytes: int = 0
    """Peak allocated bytes above the level at the start of the step, over forward + backward."""
    held_after_forward_bytes: int = 0
    """Allocated bytes above the start level right after the forward (activations held for backward)."""
    method: str = ""
    snapshot_path: str | None = None


@dataclass(frozen=True)
class Numerics:
    loss: float | None = None
    """The first step's loss; None when no step finished."""
    reference_loss: float | None = None
    loss_diff: float | None = None
    max_grad_diff: float | None = None
    """None (not nan) when nothing was compared, so Reports compare equal after a JSON round trip."""
    worst_param: str = ""
    grads_match: bool | None = None
    """Every gradient matches the reference within the dtype's tolerance; None when nothing was compared."""
    missing_grads: tuple[str, ...] = ()
    reference: str = ""
    """What the gradients were compared with, or why they were not compared."""

    @property
    def compared(self) -> bool:
        return self.grads_match is not None

    @property
    def grad_diff_text(self) -> str:
        """`max_grad_diff` as the summary prints it. A gradient that is not finite (NaN) makes the difference NaN,
        which JSON carries as null: once compared, a missing figure is that, never a crash in the summary (a sweep
        died on one, moe:nonzero under remat_selective and the eager backend)."""
        d = self.max_grad_diff
        if d is None or not math.isfinite(d):
            return "not finite (a gradient is NaN or inf)" if self.compared else "-"
        return f"{d:.1e}"


# --- plain text -----------------------------------------------------------------------------------------------


def fmt_bytes(n: int | float) -> str:
    """Rounded, deterministic byte counts: `0 B`, `512 B`, `12.3 KiB`, `4.56 MiB`, `1.23 GiB`."""
    n = float(n)
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{int(n)} B"


def fmt_measured_bytes(n: int | float) -> str:
    """A memory figure that depends on the machine (kernel workspaces, thread count, allocator): `~1.01 MiB`.
    The `~` marks it as approximate to the reader, and nbval's sanitizer (`notebooks/sanitize.cfg`) masks it, so a
    committed notebook output is the same on every machine; claims about it are asserted with a tolerance."""
    return "~" + fmt_bytes(n)


def short_path(path: str) -> str:
    """A path from the innermost `toolkit` or `torch` folder on (else its last two parts): the same in every
    checkout."""
    parts = path.replace("\\", "/").split("/")
    for anchor in ("toolkit", "torch"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)  # the innermost, so the checkout's own name never leaks
            return "/".join(parts[i:])
    return "/".join(parts[-2:])


def short_paths(text: str) -> str:
    """Replace file paths inside a message (e.g. a Dynamo guard's `# …/toolkit/models/moe.py:97`) by the file name,
    so the text is the same in every checkout."""
    import re

    return re.sub(r"[^\s'\"]*/([^/\s'\"]+\.py)", r"\1", text)
