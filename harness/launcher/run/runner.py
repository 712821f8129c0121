"""`harness run`: one submission, trained on the track's fixed setup, scored, recorded.

resolve track and submission -> prepare data -> run directory (snapshot, "running" record)
-> preflight (contract, in a throw-away process) -> training (torch elastic, watched)
-> checkpoint taken over by the launcher -> evaluation (fresh processes) -> final record.

Whatever happens after the run directory exists, the run ends with a record: the final
run.json is written in a `finally`, so a crash, a kill or Ctrl-C still leaves its status.
"""

from __future__ import annotations

import dataclasses

import os
import platform
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import __version__
from harness.data.prepare import PreparedData, data_summary, prepare_data
from harness.launcher.control import process_tree
from harness.launcher.control.job_cgroup import track_caps
from harness.launcher.run.assemble import (
    apply_training,
    flag_run,
    metrics_rows,
    name_team_files,
    sandbox_warnings,
    set_outcome,
)
from harness.launcher.run.console import NullReporter
from harness.launcher.control.alive import launcher_where
from harness.results.locks import RunLock
from harness.launcher.run.identity import resolve_identity
from harness.launcher.control.heartbeat import NodeHeartbeat, lost_after_s, silent_after_s
from harness.launcher.run.nodes import NodePaths, merge_node_reports
from harness.submission.screen import mentions_compile
from harness.launcher.run.open_run import apply_open_training, check_open, finish_open_training
from harness.launcher.run.evaluation import EvalPlan, evaluate_run, join_run
from harness.launcher.run.check_phase import JobBeside, accept_check, check_then_say
from harness.launcher.run.check_process import CheckProcess
from harness.tracks.precision import resolve_precision
from harness.launcher.run.takeback import CheckpointTaker, StagedWatch, io_failure_outcome
from harness.launcher.run.training import RunRefused, protected_paths, settle_outcome, train
from harness.launcher.control.watch import AbortFlag, abort_on_signals
from harness.launcher.control.team_files import trim_logs
from harness.launcher.control.workarea import WorkArea, patched_environ
from harness.ranks.checkpoint import file_sha256
from harness.ranks.confine.scratch import refuse_unusable, short_of_space
from harness.results.records import (FINAL_STATUSES, RunRecord, leaderboard_root, new_run_id, runs_root, save_metrics,
                                    save_record, utc_now)
from harness.results.row_index import drop_index
from harness.submission.contract import (
    SubmissionError,
    TeamInfo,
    find_submission,
    read_team,
    snapshot_submission,
    submission_sha256,
)
from harness.submission.files import weight_like_files
from harness.submission.open_division import OPEN, division_of, read_open_spec
from harness.tracks.spec import ResolvedTrack, Track, apply_overrides, load_track


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
    if track.device == "cpu" and track.nproc_per_node != "auto":
        return int(track.nproc_per_node)  # without importing torch: the check process starts first (see _execute)
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


def _base_record(resolved: ResolvedTrack, opts: RunOptions, run_id: str, team, nproc: int) -> RunRecord:
    """Everything known before any process starts; the software versions come with `_provenance`."""
    from harness.launcher.run.provenance import machine

    track = resolved.track
    return RunRecord(
        run_id=run_id, team=team.name, team_members=team.members, track_name=track.name,
        official=resolved.official, overrides=resolved.overrides, track=track.to_dict(),
        budget_s=track.budget_s, seed=opts.seed, world_size=track.nnodes * nproc, nnodes=track.nnodes,
        nproc_per_node=nproc, python_version=platform.python_version(), harness_version=__version__,
        machine=machine(), hostname=socket.gethostname(), launcher_pid=os.getpid(), command=opts.command,
        extra={"launcher_where": launcher_where()},
    )


