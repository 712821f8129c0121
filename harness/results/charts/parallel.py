"""Draws a board's charts in two processes where that is safe: a fork of this one draws half of them.

The charts are most of a board's rebuild (about 0.3-0.7 s of matplotlib each for 100 teams, one after the other);
they share nothing but their inputs, which a fork holds already, so a second core halves the wait. A fork is made
only from a process with no other thread (a lock another thread held at the fork would stay held in the copy for
ever: a watcher, the launcher during a run and pytest-xdist's workers draw in one process, as before). The copy
only writes its PNGs (each atomically, as any chart is written) and leaves with `os._exit`; a chart it did not
finish, whatever the cause, is drawn again here, so an error is raised where it always was, with its traceback.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from harness.results.charts.kit import save_png

FORK_WAIT_S = 120.0  # a copy slower than this is stuck, not busy: this process draws its charts itself


def may_fork() -> bool:
    """A fork is safe here: Linux (macOS forbids much of what a fork after numpy would use), one Python thread,
    and a second CPU this process may run on to give the copy."""
    return sys.platform.startswith("linux") and threading.active_count() == 1 and len(os.sched_getaffinity(0)) >= 2


def _die_with_parent() -> None:
    """The copy never outlives the process that builds the board (it would write an older chart over a newer)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


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
            _die_with_parent()
            if os.getppid() != parent:  # the parent died before the line above
                os._exit(1)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            for i in theirs:
                jobs[i].draw()
        except BaseException:  # noqa: BLE001  (this process draws the chart again, and raises its error)
            code = 1
        os._exit(code)
    try:
        for i in mine:
            jobs[i].draw()
    finally:
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


def reap(pid: int, wait_s: float) -> bool:
    """True when the copy ended by itself with success; a copy past `wait_s` is killed (and False)."""
    end = time.monotonic() + wait_s
    delay = 0.002
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return False
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
