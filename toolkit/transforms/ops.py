"""Ops named in a SAC config: `'aten.mm.default'` and `torch.ops.aten.mm.default` read as the op a policy matches."""

from __future__ import annotations

from typing import Any

import torch

from .. import compat
from .._config import ConfigError


def ops_of(field: str, ops: Any) -> tuple[Any, ...]:
    """A tuple of ops a SAC policy can match (`func is op`): names are looked up, anything else is refused."""
    if isinstance(ops, str) or not isinstance(ops, (tuple, list, set, frozenset)):
        raise ConfigError(
            "ACConfig",
            field,
            f"{ops!r} is not a tuple of ops.",
            "pass e.g. (torch.ops.aten.mm.default,) or ('aten.mm.default',).",
        )
    out = []
    for op in ops:
        if isinstance(op, str):
            op = op_from_name(op, field=field)
        kind = compat.op_kind(op)
        if kind == "packet":
            raise ConfigError(
                "ACConfig",
                field,
                f"torch.ops.{op} is an overload packet, which a policy's func never equals.",
                f"name the overload, e.g. torch.ops.{op}.default.",
            )
        if kind is None:
            raise ConfigError(
                "ACConfig",
                field,
                f"{op!r} is not a torch op.",
                "pass ops like torch.ops.aten.mm.default or names like 'aten.mm.default'.",
            )
        out.append(op)
    return tuple(out)


def op_from_name(name: Any, *, owner: str = "ACConfig", field: str = "save_ops"):
    """`'aten.mm.default'` → `torch.ops.aten.mm.default` (ops round-trip through JSON by name)."""
    if not isinstance(name, str):
        return name
    ns, _, rest = name.partition(".")
    packet_name, _, overload = rest.partition(".")
    try:
        packet = getattr(getattr(torch.ops, ns), packet_name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError, ValueError):
        raise ConfigError(
            owner, field, f"{name!r} is not a torch op.", "use names like 'aten.mm.default' (namespace.op.overload)."
        ) from None
