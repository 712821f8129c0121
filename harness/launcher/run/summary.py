"""The run's summary on the console: what `harness run` prints when a run (or a team's repeated runs) ends.

Read from the record alone (harness/launcher/run/assemble.py made it): what the person who started the run reads
first, with every team-written text shown as text, never obeyed."""

from __future__ import annotations

import math
from pathlib import Path

from harness.launcher.run.console import fmt_rate
from harness.results.records import RunRecord
from harness.submission.printable import REASON_MAX_CHARS, indented, printable


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
