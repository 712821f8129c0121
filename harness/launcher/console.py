"""What a person sees: one updating progress line while a job runs, then a short summary.

The library reports through a Reporter; NullReporter has the same methods and says nothing
(tests, library use), ConsoleReporter writes to stderr (a redrawn line on a terminal, a line
every few seconds in a log file).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def fmt_rate(tokens_per_s: float | None) -> str:
    if tokens_per_s is None:
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if tokens_per_s >= scale:
            return f"{tokens_per_s / scale:.1f}{unit}"
    return f"{tokens_per_s:.0f}"


def progress_text(elapsed_s: float, budget_s: float, step: int | None, loss: float | None,
                  tokens_per_s: float | None) -> str:
    left = max(0.0, budget_s - elapsed_s)
    loss_s = f"{loss:.4f}" if loss is not None and loss == loss else "-"
    step_s = "-" if step is None else str(step)
    return (f"train {elapsed_s:6.1f}s / {budget_s:.0f}s | step {step_s} | loss {loss_s} | "
            f"{fmt_rate(tokens_per_s)} tok/s | {left:5.1f}s left")


class NullReporter:
    def info(self, text: str) -> None: ...
    def progress(self, text: str) -> None: ...
    def end_progress(self) -> None: ...
    def error(self, text: str) -> None: ...
    def summary(self, lines: list[str]) -> None: ...


class ConsoleReporter(NullReporter):
    def __init__(self, stream: TextIO | None = None, plain_every_s: float = 5.0):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.plain_every_s = plain_every_s
        self._last_plain = 0.0
        self._live = False
        self._width = 0

    def _clear(self) -> None:
        if self._live:
            self.stream.write("\r" + " " * self._width + "\r")
            self._live = False

    def info(self, text: str) -> None:
        self._clear()
        self.stream.write(text + "\n")
        self.stream.flush()

    def progress(self, text: str) -> None:
        if self.tty:
            self._width = max(self._width, len(text))
            self.stream.write("\r" + text.ljust(self._width))
            self._live = True
            self.stream.flush()
        elif time.monotonic() - self._last_plain >= self.plain_every_s:
            self._last_plain = time.monotonic()
            self.stream.write(text + "\n")
            self.stream.flush()

    def end_progress(self) -> None:
        if self._live:
            self.stream.write("\n")
            self._live = False
            self.stream.flush()

    def error(self, text: str) -> None:
        self._clear()
        self.stream.write(f"error: {text}\n")
        self.stream.flush()

    def summary(self, lines: list[str]) -> None:
        self._clear()
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
