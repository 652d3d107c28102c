"""The skeleton every in-process step shares: the process state restored and warnings captured around it, an
exception kept as the result (a failing step is a Report, not a crash), and the Report assembled from what got that
far."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

from torch import nn

from .._config import ConfigError
from ..instrument import numerics as _numerics
from ..instrument.capture import capture_warnings
from ..instrument.records import Numerics
from ..instrument.step import Stage, StepResult, restoring_process_state
from ..measurement.report import (
    Report,
    ScenarioRecord,
    Transforms,
)
from .assemble import assemble


class Refused(ConfigError):
    """A ConfigError that only the step could find (what a `loss_fn` returns): raised to the caller, not kept as the
    Report's error."""


class Attempt:
    """The skeleton `run_here` and `measure` share: the process state restored and warnings captured around the
    step, an exception in it kept as the result (a failing step is a Report, not a crash), and the Report
    assembled from whatever got that far."""

    def __init__(
        self,
        record: ScenarioRecord,
        *,
        requested: bool,
        reset_dynamo: bool,
        on_stage: Callable[[str], None] | None = None,
        instrumented: bool = True,
    ):
        self.record, self.requested, self.reset_dynamo = record, requested, reset_dynamo
        self.instrumented = instrumented
        self.stage = Stage(on_stage)
        self.warn: list[str] = []
        self.timing: dict[str, float] = {}
        self.orders: dict[str, str] = {}
        self.transforms = Transforms()
        self.packages: tuple[str, ...] = ()
        """What the model is made of (`naming.model_packages`), set once it is built."""
        self.steps: StepResult | None = None
        self.numerics: Numerics | None = None
        self.err: BaseException | None = None
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> "Attempt":
        self.stack.enter_context(restoring_process_state(reset_dynamo=self.reset_dynamo))
        self.stack.enter_context(capture_warnings(self.warn))
        return self

    def __exit__(self, kind, err, tb) -> bool:
        # The scenario failing is a result; KeyboardInterrupt & co. are not, and neither is an input refused
        # once the step showed it bad (a loss_fn returning a float): that goes to the caller as the ConfigError it is.
        caught = isinstance(err, Exception) and not isinstance(err, Refused)
        if caught:
            self.err = err
            if self.steps is not None and self.steps.loss is not None:
                self.numerics = Numerics(loss=self.steps.loss)
        self.stack.close()
        return caught

    def check_loss(self, model: nn.Module, forward: Callable[[], Any], inputs: Any, loss_of, reference: str) -> None:
        """A NaN or infinite loss: raise NonFiniteLoss naming where the first non-finite value appears (an eager
        re-run with hooks), so the Report says that instead of a gradient mismatch."""
        loss = self.steps.loss if self.steps is not None else None
        if loss is None or math.isfinite(loss):
            return
        self.stage.name = "forward"  # where the value came from; the stage line is not told again
        where = _numerics.first_non_finite(model, forward, inputs, loss_of)
        raise _numerics.NonFiniteLoss(_numerics.non_finite_message(loss, where, reference))

    def report(self) -> Report:
        return assemble(
            instrumented=self.instrumented,
            record=self.record,
            stage=self.stage,
            steps=self.steps,
            err=self.err,
            warn=self.warn,
            timing=self.timing,
            packages=self.packages,
            requested=self.requested,
            orders=self.orders,
            numerics=self.numerics,
            transforms=self.transforms,
        )
