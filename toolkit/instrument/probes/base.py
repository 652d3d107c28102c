"""What the probes share: the step's phase, the module stack, helpers that key tensors by storage.

What the probes share: the step's phase, the module stack (who is running), and the helpers that key tensors by storage.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from ... import compat
from ...compat import tree_leaves
from ...transforms.naming import within

if TYPE_CHECKING:
    from types import FrameType

    from .checkpoints import Packed

_NOT_REAL: tuple[type, ...] | None = None


def is_real(t: Any) -> bool:
    """A tensor with a real storage (not fake, functional or meta: those exist only while tracing)."""
    global _NOT_REAL
    if not isinstance(t, torch.Tensor):
        return False
    if _NOT_REAL is None:  # the dispatch tracker calls this for every output: look the classes up once
        _NOT_REAL = compat.not_real_tensor_types()
    return not isinstance(t, _NOT_REAL) and not t.is_meta


def tensors(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(x, torch.Tensor) or x is None for x in out):
        return [x for x in out if x is not None]
    return [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]


class Held(NamedTuple):
    """A storage held for backward that no probe saw being made (a step input, a tensor from before the step, a
    checkpoint's input): what the census needs of it."""

    ref: StorageWeakRef
    module: str
    """The module running when it was packed (canonical name)."""
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    """Its storage's size when it was packed."""


# FX names the code of every GraphModule it generates "<eval_with_key>.N"; a checkpointed body inside a Dynamo graph
# (the checkpoint higher-order op) is run node by node by FX's Interpreter instead (torch/fx, 2.13–2.15).
_GRAPH_CODE = "<eval_with_key>"
_INTERPRETER = ("fx/interpreter.py", "fx\\interpreter.py")


def from_graph_code(depth: int = 12) -> bool:
    """Was the caller called by a Dynamo graph's own code? Under the `eager` backend the captured graph runs as its
    GraphModule's generated forward (or, for a checkpointed body, FX's Interpreter), op by op; AOTAutograd's graphs
    run below the dispatch mode. For an op, that frame is among the first Python frames above `__torch_dispatch__`
    (checkpoint's own dispatch modes and torch's disable wrappers sit between); for a checkpoint region that begins,
    a graph's `tag_activation_checkpoint` call sits deeper (`depth` frames are looked at)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return False
        name = frame.f_code.co_filename
        if name.startswith(_GRAPH_CODE) or name.endswith(_INTERPRETER):
            return True
        frame = frame.f_back
    return False


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


@dataclass
class Produced:
    """A storage an op made during the forward, and who made it."""

    ref: StorageWeakRef
    module: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    """Its size when it was made (the census reads the size at the end of the forward)."""


class StepState:
    """The phase of the step ("idle", "forward", "backward") and the stack of modules running now."""

    def __init__(self) -> None:
        self.phase = "idle"
        self.stack: list[str] = []
        self.regions: list[str] = []
        """Compiled regions entered and not yet left, innermost last."""
        self.recomputing = 0
        """Depth of checkpointed functions re-running in backward."""
        self.bookkeeping = 0
        """Depth of the recompute machinery's own work now (checkpoint's detach of each recomputed tensor,
        torch_remat's replay of a kept region): ops dispatched inside are not forward ops re-run."""
        self.held_inputs: dict[int, Held] = {}
        """Storages a checkpoint region holds to re-run its function (its inputs, the RNG state it stashed)."""
        self.frames: list[Any] = []
        """Checkpoint regions (their `FrameRecord`s) whose forward is running, innermost last."""
        self.recomputes: list[tuple[Any, Any]] = []
        """(FrameRecord, graph task id) of the checkpoint recomputes running now, innermost last."""
        self.compiled_saves: dict[int, str] = {}
        """Storage key → compiled region of the tensors the compiled graph that ran last inside a checkpoint region is
        saving and has not packed yet ("" = a compiled function, not a module); emptied when the region's forward or
        recompute ends."""
        self.in_pack = 0
        """Inside a checkpoint's pack hook: the ops it dispatches itself are not the model's."""
        self.pending_packs: list[tuple[list[Packed], int]] = []
        """Packs of an op's inputs (autograd saves them before the op runs), waiting for that op's name."""
        self.checkpoint_options: dict[str, Any] = {}
        """The options of the checkpoint call whose frame is about to be made."""
        self.under_checkpoint: set[str] = set()
        """Modules (and compiled regions) entered in the forward inside a checkpoint region, so that every op of theirs
        ran under it; and modules whose ops a compiled graph tagged as checkpointed (`compiled.py`)."""
        self.eager_checkpoints: set[str] = set()
        """Checkpoint regions (their module, else the compiled region around them) that began eagerly, in Python code,
        inside a compiled region: Dynamo gave the checkpoint up (a graph break inside it) and ran it outside any graph.
        Not the `eager` backend running a graph's own checkpoint (that one begins from the graph's code)."""
        self.checkpoint_unresolved: set[str] = set()
        """Compiled regions inside which a checkpoint ran with no module hook to say around which modules (the `eager`
        backend runs a compiled graph's checkpoints eagerly, inside it; a graph whose forward could not be read)."""
        self.reentrant = 0
        """Depth of reentrant checkpoints running their forward now (they make no frame)."""
        self.selective: set[str] = set()
        """Checkpoints (their module, else the module running) that began in the forward with a policy, a
        `context_fn` other than torch's no-op: selective AC, whoever set it."""
        self.orders: dict[str, str] = {}
        """Compiled region → how it and AC met, as the step showed it: "compile(AC(x))" when a checkpoint ran inside
        it (traced into its graph, run by the graph's code, or given up by Dynamo and run eagerly there),
        "AC(compile(x))" when it was entered while a checkpoint's forward ran. Whoever compiled and checkpointed."""
        self.graph_regions: set[str] = set()
        """Compiled regions in which a Dynamo graph's own code dispatched an op in the forward: what a backend with no
        AOTAutograd (`eager`) leaves as the only sign that the graph ran, where `compiled.py` sees AOT's saves."""

    def hold(self, t: torch.Tensor) -> None:
        """Note that a checkpoint region holds `t` until its recompute."""
        if not is_real(t):
            return
        st = t.untyped_storage()
        key = compat.storage_key(st)
        if key not in self.held_inputs:
            self.held_inputs[key] = Held(
                StorageWeakRef(st),  # type: ignore[no-untyped-call]  # unannotated in torch
                self.module(),
                tuple(t.shape),
                dtype_name(t),
                st.nbytes(),
            )

    def module(self) -> str:
        return self.stack[-1] if self.stack else ""

    def region(self) -> str:
        return self.regions[-1] if self.regions else ""

    def push(self, name: str) -> None:
        # Heal a stale stack (a recompute stopped early skips post-hooks) by popping non-ancestors.
        stack = self.stack
        while stack and not within(name, stack[-1]):
            stack.pop()
        stack.append(name)
        if self.phase == "forward" and (self.frames or self.reentrant):
            self.under_checkpoint.add(name)

    def checkpoint_begins(self, module: str | None) -> None:
        """A checkpoint region (either form) begins; `module` is the module its function runs, if known. Inside a
        compiled region, and not while Dynamo traces it, it runs eagerly there: from the graph's own code (the `eager`
        backend runs a traced checkpoint so, and no module hook says what it covers), or from Python code, because
        Dynamo gave the checkpoint up and ran it outside any graph (`eager_checkpoints`)."""
        if self.phase != "forward" or not self.regions or torch.compiler.is_compiling():
            return
        self.orders.setdefault(self.region(), "compile(AC(x))")
        if from_graph_code(depth=64):
            self.checkpoint_unresolved.add(self.region())
            return
        self.eager_checkpoints.add(self.region() if module is None else module)
        if module is None:
            self.checkpoint_unresolved.add(self.region())
        else:
            self.under_checkpoint.add(module)

    def pop(self, name: str) -> None:
        while self.stack:
            if self.stack.pop() == name:
                break

    @property
    def in_recompute(self) -> bool:
        """A forward op dispatched now is a recompute: backward is running a checkpointed function again (seen
        by the checkpoint patch) or a module forward (only recompute runs module hooks during backward)."""
        return self.phase == "backward" and (self.recomputing > 0 or bool(self.stack))
