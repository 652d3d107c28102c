"""A matrix block's name → its stack and model config: `titan:FAMILY`, `hf:FAMILY[:EXPERTS]`, `user:SPEC[#CLASS]`.

The toolkit's own blocks (`dense`, `moe:IMPL`, …) carry no stack prefix: `cells.Cell.model_config` reads them. The
names are the keys of the committed matrix records, so a prefix here is never renamed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ..stacks.user import UserModelConfig

PREFIXES: dict[str, str] = {"torchtitan": "titan", "transformers": "hf", "user": "user"}
"""Stack name → the prefix of its blocks: every stack but the toolkit's own, whose models are someone else's."""


def block_of(stack: str, *parts: str) -> str:
    """The block that names `stack`'s model `parts` (`block_of("torchtitan", "qwen3_moe")` → `titan:qwen3_moe`)."""
    return ":".join((PREFIXES[stack], *parts))


def user_block(cfg: UserModelConfig) -> str:
    """A model of yours as a block: `user:SPEC`, or `user:SPEC#CLASS` with its blocks' class named."""
    return block_of("user", cfg.build + (f"#{cfg.blocks}" if cfg.blocks else ""))


def stack_of(block: str) -> str:
    """The stack whose block `block` is (`titan:qwen3_moe` → "torchtitan"; no known prefix → "toolkit")."""
    prefix = block.split(":", 1)[0]
    return next((name for name, p in PREFIXES.items() if p == prefix), "toolkit")


def config_of(block: str) -> Any:
    """The model config of another stack's block, as its stack's config class checks it (its `config_field`); a
    KeyError for the toolkit's own blocks."""
    stack = stack_of(block)
    if stack == "torchtitan":
        from ..stacks.torchtitan import TorchtitanConfig

        return TorchtitanConfig.of_family(block.split(":", 1)[1])
    if stack == "transformers":
        from ..stacks.transformers import Family, TransformersConfig

        parts = block.split(":")  # hf:FAMILY or hf:FAMILY:EXPERTS
        experts: dict[str, Any] = {"experts": parts[2]} if len(parts) > 2 else {}
        return TransformersConfig(family=cast(Family, parts[1]), **experts)  # the config checks both names
    if stack == "user":
        from ..stacks.user import UserModelConfig

        build, _, cls = block.split(":", 1)[1].partition("#")
        return UserModelConfig(build=build, blocks=cls or None)
    raise KeyError(f"{block!r} is the toolkit's own block (`cells.Cell.model_config`), of no other stack")


__all__ = ["PREFIXES", "block_of", "config_of", "stack_of", "user_block"]
