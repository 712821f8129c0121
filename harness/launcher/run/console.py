"""What a person sees: one updating progress line while a job runs, then a short summary.

The library reports through a Reporter; NullReporter has the same methods and says nothing
(tests, library use). ConsoleReporter writes the summary, the command's result, to stdout, and
everything else (phases, progress, errors) to stderr, so that `harness run ... > out.txt` keeps
the result and a terminal still shows the progress. On a terminal the progress is one line
redrawn in place; in a log (not a terminal) a line only when there is something new: once per
phase, and once per progress report during training (the track's log interval), never the same
line twice.

The summary (`summary_lines`, `repeat_summary`) is what `harness run` prints when a run, or a team's repeated runs,
ends: read from the record alone (harness/launcher/run/assemble.py made it), every team-written text shown as
text, never obeyed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TextIO

from harness.results.records import RunRecord
from harness.submission.printable import REASON_MAX_CHARS, indented, printable


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


# --------------------------------------------------------------------------- the summary at the end


def summary_lines(record: RunRecord, run_dir: Path) -> list[str]:
    reason = indented(printable(record.reason, REASON_MAX_CHARS, one_line=False), " " * 11)
    lines = [f"status     {record.status}" + (f"  ({reason})" if record.reason else "")]
    if record.val_loss is not None:
        floor = ""
        if record.loss_floor is not None:
            floor = f"  (floor {record.loss_floor:.4f}, gap {record.val_loss - record.loss_floor:+.4f})"
        lines.append(f"val_loss   {record.val_loss:.4f}{floor}")
    if record.train_time_s is not None:
        lines.append(f"trained    {_trained(record)}")
    if record.train_loss is not None:
        lines.append(f"train_loss {record.train_loss:.4f}  (the last logged mean over the ranks)")
    if not record.official:
        lines.append(f"unofficial overrides: {', '.join(record.overrides)}  (listed only by "
                     f"`harness leaderboard --all`)")
    if record.flagged:
        lines.append(f"FLAGGED    {record.flag_reason} (hidden from the ranking until reviewed)")
    for warning in record.warnings:
        lines.append(f"WARNING    {printable(warning)}")
    shown = _near(run_dir)
    lines.append(f"record     {shown}")
    if record.status not in ("ok",):
        lines.append(f"logs       {shown / 'logs'}")
    return lines


def _near(path: Path) -> Path:
    """A path as the person typed their way to it: relative to the current folder when it is inside it."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve())
    except (ValueError, OSError):
        return Path(path)


def _trained(record: RunRecord) -> str:
    """The summary's training line: what bounded the run and what the window covers, in words, with
    what was not reported left out rather than printed as None."""
    counts = [f"{record.steps} steps" if record.steps is not None else "steps not reported",
              *([f"{record.tokens} tokens"] if record.tokens is not None else []),
              *([f"{fmt_rate(record.tokens_per_s)} tok/s"] if record.tokens_per_s else [])]
    max_steps = record.track.get("max_steps")
    if record.division == "open":  # the launcher's window (open_run.open_window), held to the budget (check_open_window)
        bound = f" (--max-steps {max_steps})" if max_steps else ""
        start = ("first_forward()" if record.startup_s is not None
                 else "the end of the start-up allowance: no first_forward()")
        end = ("its checkpoint saved" if record.extra.get("window_end") == "checkpoint"
               else "the job's exit")
        return (f"{record.train_time_s:.2f}s by the launcher's clock against a {record.budget_s:.0f}s budget{bound} "
                f"(from {start} to {end}), " + ", ".join(counts))
    if max_steps:  # the steps trained, of those asked for: a run can stop short (a divergence, the hard limit)
        done = "steps not reported" if record.steps is None else f"{record.steps} of {max_steps} steps"
        return f"{done} (--max-steps) in {record.train_time_s:.2f}s, " + ", ".join(counts[1:])
    return f"{record.train_time_s:.2f}s of {record.budget_s:.0f}s budget, " + ", ".join(counts)


def repeat_summary(records: list[RunRecord]) -> list[str]:
    """The seeds' mean, with the interval the board shows (stats.loss_interval: the runs' range from 2 runs,
    never below the loss floor), not a t half-width that at 2 runs reached a nat below the floor."""
    from harness.results.stats import loss_interval, summarize

    counted = [r for r in records if r.status == "ok" and r.val_loss is not None]
    ok = [r.val_loss for r in counted]
    line = f"{len(records)} runs (seeds {records[0].seed}..{records[-1].seed}): {len(ok)} ok"
    if ok:
        s = summarize(ok)
        line += f", val_loss mean {s.mean:.4f}"
        floors = [r.loss_floor for r in counted if isinstance(r.loss_floor, (int, float)) and math.isfinite(r.loss_floor)]
        interval = loss_interval(ok, sum(floors) / len(floors) if len(floors) == len(counted) else None)
        if interval is not None:
            line += f", {interval.text()}" + (f" (std {s.std:.4f})" if s.std is not None else "")
    return [line]
