"""Measurement: a Scenario or any module → one instrumented training step → a Report; estimates.

Measurement: a Scenario or any module → one instrumented training step → a Report (saved, recompute, compile, memory,
numerics), plus full-size estimates on fake tensors.
"""

from .distributed import DistributedReport, run_distributed
from .estimates import LAYER_SHAPES, Estimate, estimate
from .machine import environment
from .presets import PRESETS, preset
from .report import Report, SavedTensor, ScenarioRecord, fmt_bytes
from .runner import measure, run
from .scenario import Scenario, check_structure

__all__ = [
    "DistributedReport",
    "run_distributed",
    "environment",
    "LAYER_SHAPES",
    "Estimate",
    "estimate",
    "PRESETS",
    "preset",
    "Report",
    "ScenarioRecord",
    "SavedTensor",
    "fmt_bytes",
    "measure",
    "run",
    "Scenario",
    "check_structure",
]
