"""The sweep's progress on the terminal: a tqdm bar sized to it, or a line per cell where there is none."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cells import Cell


class Progress:
    """Cells done, findings (any label but `works`), lost cells (crashed / timeout) and the last finished cell.
    On a terminal a tqdm bar sized to it (time left appears once a cell has finished); elsewhere a line per cell."""

    def __init__(self, total: int, done: int = 0, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = total, done, enabled and total > 0
        self.stream = stream or sys.stderr
        self.findings = self.lost = 0
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = None
        self._t0 = time.perf_counter()
        if self.enabled and self.tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                initial=done,
                file=self.stream,
                dynamic_ncols=True,
                unit="cell",
                desc="matrix",
                bar_format="{desc} {n_fmt}/{total_fmt} {bar} {elapsed}<{remaining} {postfix}",
            )

    def finish(self, cell: Cell, label: str) -> None:
        self.done += 1
        self.lost += label in ("crashed", "timeout")
        self.findings += label != "works" and label not in ("crashed", "timeout")
        tally = f"{self.findings} findings" + (f", {self.lost} lost" if self.lost else "")
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(f"{tally} | last: {label} {cell.label}", refresh=False)
            self._bar.update(1)
        else:
            at = time.perf_counter() - self._t0
            self.stream.write(f"[{self.done}/{self.total}] {label:18} {cell.label} (at {at:.0f} s; {tally})\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
