"""`harness eval RUN_DIR`: score a run's checkpoint again, the same way, for audits and disputes.

The track is the one saved in the record (overrides included); the data must be the data the
run used (same fingerprint), and the checkpoint must be the one recorded (same sha256).
Nothing in the record is changed: the figure is printed, for a person to compare.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.launcher.run.console import NullReporter
from harness.data.prepare import prepare_data
from harness.data.shards import DataError
from harness.launcher.run.phases import run_evaluation
from harness.tracks.precision import resolve_precision
from harness.ranks.confine.scratch import refuse_unusable
from harness.results.records import load_record
from harness.launcher.run.evaluation import (build_eval_job, causality_verdict, describe_inconclusive, describe_noncausal,
                                             eval_caps)
from harness.tracks.spec import track_from_record
from harness.launcher.control.watch import abort_on_signals


@dataclass
class Rescore:
    status: str
    reason: str
    val_loss: float | None
    recorded_val_loss: float | None
    val_tokens: int | None
    world_size: int
    eval_time_s: float | None
    causality: dict | None = None  # the check on the scoring batches of this evaluation (a fresh secret seed)
    sandbox: dict | None = None


def eval_ranks(given: int | None, runs: int, device: str, visible_gpus: int | None) -> tuple[int, str]:
    """(ranks to evaluate with, a note when that is not the run's): `--nproc-per-node` when given, else the
    run's ranks per node, on a GPU as many as this machine shows (every token is scored once whatever the
    ranks: the figure is the same). More ranks than GPUs is refused with the number there is."""
    if device != "cuda" or visible_gpus is None:
        return given or runs, ""
    if visible_gpus == 0:
        raise ValueError("the run was scored on CUDA GPUs and this machine shows none")
    if given is not None:
        if given > visible_gpus:
            raise ValueError(f"--nproc-per-node {given}: this machine shows {visible_gpus} GPU(s); give "
                             f"{visible_gpus} or fewer")
        return given, ""
    if runs > visible_gpus:
        return visible_gpus, (f"this machine shows {visible_gpus} GPU(s): evaluating with {visible_gpus} rank(s), not "
                              f"the run's {runs} (the figure does not depend on it)")
    return runs, ""


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count()  # NVML's count where it can: no CUDA context in the launcher


def rescore(run_dir: str | Path, nproc: int | None = None, data_root: str | None = None, reporter=None) -> Rescore:
    reporter = reporter or NullReporter()
    refuse_unusable()  # the model processes' private folders go there
    run_dir = Path(run_dir).expanduser().absolute()  # evaluation's model processes work in folders of their own
    record = load_record(run_dir)
    if not (run_dir / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"{run_dir}: no checkpoint.pt (the run ended with status {record.status!r})")
    track = track_from_record(record.track)
    data = prepare_data(track, data_root, say=reporter.info)
    if record.data_fingerprint and data.fingerprint != record.data_fingerprint:
        where = ("a synthetic track's data is drawn per machine when its cache is built: rescore on the machine "
                 "that ran it, or with HARNESS_CACHE_DIR pointing at a copy of its cache"
                 if track.data.source == "synthetic" else "point --data-root at the run's data")
        raise DataError(f"the data found ({data.location}, fingerprint {data.fingerprint}) is not the data this run "
                        f"used (fingerprint {record.data_fingerprint}); {where}")
    nproc, note = eval_ranks(nproc, track.eval.nproc_per_node or record.nproc_per_node or 1, track.device,
                             _visible_gpus() if track.device == "cuda" else None)
    if note:
        reporter.info(note)
    # The run's own precision, even on another machine: the figure must be computed the same way.
    precision = record.precision or resolve_precision(track.dtype, track.device)[0]
    protected = [str(run_dir.resolve().parent.parent.parent), *(s.path for s in data.val)]  # the runs tree, the val data
    model_file = "submission.py"
    if record.division == "open":  # the model file the run was scored with, from its own submission copy
        from harness.submission.open_division import read_open_spec

        model_file = read_open_spec(run_dir / "submission").model
    job = build_eval_job(track, data, run_dir, record.checkpoint_sha256 or "", nproc, precision,
                         int(record.config.get("vocab_size") or track.data.vocab_size), protected, model_file=model_file)
    log = run_dir / "logs" / "rescore-launcher.log"
    job.log_dir = str(run_dir / "logs" / "rescore")
    with abort_on_signals() as abort:
        ev = run_evaluation(job, nproc, timeout_s=track.eval.timeout_s, shutdown_timeout_s=track.shutdown_timeout_s,
                            log_path=log, abort=abort, reporter=reporter, caps=eval_caps(track, nproc))
    r0 = ev.reports("eval_result").get(0, {})
    status, reason, causality = ev.outcome.status, ev.outcome.reason, r0.get("causality")
    verdict = causality_verdict(causality)
    if status == "ok" and verdict == "non-causal":
        status, reason = "invalid", describe_noncausal(causality)
    elif status == "ok" and verdict == "inconclusive":  # a figure, and a word for the person who asked
        reason = describe_inconclusive(causality, record.run_id)
    return Rescore(status=status, reason=reason, val_loss=r0.get("val_loss"), recorded_val_loss=record.val_loss,
                   val_tokens=r0.get("val_tokens"), world_size=nproc, eval_time_s=r0.get("eval_time_s"),
                   causality=causality, sandbox=r0.get("sandbox"))
