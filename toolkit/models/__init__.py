"""The toolkit's model zoo: a torchtitan-shaped transformer with dense and MoE blocks."""

from .config import ModelConfig
from .moe import FeedForward, GroupedExperts, MoE, TokenChoiceTopKRouter
from .transformer import Attention, Batch, Transformer, TransformerBlock, build_model, loss_fn, make_batch

__all__ = [
    "ModelConfig",
    "FeedForward",
    "GroupedExperts",
    "MoE",
    "TokenChoiceTopKRouter",
    "Attention",
    "Batch",
    "Transformer",
    "TransformerBlock",
    "build_model",
    "loss_fn",
    "make_batch",
]
