"""What a measurement is and holds: the Scenario to run, its presets, and the Report a step gives (with the reading of
a checkpoint error). Running it is `toolkit.execution`'s; the probes are `toolkit.instrument`'s."""

from ..instrument.records import SavedTensor, fmt_bytes, fmt_measured_bytes
from .presets import PRESETS, preset
from .report import Report, ScenarioRecord
from .scenario import Scenario, check_structure

__all__ = [
    "PRESETS",
    "preset",
    "Report",
    "ScenarioRecord",
    "SavedTensor",
    "fmt_bytes",
    "fmt_measured_bytes",
    "Scenario",
    "check_structure",
]
