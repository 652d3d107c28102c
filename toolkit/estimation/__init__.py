"""Full-size estimates on fake tensors: what a step would save and peak at, without running it."""

from .accounting import CUDA_BLOCK
from .estimates import estimate
from .inputs import ScenarioLike
from .limits import ESTIMATE_BACKENDS, ESTIMATE_RECIPES, MAX_WORLD_SIZE, check, check_world
from .records import Estimate, EstimatedTensor
from .shapes import LAYER_SHAPES

__all__ = [
    "LAYER_SHAPES",
    "Estimate",
    "EstimatedTensor",
    "estimate",
    "check",
    "check_world",
    "ScenarioLike",
    "CUDA_BLOCK",
    "ESTIMATE_BACKENDS",
    "ESTIMATE_RECIPES",
    "MAX_WORLD_SIZE",
]
