"""The training phase of a run, on the launcher's side: the job, its guards, what it is held to.

The ranks (the fixed loop, or an open-division script) run in their private folder
(harness/launcher/control/workarea.py), in a namespace of their job's own where the host allows one
(harness/launcher/control/job_namespace.py), watched by the launcher's clock (harness/launcher/control/watch.py),
with the track's finished records guarded (harness/launcher/control/guard.py), rank 0's checkpoint taken the
moment it is saved and what they write capped (harness/launcher/run/takeback.py). The runner
(harness/launcher/run/runner.py) turns what happened into the record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path

from harness.launcher.control.job_cgroup import track_caps
from harness.launcher.control.job_limits import caps_reached
from harness.data.prepare import PreparedData
from harness.launcher.control import process_tree
from harness.launcher.run.assemble import check_window, flag_run, set_outcome
from harness.launcher.control.heartbeat import NodeHeartbeat
from harness.launcher.control.elastic import LaunchSpec
from harness.launcher.control.guard import GuardReport, RecordGuard
from harness.launcher.control.job_namespace import JobNamespace, ShmSweep
from harness.launcher.run.nodes import NodePaths, read_node_reports
from harness.launcher.run.open_run import build_open_job, explain_silence, open_deadlines
from harness.launcher.run.phases import PhaseResult, run_training
from harness.launcher.run.takeback import CheckpointTaker, ScratchCaps, StagedWatch
from harness.launcher.control.watch import AbortFlag, Deadlines
from harness.launcher.control.workarea import WorkArea
from harness.ranks.confine import sandbox
from harness.ranks.jobs import TrainJob
from harness.results.records import (FINAL_STATUSES, RunRecord, leaderboard_root, read_record_json, runs_root,
                                      stamp_epoch_s)
from harness.submission.open_division import OpenSpec
from harness.submission.printable import printable
from harness.tracks.spec import Track


class RunRefused(RuntimeError):
    """Training does not start, before any rank exists: the run's `status`, and why (the message)."""

    status = "aborted"


class JobNamespaceMissing(RunRefused):
    """The track requires the sandbox, and the host refuses the training ranks' namespace (or its private tmpfs)."""

    def __init__(self, why: str):
        super().__init__(f"the track requires the sandbox, and the training ranks cannot have a namespace of "
                         f"their job's own here: {why}; no team code ran")


class ScratchTooSmall(RunRefused):
    """The submission's own copy takes more than the ranks' folder may hold: the team's, never a re-run."""

    status = "invalid"


def protected_paths(runs_dir: str | None, data: PreparedData) -> list[str]:
    """What no process running team code may be able to read: the validation shards, every record,
    the derived views."""
    return [str(runs_root(runs_dir).resolve()), str(leaderboard_root(runs=runs_root(runs_dir)).resolve()),
            *(s.path for s in data.val)]


