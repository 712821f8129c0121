"""The launcher's watchdog: it owns the clock and the kill switch while a job runs.

The training window is measured here from rank 0's reports, stamped on arrival with the
launcher's own monotonic clock. The job is killed (SIGTERM, then SIGKILL):
- if training has not started within the start-up timeout of launch;
- (open division, where the team's own script runs and nothing it says can be trusted) at the
  ranks' start + start-up allowance + budget + grace, whatever the script reports;
- if the team's start-up (from the process group being up to the first step: importing the
  submission, get_model, DDP, optimizers) takes longer than the track's start-up allowance;
- if training has not ended at budget + grace after it started (the hard limit);
- at budget + grace + save allowance after training started, or a save allowance after it
  ended, whatever the ranks say: a report that training ended does not switch the clock off;
- when the launcher is told to stop.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator

from harness.launcher.control.channel import ChannelServer
from harness.launcher.control.elastic import ElasticJob

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
    setup_start_s: float | None = None  # the process group is up: the team's start-up begins
    train_start_s: float | None = None
    train_end_s: float | None = None
    checkpoint_saved_s: float | None = None  # rank 0 said its checkpoint is in staging (node 0 only)
    progress_s: float | None = None  # the first progress report (an open-division script may send no train_start)
    exited_s: float | None = None  # when the agent returned
    limit_s: float | None = None  # when the limit that caused a kill passed
    all_gone_s: float | None = None  # when every process of the job was gone after a kill
    agent_abandoned: bool = False  # the agent thread did not return after the kill
    violation: str | None = None  # a cap the job broke, seen by a tick's callback (logs, scratch, checkpoint)
    infra: str | None = None  # the infrastructure failed (a node lost), seen by a tick's callback
    ended_by: tuple[str, str] | None = None  # (status, why): another node ended the run before training
    ended_traceback: str | None = None  # that node's traceback, where its end had one (a check's refusal)

    def timings(self, launched_s: float) -> dict[str, float]:
        """Phase durations as the launcher saw them: start-up, training, save and teardown."""
        out: dict[str, float] = {}
        if self.setup_start_s is not None:
            out["launch_to_setup_s"] = self.setup_start_s - launched_s
        if self.train_start_s is not None:
            out["launch_to_train_s"] = self.train_start_s - launched_s
        if self.startup_s is not None:
            out["startup_s"] = self.startup_s
        if self.launcher_train_time_s is not None:
            out["train_s"] = self.launcher_train_time_s
        end = self.train_end_s or self.kill_at_s
        if end is not None and self.exited_s is not None:
            out["save_and_teardown_s"] = self.exited_s - end
        if self.train_end_s is not None and self.checkpoint_saved_s is not None:
            out["checkpoint_s"] = self.checkpoint_saved_s - self.train_end_s  # what the checkpoint allowance bounds
        if self.all_gone_s is not None and self.limit_s is not None:
            out["kill_latency_s"] = self.all_gone_s - self.limit_s  # limit passed -> every process gone
        return out

    @property
    def startup_s(self) -> float | None:
        """The team's start-up: process group up -> first step (what the start-up allowance bounds)."""
        if self.setup_start_s is None or self.train_start_s is None:
            return None
        return self.train_start_s - self.setup_start_s

    @property
    def launcher_train_time_s(self) -> float | None:
        if self.train_start_s is None:
            return None
        end = self.train_end_s or self.kill_at_s or self.exited_s
        return None if end is None else end - self.train_start_s


@dataclass(kw_only=True)
class Deadlines:
    startup_timeout_s: float  # launch -> training started (rendezvous, imports, the team's start-up)
    startup_allowance_s: float | None = None  # process group up -> training started (the team's part)
    hard_limit_s: float | None = None  # training started -> training must have ended (budget + grace)
    save_allowance_s: float = 300.0  # after training: checkpoint save, communication probe, teardown
    checkpoint_allowance_s: float | None = None  # after training: until rank 0 says the checkpoint is saved
    total_s: float | None = None  # launch -> kill, for jobs without a training window (evaluation)
    abandon_agent_s: float = 15.0  # after a kill, how long to wait for the agent thread to return
    total_after_setup_s: float | None = None  # open division: ranks' start -> kill, no report extends it

    def __post_init__(self) -> None:
        for name in ("startup_timeout_s", "startup_allowance_s", "hard_limit_s", "save_allowance_s", "total_s",
                     "checkpoint_allowance_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")


