"""Draws a board's charts in two processes where that is safe: a fork of this one draws half of them.

The charts are most of a board's rebuild (about 0.3-0.7 s of matplotlib each for 100 teams, one after the other);
they share nothing but their inputs, which a fork holds already, so a second core halves the wait. When a fork is
safe, and how the copy lives and ends: harness/results/forked.py. The copy only writes its PNGs (each atomically, as
any chart is written); a chart it did not finish, whatever the cause, is drawn again here, so an error is raised
where it always was, with its traceback.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from harness.results.charts.kit import save_png
from harness.results.forked import FORK_WAIT_S, die_with_parent, may_fork, reap


@dataclass(frozen=True)
class ChartJob:
    """One chart: the file it is written to, its figure's maker, and its cost relative to the others (which share
    of the work it goes to)."""

    path: Path
    figure: Callable[[], Any]
    cost: float = 1.0

    def draw(self) -> Path:
        return save_png(self.figure(), self.path)


def draw_all(jobs: Sequence[ChartJob], *, fork: bool | None = None) -> list[Path]:
    """Draws every chart and returns their paths in the jobs' order. `fork`: None decides by may_fork()."""
    if not (may_fork() if fork is None else fork) or len(jobs) < 2:
        return [job.draw() for job in jobs]
    mine, theirs = split([job.cost for job in jobs])
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:  # no memory or no process left for a copy: one process draws them all
        return [job.draw() for job in jobs]
    if pid == 0:  # the copy: draw its share, and never return into the caller's code
        code = 0
        try:
            if not die_with_parent(parent):
                os._exit(1)
            for i in theirs:
                jobs[i].draw()
        except BaseException:  # noqa: BLE001  (this process draws the chart again, and raises its error)
            code = 1
        os._exit(code)
    try:
        for i in mine:
            jobs[i].draw()
    finally:
        # Even where this process's chart failed, the copy finishes its files (a kill could leave a temporary PNG
        # behind); an interruption kills it (reap).
        done = reap(pid, FORK_WAIT_S)
    if not done:  # the copy failed or hung: its charts are drawn here, so that an error is raised here
        for i in theirs:
            jobs[i].draw()
    return [job.path for job in jobs]


def split(costs: Sequence[float]) -> tuple[list[int], list[int]]:
    """The indices of the costs in two shares of about equal sum (the costliest first, each to the lighter share)."""
    shares: tuple[list[int], list[int]] = ([], [])
    total = [0.0, 0.0]
    for i in sorted(range(len(costs)), key=lambda k: -costs[k]):
        side = 0 if total[0] <= total[1] else 1
        shares[side].append(i)
        total[side] += costs[i]
    return sorted(shares[0]), sorted(shares[1])

