"""The launcher's side of each phase of a run: training and evaluation (the check before them: check_process.py).

Each phase starts its processes, watches them, and returns what happened as data
(an Outcome plus the figures the processes reported); the runner turns that into the record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.ranks.confine import logs
from harness.launcher.control.channel import ChannelServer, Message
from harness.launcher.run.console import NullReporter, progress_text
from harness.ranks.jobs import EvalJob, TrainJob
from harness.launcher.control.elastic import ElasticJob, LaunchSpec
from harness.launcher.control.job_limits import caps_reached
from harness.launcher.run.outcome import Outcome, classify, last_error_line
from harness.launcher.control.team_files import read_tail
from harness.submission.printable import printable
from harness.launcher.control.watch import AbortFlag, Deadlines, WatchResult, watch


# --------------------------------------------------------------------------- training and evaluation


@dataclass
class PhaseResult:
    outcome: Outcome
    watch: WatchResult
    messages: list[Message] = field(default_factory=list)
    leftover_pids: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # reports the channel turned away, and why
    malformed: list[str] = field(default_factory=list)  # reports that broke their schema (dropped), and why
    containment: dict = field(default_factory=dict)  # the job's cgroup, or why none (harness/launcher/control/job_cgroup.py)

    def sandbox_report(self, rank: int = 0) -> dict[str, Any]:
        """What a rank said of its sandbox right after entering it, before any team code ran (the first
        such report: later ones could be the team's)."""
        for m in self.messages:
            if m.kind == "sandbox" and m.body.get("rank") == rank:
                return {k: v for k, v in m.body.items() if k not in ("kind", "rank")}
        return {}

    def reports(self, kind: str) -> dict[int, dict[str, Any]]:
        """The last message of a kind from each rank."""
        out: dict[int, dict[str, Any]] = {}
        for m in self.messages:
            if m.kind == kind:
                out[int(m.body.get("rank", -1))] = m.body
        return out


def _run_job(launch: LaunchSpec, channel: ChannelServer, log_path: Path, deadlines: Deadlines, abort: AbortFlag,
             done_kind: str, on_tick: Callable[[WatchResult], None] | None, rank_tail: Callable[[int], str],
             on_exit: Callable[[], None] | None = None, gate=None) -> PhaseResult:
    job = ElasticJob(launch, log_path)
    try:
        if gate is not None:  # once the ranks hold their connections, this process's environment is its own again
            gate.spawned(job.release_environment)
        job.start()
        result = watch(job, channel, deadlines, abort, on_tick, lead_rank=local_ranks(launch)[0], gate=gate)
    finally:
        if gate is not None:  # the teardown ends what appeared since the job began: the check must be over
            gate.ended.set()
            gate.wait_verdict()
        if on_exit is not None:
            on_exit()  # before the job closes: on node 0 that closes the rendezvous store too
        leftover = job.close(wait_s=1.0 if job.running() else 10.0)
    channel.drain()  # the ranks are gone: read what their connections still hold to the end
    messages = channel.snapshot()
    local = local_ranks(launch)
    outcome = classify(
        messages, world_size=launch.nnodes * launch.nproc_per_node, done_kind=done_kind,
        agent_succeeded=job.succeeded, agent_failures=job.failures,
        agent_error=f"{type(job.error).__name__}: {job.error}" if job.error else None,
        kill_status=result.kill_status, kill_reason=result.kill_reason, local_ranks=local,
        kill_at_s=result.kill_at_s, started=result.setup_start_s is not None or done_kind != "result",  # scorers say none
    )
    if result.ended_by:  # another node ended the run before training (training.py's EarlyEnd): before its ranks got
        # through the process group, this node's ran harness code only, so what they said of the kill is not the run's
        outcome = Outcome(*result.ended_by, traceback=result.ended_traceback, cause="kill")
    if outcome.cause == "death" and outcome.failing_rank in local:  # what its logs say, not only that it died
        line = last_error_line(rank_tail(outcome.failing_rank),
                               job.early_output.get(outcome.failing_rank - local[0], ""))
        if line:
            outcome.reason += f"; its log ends: {printable(line, 300)}"
    contained = job.containment()  # with what the job's caps refused, counted as it closed
    capped = caps_reached(contained) or caps_reached(contained, outside=True)  # the caps', else a limit above
    if capped and outcome.status == "crashed":  # what the kernel ended or refused: said first
        outcome.reason = f"{capped}: {outcome.reason}"
    return PhaseResult(outcome, result, messages, sorted(set(leftover) | set(result.killed_pids)), list(channel.refused),
                       list(channel.malformed), contained)


def local_ranks(launch: LaunchSpec) -> list[int]:
    return list(range(launch.node_rank * launch.nproc_per_node, (launch.node_rank + 1) * launch.nproc_per_node))


def run_training(job: TrainJob, launch: LaunchSpec, *, deadlines: Deadlines, log_path: Path, abort: AbortFlag,
                 reporter=None, poll: Callable[[WatchResult], None] | None = None,
                 on_exit: Callable[[], None] | None = None, gate=None,
                 rank_tail: Callable[[int], str] | None = None) -> PhaseResult:
    """Train; `poll` is called on every tick of the watchdog with what it has seen (the record guard's
    refresh, taking the checkpoint when rank 0 says it is saved); `on_exit` once the watch is over, before
    the job is closed. `gate` (harness/launcher/control/gate.py): the ranks start while their submission is
    checked, and wait for its word. `rank_tail`: the end of a rank's log, as this process reads it (job.log_dir is
    the ranks' name for their folder, which may be a file system of the job's own: workarea.py enter_job_folder)."""
    reporter = reporter or NullReporter()
    rank_tail = rank_tail or (lambda rank: read_tail(Path(job.log_dir) / f"rank{rank}.log"))
    channel = ChannelServer(expected_ranks=local_ranks(launch))
    job.channel_path = channel.path
    job.gated = gate is not None
    if gate is not None:
        gate.attach(channel)
    job_file = channel.dir / "train_job.json"
    job.save(job_file)
    launch.args = [str(job_file)]
    last_shown = [0.0]

    def on_tick(w: WatchResult) -> None:
        if poll:
            poll(w)
        if gate is not None and gate.shut:  # the ranks wait for the check, which says what it does meanwhile
            return
        if time.monotonic() - last_shown[0] < 0.25:
            return
        last_shown[0] = time.monotonic()
        if w.train_start_s is None:
            reporter.progress("starting ranks (rendezvous, model build)...", key="starting")
            return
        if w.train_end_s is not None:  # an open-division script has no communication probe: it only saves
            after = "the script saves its checkpoint" if getattr(job, "script", None) else "checkpoint, communication probe"
            reporter.progress(f"training done; finishing ({after})...", key="finishing")
            return
        progress = [m.body for m in channel.all("progress") if m.body.get("rank") == 0]
        p = progress[-1] if progress else {}
        elapsed = time.monotonic() - w.train_start_s
        key = ("train", p.get("step"))  # a new line in a log per progress report, i.e. per log interval
        if job.max_steps:  # a fixed number of steps: count them, and the time they take
            step = f"step {p['step']}/{job.max_steps}" if p else f"first steps of {job.max_steps} running"
            loss = p.get("train_loss")
            shown = "" if loss is None else f" | loss {loss:.4f}" if loss == loss else " | loss not finite"
            reporter.progress(f"{step}{shown} | {elapsed:.1f}s", key=key)
            return
        reporter.progress(progress_text(elapsed, job.budget_s, p.get("step"), p.get("train_loss"), p.get("tokens_per_s"),
                                        job.log_interval_s), key=key)

    try:
        return _run_job(launch, channel, log_path, deadlines, abort, "result", on_tick,
                        rank_tail, on_exit, gate)
    finally:
        reporter.end_progress()
        channel.close()


def run_evaluation(job: EvalJob, nproc: int, *, timeout_s: float, shutdown_timeout_s: float, log_path: Path,
                   abort: AbortFlag, reporter=None, nnodes: int = 1, node_rank: int = 0, rdzv_endpoint: str = "",
                   rdzv_id: str = "", rendezvous_timeout_s: float = 300.0, caps=None) -> PhaseResult:
    """This node's scorer ranks; with nnodes > 1, one evaluation over every node's ranks (harness/launcher/run/evaluation.py)."""
    reporter = reporter or NullReporter()
    launch = LaunchSpec(module="harness.scoring.scorer", args=[], nproc_per_node=nproc, nnodes=nnodes,
                        node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id=rdzv_id,
                        rendezvous_timeout_s=rendezvous_timeout_s, shutdown_timeout_s=shutdown_timeout_s,
                        threads_per_rank=job.cpu_threads_per_rank, caps=caps)
    channel = ChannelServer(expected_ranks=local_ranks(launch))
    job.channel_path = channel.path
    job_file = channel.dir / "eval_job.json"
    job.save(job_file)
    launch.args = [str(job_file)]
    started = time.monotonic()

    def on_tick(_: WatchResult) -> None:
        reporter.progress(f"evaluating on {job.val_tokens} held-out tokens with {nproc * nnodes} rank(s)... "
                          f"{time.monotonic() - started:.0f}s", key="evaluating")

    try:
        return _run_job(launch, channel, log_path, Deadlines(startup_timeout_s=timeout_s, total_s=timeout_s),
                        abort, "eval_result", on_tick, lambda rank: read_tail(Path(job.log_dir) / f"eval-rank{rank}.log"))
    finally:
        reporter.end_progress()
        channel.close()
        logs.settle_logs(job.log_dir)  # every scorer and model process is gone: _run_job ended them
