"""Every rule that keeps an older record readable, or a record's keys what they were: one versioned table.

A record is the JSON of a config (`to_dict`) or of a Report. Files, bug bundles and the matrix's cache keys were written
by earlier versions of the toolkit, so a record must read back, and a config that has not changed must write the same
keys as before. Each rule says which record it is for, the version of that record it came with, and why; `PlainData`
(`_config.py`) and the Report's reader (`measurement/schema.py`) apply them, and nothing else does.

A rule's functions live beside the record they know (an AC mode's options are `transforms/ac.py`'s), named here as
`module:function` and resolved when a record is read or written, so this table sits below every layer it serves.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Migration:
    record: str
    """The record's kind: "Report", "Scenario", "ModelConfig", "CompileConfig", "ACConfig"."""
    version: int
    """The version of that record the rule came with (a Report carries it as `schema_version`; a config's records
    carry none, so its rules recognise the older shape themselves)."""
    why: str
    added: tuple[str, ...] = ()
    """Fields added at `version`: left out of a record while at their default (the records and cache keys written
    before them stay the same), and read as the default where a record lacks them."""
    unkeyed: tuple[str, ...] = ()
    """Fields added at `version` that the record writes (null while unset) but a cache key leaves out while null, so
    that the results stored before them keep their keys."""
    upgrade: str = ""
    """`module:function`, record dict → record dict: an older record rewritten as this version reads it."""
    shape: str = ""
    """`module:function`, record dict → record dict: this version's record written in the shape older readers and
    the cache keys expect."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        "Report",
        2,
        "schema 1 held the Scenario's own dict as `scenario`; schema 2 holds what was measured (a ScenarioRecord)",
        upgrade="toolkit.measurement.schema:scenario_of_schema_1",
    ),
    Migration(
        "Report",
        3,
        "the step records what the cases are matched by (packages, AOTAutograd, the activation budget, the checkpoints "
        "that ran eagerly); a schema-2 record has them read off its outcome and configuration",
        upgrade="toolkit.measurement.schema:observations_of_schema_2",
    ),
    Migration(
        "ACConfig",
        2,
        "each AC mode became a class of its own, holding only its options; the record still holds every mode's "
        "option (the unset value where the mode does not read it), as records written before did",
        upgrade="toolkit.transforms.ac:from_every_option_record",
        shape="toolkit.transforms.ac:every_option_record",
    ),
    Migration("ACConfig", 3, "transformers' activation offloading (`offload=True`)", added=("offload",)),
    Migration(
        "ACConfig",
        4,
        "torchtitan main's torch_remat (mode remat): its regions, and `debug` held null as the first remat records did",
        unkeyed=("save_regions", "recompute_regions"),
        shape="toolkit.transforms.ac:remat_debug_unset",
    ),
    Migration("ACConfig", 5, "a checkpoint's policy dict (pytorch#186277)", unkeyed=("policy_save",)),
    Migration(
        "ModelConfig",
        2,
        "grouped-query attention, head size, qk-norm and dropout",
        added=("n_kv_heads", "attention_head_dim", "qk_norm", "attention_dropout", "residual_dropout"),
    ),
    Migration("CompileConfig", 2, "compiled functions (torchtitan main's local compile)", added=("functions",)),
    Migration(
        "Scenario",
        2,
        "other stacks, FSDP2, expert parallel and the uninstrumented run",
        added=("stack", "fsdp", "ep", "instrument"),
    ),
)


def of(record: str) -> tuple[Migration, ...]:
    """The rules for one kind of record, oldest first."""
    return tuple(sorted((m for m in MIGRATIONS if m.record == record), key=lambda m: m.version))


def added(record: str) -> tuple[str, ...]:
    """The fields of `record` left out while at their default."""
    return tuple(name for m in of(record) for name in m.added)


def keyed(record: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` as a cache key holds it: without the fields a key leaves out while they are null."""
    out = {name for m in of(record) for name in m.unkeyed}
    return {k: v for k, v in data.items() if not (k in out and v is None)}


def upgrade(record: str, data: dict[str, Any], version: int = 0) -> dict[str, Any]:
    """`data` as this version reads it: each rule newer than `version` (the record's own, where it carries one)
    rewrites it in turn."""
    for m in of(record):
        if m.upgrade and m.version > version:
            data = _resolve(m.upgrade)(data)
    return data


def shape(record: str, data: dict[str, Any]) -> dict[str, Any]:
    """`data` written as the records before it were."""
    for m in of(record):
        if m.shape:
            data = _resolve(m.shape)(data)
    return data


@functools.cache
def _resolve(target: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    module, name = target.split(":")
    fn: Callable[[dict[str, Any]], dict[str, Any]] = getattr(importlib.import_module(module), name)
    return fn