def locked_memory_limit() -> int | None:
    """This process's locked-memory limit in bytes (RLIMIT_MEMLOCK, soft), None when unlimited."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def memlock_refusal(track: Track, limit: int | None) -> str:
    """"" unless the run needs NCCL's InfiniBand (a GPU track on several nodes) and this node limits locked memory:
    NCCL's buffer registration (ibv_reg_mr) would then fail mid-run with "Cannot allocate memory", which the team
    did not cause. Said before any team code runs, so no text a team writes can make a run the machine's."""
    if track.device != "cuda" or track.nnodes < 2 or limit is None:
        return ""
    return (f"this node limits locked memory to {limit / 2**20:.0f} MiB, and NCCL's InfiniBand transport registers "
            "its buffers there: `ulimit -l unlimited` for the harness's user (harness doctor's memlock line)")


def _provenance(record: RunRecord) -> None:
    """torch's version and the rest (provenance.versions): importing torch costs seconds on a small CPU,
    so the launcher does it while the check process runs."""
    if record.versions:
        return
    from harness.launcher.run.provenance import versions

    record.versions = versions()
    record.torch_version = record.versions["torch"]


def prepare_run(opts: RunOptions, reporter) -> tuple[ResolvedTrack, PreparedData, Path, int]:
    """Everything that can fail before a run directory exists (usage and setup errors)."""
    refuse_unusable()  # a noexec scratch root: nothing Triton or Inductor builds in a private folder would load
    resolved = apply_overrides(load_track(opts.track), **opts.overrides)
    folder = find_submission(opts.submission)
    nproc = resolve_nproc(resolved.track)
    data = prepare_data(resolved.track, opts.data_root, say=reporter.info)
    return resolved, data, folder, nproc


def _marked_processes(run_id: str):
    """Every process started for the run carries HARNESS_RUN_ID (inherited), so it can be found."""
    return patched_environ({"HARNESS_RUN_ID": run_id, "HARNESS_LAUNCHER_PID": str(os.getpid())})


