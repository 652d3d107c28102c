"""What an estimate returns: `Estimate` and the tensors it keeps for backward, as plain data, text and JSON."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from ..instrument.records import fmt_bytes


@dataclass(frozen=True)
class EstimatedTensor:
    """One storage kept for backward: who made it, its size."""

    module: str
    op: str
    """The op that made it (`aten.mm.default`, as a Report names it), or `input` for a step input."""
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    """Its size as counted (CUDA-rounded when the estimate rounds)."""


@dataclass(frozen=True)
class Estimate:
    """What one training step needs, measured on fake tensors (plain data; JSON round-trip)."""

    scenario: dict[str, Any] = field(default_factory=dict)
    saved_bytes: int = 0
    """Alive when the forward ends, beyond parameters, buffers, inputs and the output: kept for backward."""
    saved_by_module: dict[str, int] = field(default_factory=dict)
    saved_by_op: dict[str, int] = field(default_factory=dict)
    peak_bytes: int = 0
    """High-water mark above the step's start (activations, temporaries, gradients)."""
    params_bytes: int = 0
    cuda_rounding: bool = True
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    saved_tensors: tuple[EstimatedTensor, ...] = ()
    """Every storage in `saved_bytes`, largest first."""
    backend: str = "eager"
    """The compile backend followed ("eager": nothing compiled)."""
    graphs: int = 0
    """Graphs compiled in the step (forward + backward pairs count once)."""
    world_size: int = 1
    """Ranks the model is sharded over (FSDP2, `scenario.fsdp`): every figure is one rank's, with its own batch."""
    reshard_after_forward: bool = True
    unsharded_params_bytes: int = 0
    """FSDP2's gathered parameters still held when the forward ends (units not resharded after their forward: the
    norm and output head, or every block with `reshard_after_forward=False`): counted here, not in `saved_bytes`."""
    grads_bytes: int = 0
    """The gradients when backward ends (one rank's shards under FSDP2), part of `peak_bytes` as they are made."""
    optimizer_bytes: int = 0
    """AdamW's state: two moments like each parameter (`torch.optim.AdamW` makes them with `zeros_like`)."""
    forward_flops: int = 0
    """FLOPs of the forward's matmuls, attention and convolutions (torch's FLOP formulas; pointwise ops are free)."""
    backward_flops: int = 0
    """FLOPs run in backward: the gradients' and any recompute's (recompute is what a setup adds to the same
    step without AC: `tk.plan` reports it)."""
    forward_ops: int = 0
    backward_ops: int = 0
    """aten ops dispatched in the backward (in a compiled region: those its graph runs as ops, not fused kernels)."""
    rng_state_bytes: int = 0
    """The RNG states checkpoints stash for their recompute: host memory, the CPU generator's (5,056 B a stash). Part
    of `saved_bytes` when the estimate is sized for the CPU (`cuda_rounding=False`, as a CPU run counts them); sized
    for CUDA, host memory beside the device figures, counted here only. `peak_bytes` leaves them out."""

    @property
    def per_rank_bytes(self) -> int:
        """What one rank needs in a steady training step: its parameters and AdamW state, held throughout, plus the
        step's high-water mark above them (activations, temporaries, gathered parameters, gradients)."""
        return self.params_bytes + self.optimizer_bytes + self.peak_bytes

    def __str__(self) -> str:
        name = self.scenario.get("name") or "scenario"
        rounding = "CUDA rounding" if self.cuda_rounding else "exact bytes"
        lines = [
            f"estimate {name} ({rounding}): saved {fmt_bytes(self.saved_bytes)}, peak {fmt_bytes(self.peak_bytes)}, "
            f"parameters {fmt_bytes(self.params_bytes)}"
        ]
        if self.world_size > 1 or self.scenario.get("fsdp", "none") != "none":
            lines[0] = (
                f"estimate {name} per rank of {self.world_size} ({rounding}): {fmt_bytes(self.per_rank_bytes)} = "
                f"parameters {fmt_bytes(self.params_bytes)} + AdamW state {fmt_bytes(self.optimizer_bytes)} + step "
                f"peak {fmt_bytes(self.peak_bytes)}; saved {fmt_bytes(self.saved_bytes)}"
            )
        for mod, n in sorted(self.saved_by_module.items(), key=lambda kv: -kv[1])[:8]:
            lines.append(f"  {mod or '(model)':<34} {fmt_bytes(n):>10}")
        if self.rng_state_bytes:
            where = "of it" if not self.cuda_rounding else "besides, not in the device figures"
            lines.append(
                f"  {where}, RNG states stashed for recompute: {fmt_bytes(self.rng_state_bytes)} on the host (the "
                "CPU generator's, 5,056 B a stash; on CUDA a compiled checkpoint stashes the device generator's, 16 B)"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Estimate":
        from .. import _files

        data = _files.loads(text, "Estimate", "", name="the estimate")
        data["notes"] = tuple(data.get("notes", ()))
        data["saved_tensors"] = tuple(
            EstimatedTensor(**{**t, "shape": tuple(t["shape"])}) for t in data.get("saved_tensors", ())
        )
        return cls(**data)
