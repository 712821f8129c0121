"""The launcher's side of an open-division run: the team's own train.py on the track's ranks.

What differs from the fixed loop, and only that, lives here: the script's arguments and data
folder, its checks before and after training (the script's checkpoint, normalised, and the model
rebuilt from its config, in a sandboxed throw-away process), and the record's figures, which come
from what the script reported (marked as such) and from the launcher's own clock. Launch, watch,
kill, guard, evaluation and the record are the fixed loop's (harness/launcher/runner.py).
"""

from __future__ import annotations

import time
from pathlib import Path

from harness.data.prepare import PreparedData
from harness.launcher.assemble import check_reports, set_outcome
from harness.launcher.phases import PhaseResult, run_preflight
from harness.launcher.watch import Deadlines
from harness.launcher.workarea import WorkArea
from harness.ranks.jobs import OpenJob
from harness.results.records import RunRecord
from harness.submission.open_division import OpenSpec, script_argv
from harness.tracks.spec import Track


def data_folder(area: WorkArea, data: PreparedData) -> Path:
    """A folder that holds only the train shards (links; the sandbox lets the ranks read those files alone)."""
    folder = area.dir / "data"
    folder.mkdir(exist_ok=True)
    for i, shard in enumerate(data.train):
        name = Path(shard.path).name
        link = folder / name
        if link.exists() or link.is_symlink():  # two shards with one name in different folders
            link = folder / f"{i:04d}_{name}"
        link.symlink_to(shard.path)
    return folder


def build_open_job(spec: OpenSpec, track: Track, data: PreparedData, area: WorkArea, record: RunRecord,
                   policy: dict) -> OpenJob:
    argv = script_argv(spec, data_dir=str(data_folder(area, data)), checkpoint_path=str(area.staging / "checkpoint.pt"),
                       vocab_size=track.data.vocab_size, budget_s=track.budget_s, seq_len=track.eval.seq_len,
                       max_steps=track.max_steps)
    record.extra["script_argv"] = [a.replace(str(area.dir), "<private>") for a in argv]
    return OpenJob(run_id=record.run_id, submission_dir=str(area.submission), script=spec.script, argv=argv,
                   device=track.device, log_dir=str(area.logs), work_dir=str(area.dir), sandbox=track.sandbox,
                   sandbox_policy=policy, budget_s=track.budget_s, max_steps=track.max_steps)


def open_deadlines(track: Track) -> Deadlines:
    """The fixed loop's limits, except that the end of the start-up allowance starts the window."""
    return Deadlines(startup_timeout_s=track.startup_timeout_s, startup_allowance_s=track.startup_allowance_s,
                     hard_limit_s=track.hard_limit_s, save_allowance_s=track.save_allowance_s, implicit_start=True)


def check_open(snapshot: Path, spec: OpenSpec, track: Track, record: RunRecord, log_path: Path, seed: int,
               protected: list[str], checkpoint: Path | None = None, keep_as: Path | None = None) -> dict:
    """Before training: the files compile, model.py has get_model. After (with the script's checkpoint):
    the checkpoint normalised into `keep_as`, and the model rebuilt from its config and checked."""
    extra = {"model_file": spec.model, "script": spec.script}
    if checkpoint is not None:
        extra.update(checkpoint_in=str(checkpoint), checkpoint_name="the checkpoint rank 0 saved at --checkpoint_path")
    return run_preflight(snapshot, vocab_size=track.data.vocab_size, device=track.device, seed=seed,
                         log_path=log_path, eval_seq_len=track.eval.seq_len, precision=record.precision,
                         sandbox_mode=track.sandbox, protected=protected, open_division=extra,
                         read_files=[str(checkpoint)] if checkpoint is not None else [],
                         take={"checkpoint.pt": keep_as} if keep_as is not None else None)


def apply_open_training(record: RunRecord, phase: PhaseResult, spec: OpenSpec) -> None:
    """The figures of a script the harness does not drive: its clock is the launcher's, its step and
    token counts are what it reported (or its checkpoint's step x [open] tokens_per_step)."""
    w = phase.watch
    if w.train_start_s is None and w.setup_start_s is not None:  # finished before saying "first forward" and
        w.train_start_s = w.setup_start_s                        # before the allowance ran out: all of it counts
        record.notes.append("the script never called first_forward(): its training window is measured from the "
                            "ranks' start")
    elif w.implicit_start_s is not None:
        record.notes.append("the script did not call first_forward() within the start-up allowance: its training "
                            "window started when the allowance ran out")
    record.launcher_train_time_s = w.launcher_train_time_s
    record.train_time_s = record.launcher_train_time_s  # the only clock of an open run that the harness trusts
    record.startup_s = w.startup_s
    results = phase.reports("result")
    if results:
        record.peak_mem_gib = max((r.get("peak_mem_gib") or 0.0) for r in results.values()) or None
        record.sandbox["training"] = results.get(min(results), {}).get("sandbox") or {}
    reports = [m.body for m in phase.messages if m.body.get("rank") == 0 and m.kind in ("progress", "train_end")]
    last = reports[-1] if reports else {}
    record.steps, record.tokens = last.get("step"), last.get("tokens")
    losses = [m.body.get("train_loss") for m in phase.messages if m.kind == "progress" and m.body.get("rank") == 0
              and m.body.get("train_loss") is not None]
    record.train_loss = losses[-1] if losses else None
    record.throughput_source = "reported"
    record.extra["reported_by_script"] = bool(reports)
    check_reports(record, phase)


def apply_open_checkpoint(record: RunRecord, report: dict, spec: OpenSpec) -> None:
    """What the check after training learnt from the checkpoint: params, FLOPs, and a step count."""
    found = report.get("checkpoint") or {}
    record.params, record.config = report.get("params"), report.get("config", {})
    record.flops_per_token = report.get("flops_per_token")
    if found.get("prefixes_removed"):
        record.notes.append("the checkpoint's torch.compile/DDP key prefixes were removed")
    if record.steps is None and found.get("step") is not None:
        record.steps = found["step"]
        if spec.tokens_per_step:
            record.tokens = found["step"] * spec.tokens_per_step
            record.extra["tokens_from"] = "the checkpoint's step x [open] tokens_per_step"
    if record.tokens and record.launcher_train_time_s:
        record.tokens_per_s = record.tokens / record.launcher_train_time_s
        record.tokens_per_s_per_device = record.tokens_per_s / max(1, record.world_size or 1)


def finish_open_training(record: RunRecord, snapshot: Path, spec: OpenSpec, track: Track, area: WorkArea,
                         checkpoint: Path, log_path: Path, seed: int, protected: list[str]) -> bool:
    """The script's checkpoint into the record, in the harness's form; False (and the outcome set) if not."""
    staged = area.staging / "checkpoint.pt"
    if not staged.is_file():
        set_outcome(record, "crashed", "the script finished without saving a checkpoint at --checkpoint_path "
                                       "(rank 0 must torch.save {'model': state_dict, 'config': dict} there)")
        return False
    t0 = time.monotonic()
    report = check_open(snapshot, spec, track, record, log_path, seed, protected, checkpoint=staged, keep_as=checkpoint)
    record.timings["checkpoint_check_s"] = time.monotonic() - t0
    if not report["ok"]:
        first = report["problems"][0]
        record.extra["problems"] = report["problems"]
        set_outcome(record, "invalid", f"{first['file']}: {first['problem']}"
                    + (f" Fix: {first['fix']}" if first.get("fix") else ""), tb=first.get("traceback"))
        return False
    apply_open_checkpoint(record, report, spec)
    return checkpoint.is_file()
