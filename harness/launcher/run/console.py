"""What a person sees: one updating progress line while a job runs, then a short summary.

The library reports through a Reporter; NullReporter has the same methods and says nothing
(tests, library use). ConsoleReporter writes the summary, the command's result, to stdout, and
everything else (phases, progress, errors) to stderr, so that `harness run ... > out.txt` keeps
the result and a terminal still shows the progress. On a terminal the progress is one line
redrawn in place; in a log (not a terminal) a line only when there is something new: once per
phase, and once per progress report during training (the track's log interval), never the same
line twice.
"""

from __future__ import annotations

import sys
from typing import TextIO

from harness.submission.printable import printable


def fmt_rate(tokens_per_s: float | None) -> str:
    if tokens_per_s is None:
        return "-"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if tokens_per_s >= scale:
            return f"{tokens_per_s / scale:.1f}{unit}"
    return f"{tokens_per_s:.0f}"


def progress_text(elapsed_s: float, budget_s: float, step: int | None, loss: float | None,
                  tokens_per_s: float | None, log_interval_s: float | None = None) -> str:
    left = max(0.0, budget_s - elapsed_s)
    if step is None:  # rank 0 has not reported yet: say when it will, not "step - | loss -"
        every = f" (every {log_interval_s:g}s)" if log_interval_s else ""
        return (f"train {elapsed_s:6.1f}s / {budget_s:.0f}s | first steps running; step, loss and tok/s are "
                f"reported at the first log interval{every} | {left:5.1f}s left")
    loss_s = f"{loss:.4f}" if loss is not None and loss == loss else "not finite"
    return (f"train {elapsed_s:6.1f}s / {budget_s:.0f}s | step {step} | loss {loss_s} | "
            f"{fmt_rate(tokens_per_s)} tok/s | {left:5.1f}s left")


class NullReporter:
    def info(self, text: str) -> None: ...
    def progress(self, text: str, key: object = None) -> None: ...
    def end_progress(self) -> None: ...
    def error(self, text: str) -> None: ...
    def summary(self, lines: list[str]) -> None: ...


class ConsoleReporter(NullReporter):
    def __init__(self, stream: TextIO | None = None, out: TextIO | None = None):
        self.stream = stream or sys.stderr  # progress, phases, errors
        self.out = out or sys.stdout  # the summary: what the command produced
        self.tty = self.stream.isatty()
        self._last_key: object = None
        self._live = False
        self._width = 0

    def _clear(self) -> None:
        if self._live:
            self.stream.write("\r" + " " * self._width + "\r")
            self._live = False

    def info(self, text: str) -> None:
        self._clear()
        self.stream.write(printable(text, 4000) + "\n")
        self.stream.flush()

    def progress(self, text: str, key: object = None) -> None:
        """`key` names what the line is about (a phase, a step): a log gets a line only when it changes, so a
        phase that ticks for a minute is one line, and training is one line per progress report."""
        text = printable(text, 4000)
        if self.tty:
            self._width = max(self._width, len(text))
            self.stream.write("\r" + text.ljust(self._width))
            self._live = True
            self.stream.flush()
            return
        key = text if key is None else key
        if key != self._last_key:
            self._last_key = key
            self.stream.write(text + "\n")
            self.stream.flush()

    def end_progress(self) -> None:
        if self._live:
            self.stream.write("\n")
            self._live = False
            self.stream.flush()

    def error(self, text: str) -> None:
        self._clear()
        self.stream.write(f"error: {printable(text, 4000, one_line=False)}\n")
        self.stream.flush()

    def summary(self, lines: list[str]) -> None:
        # On a terminal stdout and stderr are one screen: blank the live progress line, and flush it,
        # before the summary's first byte, or the summary would be written over a half-cleared line.
        self._clear()
        self.stream.flush()
        # Lines may hold a team's text (a reason): shown, never obeyed (summary_lines indents their line breaks).
        self.out.write("\n".join(printable(line, 8000, one_line=False) for line in lines) + "\n")
        self.out.flush()