def _kill(job: ElasticJob, result: WatchResult, status: str, reason: str, limit_s: float | None = None) -> None:
    """End the job now; `limit_s` is when the limit that triggered it passed (for the kill latency)."""
    result.kill_status, result.kill_reason, result.kill_at_s = status, reason, time.monotonic()
    result.killed_pids = job.kill()
    result.all_gone_s = time.monotonic()
    result.limit_s = limit_s if limit_s is not None else result.kill_at_s


def _stamp(result: WatchResult, channel: ChannelServer, lead_rank: int) -> None:
    """The first report of each kind from this node's first rank, as the launcher's clock saw it."""
    for kind, attr in (("setup_start", "setup_start_s"), ("train_start", "train_start_s"), ("train_end", "train_end_s"),
                       ("checkpoint_saved", "checkpoint_saved_s"), ("progress", "progress_s")):
        m = channel.first(kind, rank=lead_rank)
        setattr(result, attr, m.received_s if m else None)


def _open_hint(r: WatchResult, end: float) -> str:
    """Where a script the harness does not drive was when its one limit passed, from what it reported:
    a reason that blames start-up for a script that trained and said so would send a team the wrong way."""
    if r.train_end_s is not None:
        return (f" (its rank 0 reported the end of training {end - r.train_end_s:.1f} s before and the job had not "
                "exited: a save that did not finish, or a thread that never ends)")
    if r.train_start_s is not None or r.progress_s is not None:
        return " (it was still training: does it stop at --time_limit_min?)"
    return NO_REPORT_HINT


# Real scripts rarely call the harness's open-division API, so having reported nothing says little: the run
# (harness/launcher/run/open_run.py `explain_silence`) finishes this sentence from what rank 0 printed.
NO_REPORT_HINT = " (it reported neither a first forward nor progress through the harness's API)"


def _expired(r: WatchResult, d: Deadlines, launched: float, now: float, lead: bool = True) -> tuple[str, float] | None:
    """The first deadline that has passed: (reason, when it passed), or None."""
    if d.total_s is not None and now - launched > d.total_s:
        return f"did not finish within {d.total_s:.0f} s", launched + d.total_s
    if d.total_after_setup_s is not None:  # a script the harness does not drive: one limit, from its start
        if r.setup_start_s is None:
            if now - launched > d.startup_timeout_s:
                return f"the ranks did not start within {d.startup_timeout_s:.0f} s of launch", launched + d.startup_timeout_s
            return None
        end = r.setup_start_s + d.total_after_setup_s
        if now > end:
            return (f"killed at the hard limit: {d.total_after_setup_s:.1f} s (start-up allowance + budget + grace) "
                    f"after the ranks started{_open_hint(r, end)}"), end
        return None
    if d.hard_limit_s is None:  # a job without a training window
        return None
    if r.train_start_s is None:
        if now - launched > d.startup_timeout_s:
            return f"training did not start within {d.startup_timeout_s:.0f} s of launch", launched + d.startup_timeout_s
        if d.startup_allowance_s is not None and r.setup_start_s is not None \
                and now - r.setup_start_s > d.startup_allowance_s:
            return (f"start-up took longer than the track's allowance of {d.startup_allowance_s:.0f} s (importing the "
                    "submission, get_model, DDP, optimizers) before the first step", r.setup_start_s + d.startup_allowance_s)
        return None
    hard = r.train_start_s + d.hard_limit_s
    if now > hard and (r.train_end_s is None or r.train_end_s > hard):  # an end reported late is still late
        return f"killed at the hard limit: {d.hard_limit_s:.1f} s (budget + grace) after training started", hard
    if lead and d.checkpoint_allowance_s is not None and r.train_end_s is not None and r.checkpoint_saved_s is None \
            and now > r.train_end_s + d.checkpoint_allowance_s:  # the weights leave the ranks within the allowance
        return (f"rank 0 did not save its checkpoint within {d.checkpoint_allowance_s:.0f} s of the end of training "
                "(the checkpoint allowance: the weights must leave as training left them, not trained on)",
                r.train_end_s + d.checkpoint_allowance_s)
    # Whatever the ranks report, nothing runs past the hard limit plus the save allowance.
    final = hard + d.save_allowance_s
    if r.train_end_s is not None:
        final = min(final, r.train_end_s + d.save_allowance_s)
    if now > final:
        return (f"ranks still running {d.save_allowance_s:.0f} s (the save allowance) after training ended "
                "(checkpoint save hung, or work after the clock?)"), final
    return None