def run_submission(opts: RunOptions, reporter=None) -> tuple[RunRecord, Path]:
    """Run one submission end to end; returns its final record and run directory."""
    reporter = reporter or NullReporter()
    process_tree.become_subreaper()
    process_tree.make_undumpable()  # its environment and memory are not the ranks' to read
    resolved, data, folder, nproc = prepare_run(opts, reporter)
    track = resolved.track
    try:
        team = read_team(folder)
    except SubmissionError:
        team = None
    if track.nnodes > 1 and not opts.run_id:
        raise ValueError("the nodes of a run must agree on its id: pass --run-id (the SLURM job id works)")
    run_id = opts.run_id or new_run_id()
    # The organiser's roster, or the folder that first used the name, decides who the run is (identity.py).
    claimed = team.name if team else folder.name
    identity = resolve_identity(runs_root(opts.runs_dir), claimed, folder, run_id)
    run_dir = runs_root(opts.runs_dir) / track.name / identity.records_folder / run_id
    if opts.node_rank == 0 and (run_dir / "run.json").exists():
        raise FileExistsError(f"{run_dir} already holds a run: choose another --run-id")
    run_dir.mkdir(parents=True, exist_ok=True)  # on several nodes, any of them may get here first
    # Node 0's launcher holds the run's lock to its final record: a `running` record whose lock is free
    # was left by a launcher that died (the queue re-runs it, `harness finalize` closes it).
    run_lock = None
    if opts.node_rank == 0:
        try:
            run_lock = RunLock(run_dir)
        except OSError as exc:  # a file system without locks (ENOLCK), or another launcher on this run id
            if isinstance(exc, BlockingIOError):
                raise FileExistsError(f"{run_dir} is another launcher's run: choose another --run-id") from None
            reporter.info(f"warning: the run's lock could not be taken ({exc}): a queue tells whether this launcher "
                          "is alive by its host and pid instead")
    node = NodePaths(run_dir, opts.node_rank)
    (run_dir / "logs").mkdir(exist_ok=True)
    record = _base_record(resolved, opts, run_id, dataclasses.replace(team or TeamInfo(name=folder.name),
                                                                     name=identity.name), nproc)
    record.submission_dir = str(folder.resolve())  # its name is who the run is (identity.py): never "."
    record.extra["identity"] = {"claimed": claimed, "folder": folder.resolve().name, "refused": identity.refused}
    if identity.note:
        record.notes.append(identity.note)
    if identity.refused:
        reporter.info(f"refused: {identity.refused}")
    record.data_fingerprint, record.loss_floor = data.fingerprint, data.loss_floor
    if data.loss_floor_token_std is not None:
        record.extra["loss_floor_token_std"] = data.loss_floor_token_std
    if track.data.synthetic is not None and track.data.synthetic.seed is not None:
        record.warnings.append("the track file names its synthetic seed: the validation tokens are a public function "
                               "of it, and a model could rebuild them (leave `seed` out: it is then drawn, secretly, "
                               "when the cache is built)")
    record.unigram_entropy = data.unigram_entropy
    record.precision, record.extra["precision_reason"] = resolve_precision(track.dtype, track.device)
    record.extra["data"] = data_summary(data)
    metrics: list[dict[str, Any]] = []
    copies = [node.snapshot]  # where the team's files ran from; errors name them relative to the submission
    reporter.info(f"run {run_id}: {record.team} on track {track.name} "
                  f"({record.world_size} x {track.device}, {record.precision}, budget {track.budget_s:.0f}s"
                  f"{'' if resolved.official else ', unofficial: ' + ', '.join(resolved.overrides)})")
    # Several nodes: each launcher beats in the run's nodes/ folder until its run is over (heartbeat.py).
    heartbeat = NodeHeartbeat(run_dir, opts.node_rank, track.nnodes, lost_after_s(track.collective_timeout_s)) \
        if track.nnodes > 1 else None
    with abort_on_signals() as abort, _marked_processes(run_id):
        try:
            if heartbeat is not None:
                heartbeat.start()
            _execute(opts, track, data, folder, team, nproc, node, record, metrics, abort, reporter, copies, heartbeat)
        except BaseException as exc:  # a harness bug or a signal mid-phase: still a record
            if record.status in ("running", "evaluating", "ok"):
                # `crashed`, not `aborted`: the launcher may have failed on something the team made (a log tree
                # too deep to copy), and an aborted run is run again by a queue. The reason says it was the
                # harness's; an organiser who finds it so re-runs it by hand.
                status = "aborted" if isinstance(exc, KeyboardInterrupt) or abort.is_set else "crashed"
                set_outcome(record, status, f"harness error: {type(exc).__name__}: {exc}")
            raise
        finally:
            if heartbeat is not None:
                heartbeat.stop()
            _provenance(record)  # where the run ended before its check process started
            name_team_files(record, [*copies, folder])
            sandbox_warnings(record)
            record.ended_at = utc_now()
            if record.status not in FINAL_STATUSES:
                set_outcome(record, "aborted", "the launcher stopped before the run finished")
            if node.lead:  # every log of the record in one budget: the ranks', the check's, evaluation's processes'
                cut = trim_logs(run_dir / "logs", int(track.log_cap_mib * 2**20) * track.nnodes)
                if cut:
                    record.notes.append(f"logs cut to the run's log budget ({track.log_cap_mib:g} MiB a node): "
                                        f"{', '.join(cut[:5])}{', ...' if len(cut) > 5 else ''}")
                save_metrics(run_dir, metrics)
                save_record(run_dir, record)
                if track.sandbox == "off" or not all(isinstance(box, dict) and box.get("active") is not False
                                                     for box in record.sandbox.values()):
                    # team code that ran without the sandbox could have written the board's row index
                    drop_index(leaderboard_root(runs=runs_root(opts.runs_dir)), track.name)
            else:  # the record is node 0's; this node leaves its own account and its logs
                node.save_report(record)
            if run_lock is not None:
                run_lock.release()
    return record, run_dir


