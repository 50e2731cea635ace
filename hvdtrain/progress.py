"""A progress report for long work in one process (``data convert``, rank 0 of ``predict``): a
bar on a terminal, redrawn at most 10 times a second, else a line every ``every_s`` seconds
into a log; always a last line."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, TextIO


@dataclass
class Progress:
    total: int
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    every_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    label: str = "converting"
    done: int = 0

    def __post_init__(self) -> None:
        self.tty = self.stream.isatty()
        self._start = self._last = self.clock()

    def advance(self, n: int = 1) -> None:
        """Counts ``n`` more samples done and redraws the bar, or writes the line, when it is due;
        always at the last sample."""
        self.done += n
        now = self.clock()
        if self.done < self.total and now - self._last < (0.1 if self.tty else self.every_s):
            return
        self._last = now
        rate = self.done / max(now - self._start, 1e-9)
        left = (self.total - self.done) / rate if rate else 0.0
        width = 30
        bar = "#" * (width * self.done // max(self.total, 1))
        text = (f"{self.label} [{bar:<{width}}] {self.done}/{self.total} samples "
                f"{rate:,.0f}/s {left:.0f}s left")
        end = "\n" if not self.tty or self.done >= self.total else ""
        self.stream.write(("\r" if self.tty else "") + text + end)
        self.stream.flush()
