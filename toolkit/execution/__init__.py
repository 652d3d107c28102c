"""Where a measurement runs: in this process, in a subprocess or a warm fork server, or on N ranks; each run's
Report assembled from what the instrument saw."""

from .distributed import DistributedReport, run_distributed
from .machine import environment
from .runner import measure, run

__all__ = ["DistributedReport", "environment", "measure", "run", "run_distributed"]