def _execute(opts, track: Track, data: PreparedData, folder: Path, team, nproc: int, node: NodePaths,
             record: RunRecord, metrics: list, abort: AbortFlag, reporter, copies: list[Path],
             heartbeat: NodeHeartbeat | None = None) -> None:
    run_dir = node.run_dir
    refused = record.extra.get("identity", {}).get("refused")
    if refused:  # a name another folder owns, or a folder not on the roster: recorded under its own folder's name
        set_outcome(record, "invalid", refused)
        try:  # what a queue settles its entry by (queue.records_of), as for any other run
            record.submission_sha256 = submission_sha256(folder)
        except Exception:  # noqa: BLE001  (a folder that cannot be hashed is refused below in any run; here, no hash)
            pass
        return
    if team is None:  # submission.toml is broken: an invalid run, recorded
        try:
            read_team(folder)
        except SubmissionError as exc:
            set_outcome(record, "invalid", str(exc))
            return
    try:
        record.submission_sha256 = snapshot_submission(folder, node.snapshot)
    except SubmissionError as exc:
        set_outcome(record, "invalid", str(exc))
        return
    weights = weight_like_files(node.snapshot)
    if weights:  # weights trained off the clock, shipped: a person decides (the first step's loss is checked too)
        flag_run(record, f"the submission folder holds weight or data files: {', '.join(weights[:5])}; "
                         "a model must be trained on the clock, from get_model's initialisation")
    if node.lead:
        save_record(run_dir, record)  # status "running": visible at once, never lost
    short = short_of_space(int(scratch_need_gib(track) * 2**30), why=SCRATCH_NEED_WHY) \
        or memlock_refusal(track, locked_memory_limit())
    if short:  # before any team code: a root too full for an honest run is not the team's to pay for
        set_outcome(record, "aborted", short)
        return

    try:
        record.division = division_of(node.snapshot)
        spec = read_open_spec(node.snapshot) if record.division == OPEN else None
    except SubmissionError as exc:
        set_outcome(record, "invalid", str(exc))
        return
    t_begin = time.monotonic()
    area = WorkArea(node.snapshot)
    copies.append(area.submission)
    checkpoint = run_dir / "checkpoint.pt"
    # The fixed loop's checkpoint is taken the moment rank 0 says it is saved; a script's is watched while it runs
    cap_bytes = int(track.checkpoint_cap_gib * 2**30)
    taker = (CheckpointTaker(area, checkpoint, cap_bytes) if spec is None else StagedWatch(area, cap_bytes)) \
        if node.lead else None
    # Decided from the files, by harness code, never from the check's report (team code wrote it there).
    compiles = mentions_compile(node.snapshot)

    def start_training(gate=None):
        return train(opts, track, data, nproc, node, record, area, abort, reporter, spec, taker, heartbeat,
                     compiles=compiles, gate=gate)

    # The fixed loop's check process starts first, held before any team code: its imports are done while the
    # launcher imports torch elastic and the ranks start (harness/launcher/run/check_process.py).
    check_proc = None if spec is not None else CheckProcess(
        node.snapshot, vocab_size=track.data.vocab_size, device=track.device, seed=opts.seed,
        log_path=node.log("preflight.log"), eval_seq_len=track.eval.seq_len, precision=record.precision,
        sandbox_mode=track.sandbox, protected=protected_paths(opts.runs_dir, data), caps=track_caps(track), hold=True)

    def check() -> dict:
        reporter.progress("checking the submission...")
        try:
            if spec is not None:
                return check_open(node.snapshot, spec, track, record, node.log("preflight.log"), opts.seed,
                                  protected_paths(opts.runs_dir, data), meanwhile=lambda: _provenance(record))
            return check_proc.finish(meanwhile=lambda: _provenance(record), abort=abort)  # released: team code runs
        finally:
            reporter.end_progress()

    # The fixed loop's ranks start beside the check and wait for its word (harness/launcher/run/check_phase.py);
    # an open-division script is the team's from its first line: it starts once the check has passed.
    try:
        beside = JobBeside(start_training) if spec is None else None
    except BaseException:
        if check_proc is not None:
            check_proc.close()
        raise
    ranks = set(range(opts.node_rank * nproc, (opts.node_rank + 1) * nproc))
    try:
        try:
            passed, beside = check_then_say(check, lambda report: accept_check(record, report, track, reporter,
                                                                               abort, copies), beside, ranks, record,
                                            track.nnodes, track.rendezvous_timeout_s if track.nnodes > 1 else 0.0,
                                            abort)
        except BaseException:
            if beside is not None:  # told stop (check_then_say): the job ends before the error goes further
                try:
                    beside.result()
                except BaseException:  # noqa: BLE001  (the first error is the one to raise)
                    pass
            raise
        finally:
            if check_proc is not None:  # ended where a path above never released it (a node that never joined)
                check_proc.close()
        if not passed:
            if beside is not None:
                timings = dict(record.timings)
                try:
                    beside.result()  # the job ends, told stop, before the record says why
                except Exception:  # noqa: BLE001  (the run's outcome is the check's; a stopped job adds nothing)
                    pass
                record.timings = timings  # a job stopped before the team's start-up measured nothing of the team's
            return
        try:
            phase = beside.result() if beside is not None else start_training()
        except RunRefused as exc:  # before any rank: the machine lacks what the track requires, or the files are too many
            set_outcome(record, exc.status, str(exc))
            return
        metrics.extend(metrics_rows(phase))
        if spec is not None:
            staged = area.staged_changed("checkpoint.pt", held=True)
            record.extra["staged_checkpoint_bytes"] = staged[1] if staged else None
            saved_s = staged[0] if staged else None
            if saved_s is not None and taker is not None and taker.changed_unseen():
                saved_s = None  # its bytes changed after the last change the kernel recorded: up to the job's end
                record.notes.append("the checkpoint's bytes changed after the last change of the file the kernel "
                                    "recorded, or were kept from the launcher while the job ran (a shared mapping, a "
                                    "lease): the training window runs to the job's end, not to the save")
            apply_open_training(record, phase, spec, track.startup_allowance_s, saved_s)
        else:
            apply_training(record, phase)
            if record.extra.get("compile_skipped") is True:  # what the rank saw: it asked to compile, and did not
                record.notes.append(f"the model is torch.compile'd; track {track.name} trained its plain module "
                                    "(compile = \"eager\"): the same weights at another speed, so another number of "
                                    "steps in the budget; compiled blocks inside the model still compile")
        first = opts.node_rank * nproc  # this node's first rank: its log is here
        settle_outcome(record, phase, track, open_division=spec is not None, compiles=compiles, metrics=metrics,
                       first_rank_log=node.run_dir / "logs" / f"rank{first}.log", first_rank=first)
        if node.lead and track.nnodes > 1:
            merge_node_reports(record, node, phase.outcome, track.nnodes, silent_after_s(track), heartbeat)
        if taker is not None:
            taker.wait()  # a copy started on rank 0's report has ended before anything reads or removes it
        if record.status != "ok" or not node.lead:
            area.release_job_folder()  # the logs are taken, and this node takes no checkpoint: its memory back
            if record.status != "ok":  # taken when rank 0 saved it, but nothing is scored: the record holds no weights
                checkpoint.unlink(missing_ok=True)
            elif track.nnodes > 1:
                join_run(opts, track, data, node, record, abort, reporter)
            return
        if spec is not None:  # the script's own file, normalised by a sandboxed check of its model
            if not finish_open_training(record, node.snapshot, spec, track, area, checkpoint, node.log("check-after.log"),
                                        opts.seed, protected_paths(opts.runs_dir, data)):
                return
        elif not taker.take_after_the_job(phase.watch):  # from here on only the launcher and evaluation touch it
            if taker.error is not None:  # the launcher's own copy failed: the machine's, unless a team can cause it
                set_outcome(record, *io_failure_outcome("the checkpoint could not be taken", taker.error, taker.errno,
                                                        area.same_disk(checkpoint.parent)))
            elif taker.too_large is not None:
                set_outcome(record, "invalid", taker.cap_reason())
            elif taker.attempted:
                set_outcome(record, "invalid", "rank 0 said its checkpoint was saved, and staging held no checkpoint "
                            "then (the harness saves it before saying so)")
            else:
                set_outcome(record, "crashed", "rank 0 reported success but never said its checkpoint was saved")
            return
    finally:
        if taker is not None:  # its thread reads the ranks' folder: done before the folder goes
            taker.wait()
        if not area.cleanup():  # a team that leaves what cannot be removed would fill the scratch for the runs after
            flag_run(record, f"the ranks' private folder {area.dir} could not be removed after the job: what is left "
                             "there (read it before removing it by hand) fills the scratch root for the runs after")
    record.checkpoint_sha256 = file_sha256(checkpoint)
    saves = [m.body for m in phase.messages if m.kind == "checkpoint_saved" and m.body.get("rank") == 0]
    said = saves[0].get("sha256") if saves and spec is None else None  # the report the launcher took the file on
    if len(saves) > 1:
        flag_run(record, f"rank 0 said {len(saves)} times that its checkpoint was saved (the harness says it once)")
    if spec is None and said != record.checkpoint_sha256:  # replaced between rank 0's save and the copy
        set_outcome(record, "invalid", "the checkpoint in staging was replaced after the harness saved it and before "
                    "the launcher took it (sha256 " f"{record.checkpoint_sha256[:12]}, saved as {(said or 'none')[:12]}): not scored")
        flag_run(record, record.reason)
        checkpoint.unlink(missing_ok=True)  # not what rank 0 saved: not kept as if it were
        return
    if _sha256_or_none(run_dir / "submission") != record.submission_sha256:
        set_outcome(record, "invalid", "the submission's files in the record changed during training; "
                     "evaluation will not import them")
        flag_run(record, record.reason)
        return
    record.status = "evaluating"  # not final: other runs' guards leave a record alone until it says it is done
    save_record(run_dir, record)

    eval_nproc = opts.eval_nproc or track.eval.nproc_per_node or nproc
    plan = EvalPlan(checkpoint_sha256=record.checkpoint_sha256, nproc=eval_nproc, precision=record.precision,
                    vocab_out=int(record.config.get("vocab_size") or track.data.vocab_size),
                    model_file=spec.model if spec else "submission.py")
    t_eval = time.monotonic()
    evaluate_run(opts, track, data, node, record, plan, abort, reporter)
    record.timings["eval_s"] = time.monotonic() - t_eval
    record.timings["total_s"] = time.monotonic() - t_begin


SCRATCH_NEED_WHY = "rank 0 stages its checkpoint there, up to the track's checkpoint_cap_gib, and 1 GiB more"


def scratch_need_gib(track: Track) -> float:
    """What an honest run must find free in the scratch root at its start: room for its checkpoint (up to
    checkpoint_cap_gib) and 1 GiB of logs and caches, never more than the whole scratch_cap_gib. Not the whole
    cap: a 64 GiB cap on a node whose disk is 64 GiB would refuse every run; a team that writes past what it
    found free meets ENOSPC of its own making. `harness doctor` measures the whole cap (a warning)."""
    return min(track.scratch_cap_gib, track.checkpoint_cap_gib + 1.0)


def _sha256_or_none(folder: Path) -> str | None:
    """The record's copy of the submission, hashed as it was copied (regular files only); None when
    something else appeared in it."""
    try:
        return submission_sha256(folder)
    except SubmissionError:
        return None
