"""The launcher's watchdog: it owns the clock and the kill switch while a job runs.

The training window is measured here from rank 0's reports, stamped on arrival with the
launcher's own monotonic clock. The job is killed (SIGTERM, then SIGKILL) at budget + grace
after training started, if training has not started within the start-up timeout, if saving
the checkpoint after training takes too long, or when the launcher is told to stop.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from harness.launcher.channel import ChannelServer
from harness.launcher.elastic import ElasticJob

POLL_S = 0.1


class AbortFlag:
    """Set by SIGINT / SIGTERM / SIGHUP; the watch loops see it within one poll."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal_name: str | None = None

    def set(self, name: str) -> None:
        self.signal_name = self.signal_name or name
        self.event.set()

    @property
    def is_set(self) -> bool:
        return self.event.is_set()


@contextmanager
def abort_on_signals() -> Iterator[AbortFlag]:
    flag = AbortFlag()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {}

    def handler(signum, _frame):
        flag.set(signal.Signals(signum).name)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass
class WatchResult:
    kill_status: str | None = None  # "timeout" or "aborted" when the launcher ended the job
    kill_reason: str = ""
    kill_at_s: float | None = None  # launcher monotonic time of the kill
    killed_pids: list[int] = field(default_factory=list)
    train_start_s: float | None = None
    train_end_s: float | None = None
    exited_s: float | None = None  # when the agent returned
    limit_s: float | None = None  # when the limit that caused a kill passed
    all_gone_s: float | None = None  # when every process of the job was gone after a kill
    agent_abandoned: bool = False  # the agent thread did not return after the kill

    def timings(self, launched_s: float) -> dict[str, float]:
        """Phase durations as the launcher saw them: start-up, training, save and teardown."""
        out: dict[str, float] = {}
        if self.train_start_s is not None:
            out["startup_s"] = self.train_start_s - launched_s
        if self.launcher_train_time_s is not None:
            out["train_s"] = self.launcher_train_time_s
        end = self.train_end_s or self.kill_at_s
        if end is not None and self.exited_s is not None:
            out["save_and_teardown_s"] = self.exited_s - end
        if self.all_gone_s is not None and self.limit_s is not None:
            out["kill_latency_s"] = self.all_gone_s - self.limit_s  # limit passed -> every process gone
        return out

    @property
    def launcher_train_time_s(self) -> float | None:
        if self.train_start_s is None:
            return None
        end = self.train_end_s or self.kill_at_s or self.exited_s
        return None if end is None else end - self.train_start_s


@dataclass(kw_only=True)
class Deadlines:
    startup_timeout_s: float  # launch -> training started
    hard_limit_s: float | None = None  # training started -> kill (budget + grace)
    after_train_s: float = 300.0  # training ended -> ranks gone (checkpoint save, teardown)
    total_s: float | None = None  # launch -> kill, for jobs without a training window (evaluation)
    abandon_agent_s: float = 15.0  # after a kill, how long to wait for the agent thread to return


def _kill(job: ElasticJob, result: WatchResult, status: str, reason: str, limit_s: float | None = None) -> None:
    """End the job now; `limit_s` is when the limit that triggered it passed (for the kill latency)."""
    result.kill_status, result.kill_reason, result.kill_at_s = status, reason, time.monotonic()
    result.killed_pids = job.kill()
    result.all_gone_s = time.monotonic()
    result.limit_s = limit_s if limit_s is not None else result.kill_at_s


def watch(job: ElasticJob, channel: ChannelServer, deadlines: Deadlines, abort: AbortFlag,
          on_tick: Callable[[WatchResult], None] | None = None) -> WatchResult:
    """Run the loop until the agent returns; kill the job when a deadline passes or on abort."""
    result = WatchResult()
    launched = time.monotonic()
    while job.running():
        channel.wait(POLL_S)
        now = time.monotonic()
        start, end = channel.first("train_start"), channel.first("train_end")  # from this node's first rank
        result.train_start_s = start.received_s if start else None
        result.train_end_s = end.received_s if end else None
        if on_tick:
            on_tick(result)
        if result.kill_status:
            if now - result.kill_at_s > deadlines.abandon_agent_s:
                # The agent thread is stuck (say, in a rendezvous with a node that never came): every
                # process of the job is already gone, so stop waiting for it; it dies with the launcher.
                result.agent_abandoned = True
                break
            continue  # already killed: wait for the agent to notice
        if abort.is_set:
            _kill(job, result, "aborted", f"stopped by {abort.signal_name}")
        elif deadlines.total_s is not None and now - launched > deadlines.total_s:
            _kill(job, result, "timeout", f"did not finish within {deadlines.total_s:.0f} s")
        elif start is None and deadlines.hard_limit_s is not None and now - launched > deadlines.startup_timeout_s:
            _kill(job, result, "timeout", f"training did not start within {deadlines.startup_timeout_s:.0f} s of launch")
        elif start is not None and end is None and deadlines.hard_limit_s is not None \
                and now - start.received_s > deadlines.hard_limit_s:
            _kill(job, result, "timeout",
                  f"killed at the hard limit: {deadlines.hard_limit_s:.1f} s (budget + grace) after training started",
                  limit_s=start.received_s + deadlines.hard_limit_s)
        elif end is not None and now - end.received_s > deadlines.after_train_s:
            _kill(job, result, "timeout",
                  f"ranks still running {deadlines.after_train_s:.0f} s after training ended (checkpoint save hung?)")
    result.exited_s = time.monotonic()
    start, end = channel.first("train_start"), channel.first("train_end")
    result.train_start_s = start.received_s if start else None
    result.train_end_s = end.received_s if end else None
    if abort.is_set and not result.kill_status:
        result.kill_status, result.kill_reason = "aborted", f"stopped by {abort.signal_name}"
    return result
