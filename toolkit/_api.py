"""Where each public name comes from: imported whole (seconds: torch) on first use of a name of `toolkit.__all__`."""

# ruff: noqa: F401 - the names are re-exported; the list of them is toolkit.__all__

from ._config import ConfigError
from .analysis import classify, sweep
from .analysis.plan import plan
from .bugs import repro
from .estimation import estimate
from .execution import measure, run, run_distributed
from .measurement import Report, Scenario
from .models import ModelConfig, build_model, make_batch
from .notebook.setup import setup_notebook
from .stacks.torchtitan import TorchtitanConfig
from .stacks.transformers import TransformersConfig
from .transforms import ACConfig, CompileConfig, apply_ac, apply_compile, train_step
