"""torch's structured-trace events: graph-break reasons with file:line, recompiles, compile times.

torch's structured-trace events (what tlparse reads): graph-break reasons with user file:line, recompiles, compile
times.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from typing import Iterator

from ... import compat
from .base import StepState


class TraceEvents(logging.Handler):
    def __init__(self, state: StepState):
        super().__init__(logging.DEBUG)
        self.state = state
        self.breaks: list[tuple[str, str, int]] = []
        self.recompiles: list[str] = []
        self.backward_recompiles: list[str] = []
        """Recompile reasons of frames compiled while backward ran (a checkpoint's recompute among them)."""
        self.compile_s = 0.0
        self.region_graphs: Counter[str] = Counter()
        self.blind: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        md = getattr(record, "metadata", None)
        if not isinstance(md, dict):
            return
        if "artifact" in md and md["artifact"].get("name") == "dynamo_graph_break_reason":
            payload = getattr(record, "payload", "") or ""
            m = re.search(r"Graph break in user code at (.*):(\d+)", payload)
            reason = payload.split("Graph Break Reason:", 1)[-1].strip()
            # Keep the operator-level sentence, not the generic "Encountered graph break when ..." preamble.
            lines = [ln.strip() for ln in reason.splitlines() if ln.strip()]
            if lines and lines[0].startswith("Encountered graph break") and len(lines) > 1:
                lines = lines[1:]
            self.breaks.append(("\n".join(lines[:3]), m.group(1) if m else "?", int(m.group(2)) if m else 0))
        elif "compilation_metrics" in md:
            cm = md["compilation_metrics"]
            if isinstance(cm, dict):
                if cm.get("recompile_reason"):
                    self.recompiles.append(str(cm["recompile_reason"]))
                    if self.state.phase == "backward":
                        self.backward_recompiles.append(str(cm["recompile_reason"]))
                t = cm.get("entire_frame_compile_time_s")
                if isinstance(t, (int, float)):
                    self.compile_s += float(t)
        elif "dynamo_output_graph" in md:
            self.region_graphs[self.state.region()] += 1

    @contextlib.contextmanager
    def listening(self) -> Iterator[None]:
        log = compat.trace_logger()
        if log is None:
            self.blind.add("structured_trace")
            yield
            return
        old_level, old_propagate = log.level, log.propagate
        log.addHandler(self)
        log.setLevel(logging.DEBUG)
        log.propagate = False
        try:
            yield
        finally:
            log.removeHandler(self)
            log.setLevel(old_level)
            log.propagate = old_propagate