def threads_per_rank(track: Track, nproc: int) -> int:
    """The track's figure; else OMP_NUM_THREADS when set (several "nodes" on one machine); else cores / ranks."""
    if track.cpu_threads_per_rank:
        return track.cpu_threads_per_rank
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return max(1, int(os.environ["OMP_NUM_THREADS"]))
    return max(1, process_tree.usable_cpus() // nproc)


class EarlyEnd:
    """Several nodes: one that ended its run before training is waited for by no other until the rendezvous or
    the start-up times out (600 s at Paris). Node 0 reads the other nodes' accounts, node R node 0's record, at
    most once a second (and, with three nodes or more, node R the others' accounts too); all are written by
    launchers alone, in the runs tree. Asked only while no rank of this
    node got through the process group (which needs every node's ranks). Node 0 acts on an account that says it
    ended before its training job did, with that node's status and reason: a node whose check refused the
    submission (the check can tell which node it runs on) ends the run `invalid` on every node, never as a
    rendezvous that timed out (`aborted`, a re-run the team would have chosen); a node whose scratch root was
    too full ends it `aborted`, the infrastructure's. An account of a training job's end is merge_node_reports'
    to read after the job, and one from an earlier attempt under the same run id (its launcher started long
    before this one: `stale_before_s`) is not this run's."""

    def __init__(self, node: NodePaths, nnodes: int, every_s: float = 1.0, stale_before_s: float | None = None):
        self.node, self.nnodes, self.every_s, self._last = node, nnodes, every_s, 0.0
        self.traceback: str | None = None  # of the account node 0 ended the run on: the record carries it
        self.stale_before_s = stale_before_s  # epoch seconds: an account of a launcher started earlier is not ours

    def why(self) -> tuple[str, str] | None:
        """(the status this node's job ends with, why) once another node has ended the run; None before."""
        now = time.monotonic()
        if now - self._last < self.every_s:
            return None
        self._last = now
        # The team's own end first (a refusal, cause "own"), as merge_node_reports takes it: seen in one poll beside
        # a node that aborted, it is the run's status, whichever node's rank is lower
        accounts = sorted(read_node_reports(self.node.run_dir).items(), key=lambda a: (a[1].get("cause") != "own", a[0]))
        for r, account in accounts:
            status, started_s = account.get("status"), stamp_epoch_s(account.get("started_at"))
            if r == self.node.node_rank or account.get("before_training") is not True \
                    or status not in FINAL_STATUSES or status == "ok":
                continue
            if self.stale_before_s is not None and (started_s is None or started_s < self.stale_before_s):
                continue
            if self.node.lead:
                tb = account.get("traceback")  # its launcher's text (a team's file:line, as node R named it)
                self.traceback = tb if isinstance(tb, str) else None
                return status, f"node {r} ended its run before training: {status}: {account.get('reason')}"
            # A third node: the run's status is node 0's to give (from the same account); this node's part ends
            # now rather than once node 0 has waited for its account
            return "aborted", f"node {r} ended the run before training: {status}: {account.get('reason')}"
        if self.node.lead:
            return None
        try:
            record = read_record_json(self.node.run_dir / "run.json")
        except (OSError, ValueError):
            return None
        if record.get("status") in FINAL_STATUSES:  # node 0's verdict, whatever it is: nothing to wait for
            # this node's part ends `aborted`: the record that counts is node 0's, which says why
            return "aborted", f"node 0 ended the run before training: {record.get('status')}: {record.get('reason')}"
        return None


def stale_before_s(record: RunRecord, track: Track) -> float | None:
    """Accounts of launchers started before this one by more than the rendezvous could have waited for it (and a
    minute of clocks that differ) are an earlier attempt's under the same run id."""
    started_s = stamp_epoch_s(record.started_at)
    return None if started_s is None else started_s - track.rendezvous_timeout_s - 60


def train(opts, track: Track, data: PreparedData, nproc: int, node: NodePaths, record: RunRecord,
          area: WorkArea, abort: AbortFlag, reporter, spec: OpenSpec | None = None,
          taker: CheckpointTaker | StagedWatch | None = None, heartbeat: NodeHeartbeat | None = None,
          compiles: bool = False, gate=None) -> PhaseResult:
    """The ranks (the fixed loop, or an open-division script), in their private folder, with the
    track's finished records guarded meanwhile, and rank 0's checkpoint taken the moment it is saved."""
    threads = threads_per_rank(track, nproc)
    protected = protected_paths(opts.runs_dir, data)
    policy = area.sandbox_policy([s.path for s in data.train], gpu=track.device == "cuda", protected=protected)
    exposed = sandbox.check_protected(policy, protected)
    if exposed:
        record.warnings.append(f"the training sandbox allows folders that hold protected paths: {', '.join(exposed)}")
    if spec is not None:
        job = build_open_job(spec, track, data, area, record, policy.to_dict() if track.sandbox != "off" else {})
        module, deadlines = "harness.ranks.open_rank", open_deadlines(track)
    else:
        job = build_train_job(opts, track, data, record, area, threads, policy, compiles)
        module, deadlines = "harness.ranks.training.train", training_deadlines(track)
    launch = LaunchSpec(module=module, args=[], nproc_per_node=nproc, nnodes=track.nnodes,
                        node_rank=opts.node_rank, rdzv_endpoint=opts.rdzv_endpoint, rdzv_id=record.run_id,
                        rendezvous_timeout_s=track.rendezvous_timeout_s,
                        shutdown_timeout_s=track.shutdown_timeout_s, threads_per_rank=threads,
                        env=area.rank_environment(), caps=track_caps(track))
    t_launch = time.monotonic()
    leaderboard_dir = leaderboard_root(runs=runs_root(opts.runs_dir))
    # Node 0 guards the (shared) records; the other nodes' ranks are covered by the same guard.
    guard = RecordGuard(runs_root(opts.runs_dir), track.name, node.run_dir, leaderboard_dir) if node.lead else None
    ranks = range(opts.node_rank * nproc, (opts.node_rank + 1) * nproc)
    caps = ScratchCaps(area, track)
    launcher_log = node.log("launcher.log").name

    early = EarlyEnd(node, track.nnodes, stale_before_s=stale_before_s(record, track)) if track.nnodes > 1 else None

    def poll(watched) -> None:
        if early is not None and not watched.infra and not watched.ended_by and watched.setup_start_s is None:
            watched.ended_by = early.why()  # a node that ended before training: nobody waits for the rendezvous
            watched.ended_traceback = early.traceback if watched.ended_by else None
        if guard:
            guard.refresh()
        if taker:
            taker.poll(watched)
        watched.violation = watched.violation or caps.violation
        if heartbeat is not None and not watched.infra and watched.setup_start_s is not None:
            watched.infra = heartbeat.lost_why()
            if watched.infra:
                record.extra["lost_nodes"] = heartbeat.lost_nodes()

    # A /dev/shm and System V IPC of the job's own (harness/launcher/control/job_namespace.py); without one, what the
    # job leaves in /dev/shm and System V IPC is removed after it.
    namespace, sweep = None, None
    # What the launcher put there (the submission's copy), measured before any rank exists: past the cap it would
    # break the folder's size with the copy alone (the job's tmpfs could not hold it; on disk the caps' walk would
    # end the job at its first look, racing the ranks' start).
    held = area.page_bytes()
    if held > caps.scratch_cap:
        raise ScratchTooSmall(f"the submission's files take {held / 2**20:.1f} MiB in the ranks' folder, more than the "
                              f"track's scratch_cap_gib ({track.scratch_cap_gib:g} GiB): keep code and small config "
                              "files in the submission")
    try:
        namespace = job_namespace(track, area, caps.scratch_cap, record)
        record.extra["job_namespace"] = namespace.report() if namespace is not None else {"active": False, "why": "off"}
        if namespace is not None and namespace.active:
            job.job_namespace = namespace.socket_path
        else:
            sweep = ShmSweep()
            if track.sandbox == "required":  # the machine, not the team: the run cannot be held to the rules here
                raise JobNamespaceMissing(namespace.why if namespace is not None else "")
            if namespace is not None:  # said now, and again in the summary's warnings (assemble.weakened_sandbox)
                reporter.info(f"WARNING: the sandbox is weakened to Landlock alone: {namespace.why}")
        # Live logs in the record: links to where this process reaches the ranks' folder (a tmpfs of the job's: its
        # holder's root), and to the launcher's own log, kept in a folder of its own that no rank writes.
        area.link_logs(node.run_dir / "logs", [f"rank{r}.log" for r in ranks], [launcher_log])
        # The ranks' environment is the agent's patch (elastic.py: only what team code may see, no HARNESS_*
        # variable); this process's own is never changed here (the check may read it meanwhile: check_phase.py).
        with guard or contextlib.nullcontext(), caps:
            phase = run_training(job, launch, deadlines=deadlines,
                                 log_path=area.own / launcher_log, abort=abort, reporter=reporter,
                                 rank_tail=lambda rank: area.log_tail(f"rank{rank}.log"),
                                 poll=poll, on_exit=heartbeat.mark_done if heartbeat is not None else None,
                                 gate=gate)
            if namespace is not None:  # the job's PID namespace ended now: nothing of the job lives past this line
                namespace.end_job()
                if namespace.unended:  # evaluation may start beside them (a GPU's memory still being freed): said
                    record.notes.append(namespace.unended)
                if namespace.lost and phase.outcome.status == "ok":  # it ended after the ranks had: said, nothing lost
                    record.notes.append(f"the job's namespace holder said: {namespace.lost}")
                elif namespace.lost and phase.outcome.cause in ("death", "collective"):  # the ranks died of it, or of
                    # a peer's death: not the team's (nodes.py adopts it on node 0); the clock's and the rules' verdicts stay
                    phase.outcome.status, phase.outcome.reason = "aborted", f"harness error: {namespace.lost}"
                    phase.outcome.cause, phase.outcome.failing_rank, phase.outcome.traceback = "infra", None, None
            report = guard.check_and_restore() if guard else GuardReport()
        if gate is not None and gate.opened_s is not None:  # the check ran inside this wait (check_phase.py)
            record.timings["launch_to_go_s"] = gate.opened_s - t_launch
            if phase.watch.train_start_s is not None:  # what launch_to_train_s was before the check ran beside
                record.timings["go_to_train_s"] = phase.watch.train_start_s - gate.opened_s
        if phase.outcome.status == "crashed" and area.live_dir != area.dir:
            phase.outcome.reason = scratch_full_reason(track, area, phase.outcome.reason)
        if caps.violation and phase.outcome.status == "ok":  # broken after the last look during the job
            phase.outcome.status, phase.outcome.reason, phase.outcome.cause = "invalid", caps.violation, "kill"
        if heartbeat is not None:  # in this node's account: whether its own beat writes stalled (nodes.py)
            record.extra["beat"] = heartbeat.summary()
        if guard is not None and guard.lock.unavailable:  # trained all the same: a lock the file system lacks
            record.warnings.append(f"the records' lock was not taken ({guard.lock.unavailable}): an organiser's "
                                   "`harness flag` during this run could not be told from a change by the run")
    finally:
        if namespace is not None:
            namespace.close()
        swept = sweep.sweep() if sweep is not None else []
    if swept:
        record.notes.append(f"removed what the job left in /dev/shm and System V IPC: {', '.join(swept[:10])}")
    return _after_training(opts, track, node, record, area, phase, report, t_launch, leaderboard_dir)


def job_namespace(track: Track, area: WorkArea, scratch_bytes: int, record: RunRecord) -> JobNamespace | None:
    """The job's namespaces (job_namespace.py), its private folder a tmpfs of scratch_bytes; where that tmpfs cannot
    be had (a holder refused the mount, or its root cannot be reached), the namespaces without it, the folder on
    the launcher's disk, and the record says so (a track whose sandbox is "required" refuses the run, the
    machine's: JobNamespaceMissing). None where the track's sandbox is off."""
    if track.sandbox == "off":
        return None
    namespace = JobNamespace(shm_bytes=scratch_bytes, writable=str(area.dir), scratch_bytes=scratch_bytes)
    if namespace.scratch_refused:
        refused = namespace.scratch_refused
        if track.sandbox == "required":  # the machine's: the track requires every defence of the sandbox
            raise JobNamespaceMissing(f"the ranks' private folder cannot be a file system of the job's own ({refused})")
        namespace = JobNamespace(shm_bytes=scratch_bytes, writable=str(area.dir))
        if namespace.active:
            record.warnings.append(f"the ranks' private folder is on the launcher's disk, not a file system of the "
                                   f"job's own ({refused}): files without a name there are not under the track's "
                                   "scratch_cap_gib (docs/rules.md, \"Logs and disk\")")
    if namespace.folder_fd is not None:
        area.enter_job_folder(namespace.folder_fd, namespace.live_dir)
        namespace.folder_fd = None  # the area's now: closed at its cleanup
    return namespace


def scratch_full_reason(track: Track, area: WorkArea, reason: str) -> str:
    """A crash where the ranks' folder is a file system of the job's own: a write that failed for want of room
    (ENOSPC in the team's error, or the folder full when the job ended) is said first, with the cap that held it,
    so that a team reads why its write failed (the folder and /dev/shm are each of the track's scratch_cap_gib)."""
    free = area.free_bytes()
    full = free is not None and free < 1 << 20
    if not full and "No space left on device" not in reason:
        return reason
    where = "the ranks' private folder is full" if full else "a write failed for want of room"
    return (f"{where} (the private folder and /dev/shm are each a file system of the track's scratch_cap_gib, "
            f"{track.scratch_cap_gib:g} GiB): {reason}")


def build_train_job(opts, track: Track, data: PreparedData, record: RunRecord, area: WorkArea, threads: int,
                    policy, compiles: bool = False) -> TrainJob:
    return TrainJob(
        run_id=record.run_id, track=track.name, submission_dir=str(area.submission), seed=opts.seed,
        budget_s=track.budget_s, clock_start=track.clock_start, backend=track.backend, device=track.device,
        dtype=record.precision, log_interval_s=track.log_interval_s, collective_timeout_s=track.collective_timeout_s,
        cpu_threads_per_rank=threads, vocab_size=track.data.vocab_size, train_shards=data.train,
        log_dir=str(area.logs), staging_dir=str(area.staging), work_dir=str(area.dir),
        comm_probe_steps=track.comm_probe_steps, max_steps=track.max_steps,
        data_fingerprint=data.fingerprint, submission_sha256=record.submission_sha256 or "",
        sandbox=track.sandbox, sandbox_policy=policy.to_dict() if track.sandbox != "off" else {},
        ddp=dataclasses.asdict(track.ddp), compiles=compiles, compile_mode=track.compile,
    )


def _after_training(opts, track: Track, node: NodePaths, record: RunRecord, area: WorkArea, phase: PhaseResult,
                    report: GuardReport, t_launch: float, leaderboard_dir: Path) -> PhaseResult:
    others = area.collect_logs(node.run_dir / "logs", budget_bytes=int(track.log_cap_mib * 2**20))
    if others:  # the record takes the logs the harness names, within one budget: never a team's tree of files
        record.notes.append(f"not taken into the record: what else the ranks left in their logs folder "
                            f"({', '.join(printable(n, 80) for n in others[:5])}{', ...' if len(others) > 5 else ''})")
    record.timings.update(phase.watch.timings(t_launch))
    if phase.watch.train_start_s is not None:  # wall-clock time of the first step, for start-up benchmarks
        record.timings["train_start_unix"] = time.time() - (time.monotonic() - phase.watch.train_start_s)
    if report.appeared:
        record.notes.append(f"records that appeared while this run trained: {', '.join(report.appeared)}")
    if report.restored:
        flag_run(record, f"records of other runs were changed while this run trained "
                         f"({', '.join(report.restored)}); restored")
    if report.unrestored:  # the organiser puts these back from a copy: the guard says which
        flag_run(record, f"records of other runs were changed while this run trained and could not be restored "
                         f"({'; '.join(report.unrestored)})")
    if report.leaderboard_changed:  # derived: make it the records' again, whoever wrote it
        from harness.results.records import plots_root
        from harness.results.views import rebuild

        rebuild(runs_root(opts.runs_dir), track.name, leaderboard_dir, plots_root(runs=runs_root(opts.runs_dir)), charts=False)
    return phase


def training_deadlines(track: Track) -> Deadlines:
    return Deadlines(startup_timeout_s=track.startup_timeout_s, startup_allowance_s=track.startup_allowance_s,
                     hard_limit_s=track.hard_limit_s, save_allowance_s=track.save_allowance_s,
                     checkpoint_allowance_s=track.checkpoint_allowance_s)


def settle_outcome(record: RunRecord, phase: PhaseResult, track: Track, *, open_division: bool, compiles: bool,
                   metrics: list, first_rank_log: Path, first_rank: int) -> None:
    """What the training phase's outcome makes of the record: its status and reason (the team's, or the machine's
    where a rank could not enter what the launcher made for it), the window the launcher measured, held to the
    budget, and the notes on what the job left behind and the caps it reached. `first_rank_log`: this node's first
    rank's log, which explains an open-division script's silence."""
    record.killed_pids = phase.leftover_pids
    record.extra.setdefault("containment", {})["training"] = phase.containment
    o = phase.outcome
    reason = explain_silence(o.reason, first_rank_log, first_rank) if open_division else o.reason
    set_outcome(record, o.status, reason, o.failing_rank, o.traceback)
    # Blamed on the compile step only where a step began: a kill in start-up came before any compiling.
    if o.status == "timeout" and compiles and phase.watch.train_start_s is not None \
            and not any(m.get("step") for m in metrics):
        record.reason += (" (the model is torch.compile'd and no step after the first was reported: the first "
                          "step compiles, on the clock; on this track compiling may cost more than it saves)")
    remote = phase.watch.ended_by is not None  # another node's end, with its status: nothing of this node's
    if o.status == "crashed" and not remote and track.sandbox == "required" \
            and record.sandbox.get("training", {}).get("active") is False:
        record.status = "aborted"  # this machine lacks the sandbox the track requires (said before team code ran)
    joined = (record.sandbox.get("training", {}).get("namespaces") or {}).get("active")
    if o.status == "crashed" and not remote and record.extra.get("job_namespace", {}).get("active") and joined is False:
        record.status = "aborted"  # the job's namespace was there and a rank could not enter it: not the team
    held = (record.sandbox.get("training", {}).get("cgroup") or {}).get("active")
    if o.status == "crashed" and not remote and phase.containment.get("active") and held is False:
        record.status = "aborted"  # the job's cgroup was there and rank 0 could not join it (said before team code)
    record.extra["cause"] = o.cause
    late = check_window(record, track) if record.status == "ok" else ""
    if late:  # the launcher's own measurement of the window, enforced
        set_outcome(record, "timeout", late)
    if o.status == "ok" and phase.leftover_pids:
        record.notes.append(f"ended {len(phase.leftover_pids)} process(es) the submission left running")
    capped = caps_reached(phase.containment) or caps_reached(phase.containment, outside=True)
    if o.status == "ok" and capped:  # a failure says it in its reason (phases._run_job)
        record.notes.append(f"in training, {capped}")
