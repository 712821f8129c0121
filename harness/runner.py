"""`harness run`: one submission, trained on the track's fixed setup, scored, recorded.

resolve track and submission -> prepare data -> run directory (snapshot, "running" record)
-> preflight (contract, in a throw-away process) -> training (torch elastic, watched)
-> checkpoint taken over by the launcher -> evaluation (fresh processes) -> final record.

Whatever happens after the run directory exists, the run ends with a record: the final
run.json is written in a `finally`, so a crash, a kill or Ctrl-C still leaves its status.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import __version__, procs
from harness.console import NullReporter, fmt_rate
from harness.contract import SubmissionError, TeamInfo, find_submission, read_team, snapshot_submission, team_slug
from harness.data.prepare import PreparedData, data_summary, prepare_data
from harness.evaluate import file_sha256
from harness.jobs import EvalJob, TrainJob
from harness.launch import LaunchSpec
from harness.metrics import mfu, peak_flops_per_device
from harness.phases import PhaseResult, run_evaluation, run_preflight, run_training
from harness.records import RunRecord, new_run_id, runs_root, save_metrics, save_record, utc_now
from harness.track import ResolvedTrack, Track, apply_overrides, load_track
from harness.watch import AbortFlag, abort_on_signals


@dataclass(kw_only=True)
class RunOptions:
    submission: str
    track: str = "local"
    runs_dir: str | None = None
    seed: int = 1
    overrides: dict[str, Any] = field(default_factory=dict)  # budget_s, nproc_per_node, ... (unofficial)
    data_root: str | None = None
    node_rank: int = 0
    rdzv_endpoint: str = ""
    run_id: str | None = None
    eval_nproc: int | None = None
    command: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"--seed must be >= 0, got {self.seed}")
        if self.eval_nproc is not None and self.eval_nproc < 1:
            raise ValueError("--eval-nproc-per-node must be >= 1")


def resolve_nproc(track: Track) -> int:
    import torch

    if track.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"track {track.name!r} runs on CUDA GPUs and none is visible on this machine "
                           "(try --track local)")
    if track.nproc_per_node != "auto":
        return int(track.nproc_per_node)

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n == 0:
        raise RuntimeError(f"track {track.name!r} uses every visible GPU, and none is visible")
    return n


def _threads_per_rank(track: Track, nproc: int) -> int:
    return track.cpu_threads_per_rank or max(1, (os.cpu_count() or 1) // nproc)


def _base_record(resolved: ResolvedTrack, opts: RunOptions, run_id: str, team, nproc: int) -> RunRecord:
    import torch

    track = resolved.track
    return RunRecord(
        run_id=run_id, team=team.name, team_members=team.members, track_name=track.name,
        official=resolved.official, overrides=resolved.overrides, track=track.to_dict(),
        budget_s=track.budget_s, seed=opts.seed, world_size=track.nnodes * nproc, nnodes=track.nnodes,
        nproc_per_node=nproc, torch_version=torch.__version__, python_version=platform.python_version(),
        harness_version=__version__, hostname=socket.gethostname(), command=opts.command,
    )


def _apply_training(record: RunRecord, phase: PhaseResult, nproc: int) -> None:
    results = phase.reports("result")
    r0 = results.get(0, {})
    record.steps, record.tokens = r0.get("steps"), r0.get("tokens")
    record.train_time_s, record.train_loss, record.params = r0.get("train_time_s"), r0.get("train_loss"), r0.get("params")
    record.device_name = r0.get("device_name")
    for key in ("max_step_s", "last_step_start_s", "tokens_per_step"):
        if key in r0:
            record.extra[key] = r0[key]
    if r0.get("config"):
        record.config = r0["config"]
    if results:
        record.peak_mem_gib = max(r.get("peak_mem_gib") or 0.0 for r in results.values())
        record.data_wait_s = max(r.get("data_wait_s") or 0.0 for r in results.values())
    record.launcher_train_time_s = phase.watch.launcher_train_time_s
    if record.tokens and record.train_time_s:
        record.tokens_per_s = record.tokens / record.train_time_s
        record.tokens_per_s_per_device = record.tokens_per_s / max(1, record.world_size or 1)
    track = record.track
    record.peak_flops_per_device = peak_flops_per_device(track.get("peak_flops_per_device", 0.0),
                                                         track.get("device_peak", ""), record.device_name)
    record.mfu = mfu(record.flops_per_token, record.tokens_per_s_per_device, record.peak_flops_per_device)
    if r0.get("scaling_efficiency") is not None:
        record.scaling_efficiency = r0["scaling_efficiency"]
        record.scaling = {k: r0.get(k) for k in ("scaling_probe_steps", "scaling_synced_step_s",
                          "scaling_compute_step_s", "scaling_efficiency_min", "scaling_efficiency_max", "comm_s")}
    if record.steps is None:  # killed or crashed: keep what rank 0 last reported
        progress = [m.body for m in phase.messages if m.kind == "progress" and m.body.get("rank") == 0]
        if progress:
            record.steps, record.tokens = progress[-1].get("step"), progress[-1].get("tokens")
            record.train_loss = progress[-1].get("train_loss")


def _metrics_rows(phase: PhaseResult) -> list[dict[str, Any]]:
    return [m.body for m in phase.messages if m.kind == "progress" and m.body.get("rank") == 0]


def _set_outcome(record: RunRecord, status: str, reason: str = "", rank: int | None = None, tb: str | None = None) -> None:
    record.status, record.reason, record.failing_rank = status, reason, rank
    if tb:
        record.traceback = tb[-8000:]


def _name_team_files(record: RunRecord, snapshot: Path, folder: Path) -> None:
    """Errors point at the team's own files (what they edit), not at the record's copy."""
    record.reason = record.reason.replace(str(snapshot), str(folder))


def prepare_run(opts: RunOptions, reporter) -> tuple[ResolvedTrack, PreparedData, Path, int]:
    """Everything that can fail before a run directory exists (usage and setup errors)."""
    resolved = apply_overrides(load_track(opts.track), **opts.overrides)
    folder = find_submission(opts.submission)
    nproc = resolve_nproc(resolved.track)
    data = prepare_data(resolved.track, opts.data_root, say=reporter.info)
    return resolved, data, folder, nproc


@contextmanager
def _marked_processes(run_id: str):
    """Every process started for the run carries HARNESS_RUN_ID (inherited), so it can be found."""
    marks = {"HARNESS_RUN_ID": run_id, "HARNESS_LAUNCHER_PID": str(os.getpid())}
    before = {k: os.environ.get(k) for k in marks}
    os.environ.update(marks)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_submission(opts: RunOptions, reporter=None) -> tuple[RunRecord, Path]:
    """Run one submission end to end; returns its final record and run directory."""
    reporter = reporter or NullReporter()
    procs.become_subreaper()
    resolved, data, folder, nproc = prepare_run(opts, reporter)
    track = resolved.track
    try:
        team = read_team(folder)
    except SubmissionError:
        team = None
    run_id = opts.run_id or new_run_id()
    run_dir = runs_root(opts.runs_dir) / track.name / team_slug(team.name if team else folder.name) / run_id
    run_dir.mkdir(parents=True, exist_ok=opts.node_rank != 0)
    (run_dir / "logs").mkdir(exist_ok=True)
    record = _base_record(resolved, opts, run_id, team or TeamInfo(name=folder.name), nproc)
    record.data_fingerprint, record.loss_floor = data.fingerprint, data.loss_floor
    record.unigram_entropy = data.unigram_entropy
    record.extra["data"] = data_summary(data)
    metrics: list[dict[str, Any]] = []
    reporter.info(f"run {run_id}: {record.team} on track {track.name} "
                  f"({record.world_size} x {track.device}, budget {track.budget_s:.0f}s"
                  f"{'' if resolved.official else ', unofficial: ' + ', '.join(resolved.overrides)})")
    with abort_on_signals() as abort, _marked_processes(run_id):
        try:
            _execute(opts, track, data, folder, team, nproc, run_dir, record, metrics, abort, reporter)
        except BaseException as exc:  # a harness bug or a signal mid-phase: still a record
            if record.status in ("running", "ok"):
                status = "aborted" if isinstance(exc, KeyboardInterrupt) or abort.is_set else "crashed"
                _set_outcome(record, status, f"harness error: {type(exc).__name__}: {exc}")
            raise
        finally:
            _name_team_files(record, run_dir / "submission", folder)
            record.ended_at = utc_now()
            if record.status == "running":
                _set_outcome(record, "aborted", "the launcher stopped before the run finished")
            save_metrics(run_dir, metrics)
            save_record(run_dir, record)
            shutil.rmtree(run_dir / "staging", ignore_errors=True)
    return record, run_dir


def _execute(opts, track: Track, data: PreparedData, folder: Path, team, nproc: int, run_dir: Path,
             record: RunRecord, metrics: list, abort: AbortFlag, reporter) -> None:
    if team is None:  # submission.toml is broken: an invalid run, recorded
        try:
            read_team(folder)
        except SubmissionError as exc:
            _set_outcome(record, "invalid", str(exc))
            return
    try:
        record.submission_sha256 = snapshot_submission(folder, run_dir / "submission")
    except SubmissionError as exc:
        _set_outcome(record, "invalid", str(exc))
        return
    save_record(run_dir, record)  # status "running": visible at once, never lost

    t_begin = time.monotonic()
    reporter.progress("checking the submission...")
    report = run_preflight(run_dir / "submission", vocab_size=track.data.vocab_size, device=track.device,
                           seed=opts.seed, log_path=run_dir / "logs" / "preflight.log")
    reporter.end_progress()
    record.timings["preflight_s"] = time.monotonic() - t_begin
    if abort.is_set:
        _set_outcome(record, "aborted", f"stopped by {abort.signal_name}")
        return
    if not report["ok"]:
        first = report["problems"][0]
        _set_outcome(record, "invalid", f"{first['file']}: {first['problem']}"
                     + (f" Fix: {first['fix']}" if first.get("fix") else ""), tb=first.get("traceback"))
        return
    record.params, record.config = report.get("params"), report.get("config", {})
    record.flops_per_token = report.get("flops_per_token")
    if report.get("flops_method"):
        record.extra["flops_method"] = report["flops_method"]

    staging = run_dir / "staging"
    staging.mkdir(exist_ok=True)
    threads = _threads_per_rank(track, nproc)
    job = TrainJob(
        run_id=record.run_id, track=track.name, submission_dir=str(run_dir / "submission"), seed=opts.seed,
        budget_s=track.budget_s, clock_start=track.clock_start, backend=track.backend, device=track.device,
        dtype=track.dtype, log_interval_s=track.log_interval_s, collective_timeout_s=track.collective_timeout_s,
        cpu_threads_per_rank=threads, vocab_size=track.data.vocab_size, train_shards=data.train,
        log_dir=str(run_dir / "logs"), staging_dir=str(staging), scaling_probe_steps=track.scaling_probe_steps,
    )
    launch = LaunchSpec(module="harness.worker", args=[], nproc_per_node=nproc, nnodes=track.nnodes,
                        node_rank=opts.node_rank, rdzv_endpoint=opts.rdzv_endpoint, rdzv_id=record.run_id,
                        rendezvous_timeout_s=track.rendezvous_timeout_s,
                        shutdown_timeout_s=track.shutdown_timeout_s, threads_per_rank=threads)
    t_launch = time.monotonic()
    phase = run_training(job, launch, startup_timeout_s=track.startup_timeout_s, hard_limit_s=track.hard_limit_s,
                         log_path=run_dir / "logs" / "launcher.log", abort=abort, reporter=reporter)
    record.timings.update(phase.watch.timings(t_launch))
    if phase.watch.train_start_s is not None:  # wall-clock time of the first step, for start-up benchmarks
        record.timings["train_start_unix"] = time.time() - (time.monotonic() - phase.watch.train_start_s)
    metrics.extend(_metrics_rows(phase))
    _apply_training(record, phase, nproc)
    record.killed_pids = phase.leftover_pids
    o = phase.outcome
    _set_outcome(record, o.status, o.reason, o.failing_rank, o.traceback)
    if o.status == "ok" and phase.leftover_pids:
        record.notes.append(f"ended {len(phase.leftover_pids)} process(es) the submission left running")
    if o.status != "ok":
        return

    staged = staging / "checkpoint.pt"
    if not staged.is_file():
        _set_outcome(record, "crashed", "rank 0 reported success but left no checkpoint")
        return
    checkpoint = run_dir / "checkpoint.pt"
    os.replace(staged, checkpoint)  # from here on only the launcher and evaluation touch it
    record.checkpoint_sha256 = file_sha256(checkpoint)
    save_record(run_dir, record)

    eval_nproc = opts.eval_nproc or nproc
    eval_job = build_eval_job(track, data, run_dir, record.checkpoint_sha256, eval_nproc)
    t_eval = time.monotonic()
    ev = run_evaluation(eval_job, eval_nproc, timeout_s=track.eval.timeout_s,
                        shutdown_timeout_s=track.shutdown_timeout_s, log_path=run_dir / "logs" / "eval-launcher.log",
                        abort=abort, reporter=reporter)
    record.timings["eval_s"] = time.monotonic() - t_eval
    record.timings["total_s"] = time.monotonic() - t_begin
    apply_evaluation(record, ev)


def build_eval_job(track: Track, data: PreparedData, run_dir: Path, checkpoint_sha256: str, nproc: int) -> EvalJob:
    return EvalJob(
        checkpoint=str(run_dir / "checkpoint.pt"), checkpoint_sha256=checkpoint_sha256,
        submission_dir=str(run_dir / "submission"), val_shards=data.val, val_tokens=track.data.val_tokens,
        seq_len=track.eval.seq_len, batch_size=track.eval.batch_size, vocab_size=track.data.vocab_size,
        backend=track.backend, device=track.device, dtype=track.dtype,
        collective_timeout_s=max(track.collective_timeout_s, 60.0),
        cpu_threads_per_rank=max(1, (os.cpu_count() or 1) // nproc),
        causality_check=track.eval.causality_check, log_dir=str(run_dir / "logs"),
    )


def apply_evaluation(record: RunRecord, ev: PhaseResult) -> None:
    o = ev.outcome
    if o.status != "ok":
        prefix = "evaluation: " if o.status != "aborted" else ""
        _set_outcome(record, o.status, prefix + o.reason, o.failing_rank, o.traceback)
        return
    r0 = ev.reports("eval_result").get(0, {})
    record.val_loss = r0.get("val_loss")
    record.eval = {k: r0.get(k) for k in ("val_tokens", "eval_world_size", "eval_time_s", "eval_tokens_per_s")}
    if record.val_loss is not None and record.loss_floor is not None:
        record.loss_gap = record.val_loss - record.loss_floor


def summary_lines(record: RunRecord, run_dir: Path) -> list[str]:
    lines = [f"status     {record.status}" + (f"  ({record.reason})" if record.reason else "")]
    if record.val_loss is not None:
        floor = ""
        if record.loss_floor is not None:
            floor = f"  (floor {record.loss_floor:.4f}, gap {record.val_loss - record.loss_floor:+.4f})"
        lines.append(f"val_loss   {record.val_loss:.4f}{floor}")
    if record.train_time_s is not None:
        lines.append(f"trained    {record.train_time_s:.2f}s of {record.budget_s:.0f}s budget, "
                     f"{record.steps} steps, {record.tokens} tokens, {fmt_rate(record.tokens_per_s)} tok/s")
    if not record.official:
        lines.append(f"unofficial overrides: {', '.join(record.overrides)}")
    lines.append(f"record     {run_dir}")
    if record.status not in ("ok",):
        lines.append(f"logs       {run_dir / 'logs'}")
    return lines


def repeat_summary(records: list[RunRecord]) -> list[str]:
    from harness.stats import summarize

    ok = [r.val_loss for r in records if r.status == "ok" and r.val_loss is not None]
    line = f"{len(records)} runs (seeds {records[0].seed}..{records[-1].seed}): {len(ok)} ok"
    if ok:
        s = summarize(ok)
        line += f", val_loss mean {s.mean:.4f}"
        if s.ci95 is not None:
            line += f" ± {s.ci95:.4f} (95% CI, std {s.std:.4f})"
    return [line]
