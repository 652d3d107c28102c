"""The machine a measurement ran on: `environment()`, what a Report records of it (torch, python, CPU, threads, GPU).

The one home of `environment()` (the module is named apart from the function, so that neither shadows the other).
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

import torch

from .. import _files, compat


@functools.lru_cache(maxsize=1)
def _cpu_model() -> str:
    from .._config import ConfigError

    try:
        text = _files.read_capped("/proc/cpuinfo", "environment", "cpu", 16 << 20, name="/proc/cpuinfo")
        for line in text.splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except ConfigError:  # not Linux
        pass
    return platform.processor() or platform.machine()


def environment(*, features: bool = True) -> dict[str, Any]:
    """torch and python versions, platform, CPU model, cores and the intra-op threads the step ran with (CPU peak
    memory depends on both: kernel workspaces), the GPU if any, and (`features`) the private torch APIs this torch
    lacks — detecting them imports Dynamo, which a sweep that only reads its results does without (each cell's
    Report carries its own)."""
    env: dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
    missing = [f.name for f in compat.missing()] if features else []
    if missing:
        env["torch_features_missing"] = missing
    return env