def counted_from(launched_s: float, gate=None) -> float | None:
    """When a job's deadlines start: at its launch, or where its ranks wait for the check of their submission
    (harness/launcher/control/gate.py), at the check's word; None while they wait (the check has its own limit)."""
    if gate is None:
        return launched_s
    return None if gate.shut else max(launched_s, gate.opened_s)


def watch(job: ElasticJob, channel: ChannelServer, deadlines: Deadlines, abort: AbortFlag,
          on_tick: Callable[[WatchResult], None] | None = None, lead_rank: int = 0, gate=None) -> WatchResult:
    """Run the loop until the agent returns; kill the job when a deadline passes or on abort. `gate`
    (harness/launcher/control/gate.py): the ranks wait for the check of their submission; the deadlines run from
    its word."""
    result = WatchResult()
    launched = time.monotonic()
    while job.running():
        channel.wait(POLL_S)
        now = time.monotonic()
        _stamp(result, channel, lead_rank)
        if on_tick:
            on_tick(result)
        if result.kill_status:
            if now - result.kill_at_s > deadlines.abandon_agent_s:
                # The agent thread is stuck (say, in a rendezvous with a node that never came): every
                # process of the job is already gone, so stop waiting for it; it dies with the launcher.
                result.agent_abandoned = True
                break
            continue  # already killed: wait for the agent to notice
        start = counted_from(launched, gate)
        expired = None if start is None else _expired(result, deadlines, start, now, lead=lead_rank == 0)
        if gate is not None and gate.verdict is None and gate.checking and not abort.is_set:
            continue  # the check runs: the ranks run harness code only, and no kill may end the check with them
        if abort.is_set:
            _kill(job, result, "aborted", f"stopped by {abort.signal_name}")
        elif result.infra:  # a node lost (harness/launcher/control/heartbeat.py): not the team's, run again
            _kill(job, result, "aborted", result.infra)
        elif result.ended_by:  # another node ended the run before training (run/training.py's EarlyEnd): its status
            _kill(job, result, *result.ended_by)
        elif not channel.alive:  # the launcher can no longer hear its ranks: nothing they do can be trusted
            _kill(job, result, "crashed", "harness error: the control channel stopped listening")
        elif gate is not None and gate.verdict == "stop":  # the check did not pass: no team code runs in this job
            _kill(job, result, "aborted", gate.why or "the check of the submission did not pass")
        elif channel.violation or result.violation:  # a cap broken (reports, logs, scratch, checkpoint): the
            _kill(job, result, "invalid", channel.violation or result.violation)  # run ends, nothing else is touched
        elif expired:
            # A training job none of whose ranks got through the process group (setup_start comes before any
            # team code): a node that never joined, the infrastructure's, to be run again; not the team's timeout.
            never_started = deadlines.total_s is None and result.setup_start_s is None
            _kill(job, result, "aborted" if never_started else "timeout",
                  expired[0] + (" (no rank got through the process group: a node that never joined?)"
                                if never_started else ""), limit_s=expired[1])
    result.exited_s = time.monotonic()
    _stamp(result, channel, lead_rank)
    if abort.is_set and not result.kill_status:
        result.kill_status, result.kill_reason = "aborted", f"stopped by {abort.signal_name}"
    return result
