"""Full-size estimates on fake tensors: what a step would save and peak at, without running it."""

from .estimates import LAYER_SHAPES, Estimate, estimate

__all__ = ["LAYER_SHAPES", "Estimate", "estimate"]
