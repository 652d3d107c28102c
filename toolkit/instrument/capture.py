"""Warnings and torch's log records during a step, captured as Report lines instead of reaching the terminal."""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Iterator


class _LogCapture(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.sink.append(f"{record.name}: {record.getMessage().strip()}")
        except Exception:
            # A log record whose message cannot be formatted is torch's bug, not the step's: a handler must not
            # raise into the code that logged (logging's own rule), and the Report keeps the other warnings.
            pass


@contextlib.contextmanager
def capture_warnings(sink: list[str]) -> Iterator[None]:
    """Python warnings and torch's logger warnings go into `sink` instead of the notebook's stderr."""
    logger = logging.getLogger("torch")
    handler = _LogCapture(sink)
    old_propagate = logger.propagate
    old_handlers = list(logger.handlers)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for h in old_handlers:
            logger.removeHandler(h)
        logger.addHandler(handler)
        logger.propagate = False
        try:
            yield
        finally:
            logger.removeHandler(handler)
            for h in old_handlers:
                logger.addHandler(h)
            logger.propagate = old_propagate
            for w in caught:
                sink.append(f"{w.category.__name__}: {str(w.message).strip()}")
