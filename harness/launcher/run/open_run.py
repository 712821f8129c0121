"""The launcher's side of an open-division run: the team's own train.py on the track's ranks.

What differs from the fixed loop, and only that, lives here: the script's arguments and data
folder, its checks before and after training (the script's checkpoint, normalised, and the model
rebuilt from its config, in a sandboxed throw-away process), and the record's figures, which come
from what the script reported (marked as such) and from the launcher's own clock. Launch, watch,
kill, guard, evaluation and the record are the fixed loop's (harness/launcher/run/runner.py).
"""

from __future__ import annotations

import json
import resource
import subprocess
import time
import zipfile
from pathlib import Path

from harness.launcher.control.job_cgroup import track_caps
from harness.data.prepare import PreparedData
from harness.launcher.run.assemble import check_reports, flag_run, set_outcome, team_number
from harness.launcher.run.check_process import bound_report, run_preflight
from harness.launcher.run.phases import PhaseResult
from harness.launcher.control.watch import NO_REPORT_HINT, Deadlines
from harness.launcher.control.team_files import read_tail
from harness.launcher.control.workarea import WorkArea
from harness.ranks import interpreter
from harness.ranks.checkpoint import file_sha256
from harness.ranks.jobs import OpenJob
from harness.ranks.process import ended_how
from harness.results.metrics import implausible_mfu_note, mfu, peak_flops_per_device
from harness.results.records import RunRecord
from harness.submission.open_division import OpenSpec, config_before_training, script_argv
from harness.submission.printable import printable
from harness.submission.portability import portability_target
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
                   device=track.device, log_dir=str(area.logs), sandbox=track.sandbox,
                   sandbox_policy=policy, budget_s=track.budget_s, max_steps=track.max_steps,
                   log_interval_s=track.log_interval_s)


def open_deadlines(track: Track) -> Deadlines:
    """One limit that no report of the script moves: the ranks' start + start-up allowance + budget +
    grace (the checkpoint must be saved by then). The fixed loop's save allowance after a reported
    end does not apply: the end would be the script's claim."""
    return Deadlines(startup_timeout_s=track.startup_timeout_s,
                     total_after_setup_s=track.startup_allowance_s + track.hard_limit_s)


def check_open(snapshot: Path, spec: OpenSpec, track: Track, record: RunRecord, log_path: Path, seed: int,
               protected: list[str], checkpoint: Path | None = None, meanwhile=None) -> dict:
    """Before training: the files compile, model.py has get_model. After (with the normalised
    checkpoint, which the process may read and nothing else of the record): the model rebuilt from
    its config, the weights loaded strictly, and the model checked like a fixed-loop submission's."""
    extra = {"model_file": spec.model, "script": spec.script, "target_track": portability_target(track)}
    if checkpoint is not None:
        extra["checkpoint"] = str(checkpoint)
    else:  # before training: the model at the evaluation length now, not after a 10-minute slot
        extra["config"], extra["config_declared"] = config_before_training(
            spec, vocab_size=track.data.vocab_size, seq_len=track.eval.seq_len)
    return run_preflight(snapshot, vocab_size=track.data.vocab_size, device=track.device, seed=seed,
                         log_path=log_path, eval_seq_len=track.eval.seq_len, precision=record.precision,
                         sandbox_mode=track.sandbox, protected=protected, open_division=extra,
                         read_files=[str(checkpoint)] if checkpoint is not None else [], meanwhile=meanwhile,
                         caps=track_caps(track))


def open_window(w, allowance_s: float, saved_s: float | None = None) -> tuple[float | None, float | None]:
    """The training window of a script, on the launcher's clock, held to the budget as the fixed loop's is. From
    its first-forward report (no earlier than the ranks' start, no later than the end of the start-up allowance)
    or, without one (real scripts never call the harness's API), from the end of the allowance: the start-up it
    pays for is the fixed loop's. To its checkpoint saved (`saved_s`: the last change of the file rank 0 left,
    its ctime, which the kernel sets and no process can set back), else to the moment the job ended."""
    if w.setup_start_s is None:
        return None, None
    end = w.kill_at_s or w.exited_s
    if w.train_start_s is not None:
        start = min(max(w.train_start_s, w.setup_start_s), w.setup_start_s + allowance_s)
    else:
        start = w.setup_start_s + allowance_s
    if saved_s is not None and end is not None and w.setup_start_s <= saved_s <= end:
        end = saved_s
    if end is not None:
        start = min(start, end)
    return start, end


def explain_silence(reason: str, rank0_log: Path, rank: int = 0) -> str:
    """A script killed at its limit that reported nothing through the harness's API: a hang in start-up only
    where rank 0 printed nothing either; otherwise its last printed line (a script that trained 320 steps and
    overran was once told it hung in start-up). The log is team-written: its tail only, shown as text."""
    if not reason.endswith(NO_REPORT_HINT):
        return reason
    tail = read_tail(rank0_log)  # no link followed, a regular file only, 64 KiB at most
    lines = [line for line in tail.splitlines() if line.strip() and not line.startswith("[harness]")]
    head = reason[: -len(NO_REPORT_HINT)] + NO_REPORT_HINT[:-1]
    if not lines:
        return head + f" and rank {rank} printed nothing: a hang in start-up?)"
    return head + f"; rank {rank} last printed {printable(lines[-1], 200)!r}: still training? does it stop at --time_limit_min?)"


def apply_open_training(record: RunRecord, phase: PhaseResult, spec: OpenSpec, allowance_s: float,
                        saved_s: float | None = None) -> None:
    """The figures of a script the harness does not drive: its window is the launcher's (open_window),
    its step and token counts are what it reported (or its checkpoint's step x [open] tokens_per_step)."""
    w = phase.watch
    start, end = open_window(w, allowance_s, saved_s)
    if start is not None and w.train_start_s is None:
        record.notes.append(f"the script never called first_forward(): its training window is measured from the "
                            f"end of the start-up allowance ({allowance_s:g} s after the ranks started)")
    if end is not None:  # read by check_open_window and the summary: where the window held to the budget ends
        record.extra["window_end"] = "checkpoint" if saved_s is not None and end == saved_s else "exit"
        if record.extra["window_end"] == "checkpoint":
            record.notes.append("the training window ends when the checkpoint was last written")
    if start is not None and end is not None:
        record.launcher_train_time_s = max(0.0, end - start)
        record.train_time_s = record.launcher_train_time_s  # the only clock of an open run the harness trusts
        record.timings["train_s"] = record.launcher_train_time_s
        if w.train_start_s is not None:  # without a first_forward() the start-up is not known: not 0 s
            record.startup_s = start - w.setup_start_s
            record.timings["startup_s"] = record.startup_s
    record.sandbox["training"] = phase.sandbox_report(0)
    results = phase.reports("result")
    if results:
        record.peak_mem_gib = max((r.get("peak_mem_gib") or 0.0) for r in results.values()) or None
    reports = [m.body for m in phase.messages if m.body.get("rank") == 0 and m.kind in ("progress", "train_end")]
    last = reports[-1] if reports else {}
    record.steps, record.tokens = last.get("step"), last.get("tokens")
    losses = [m.body.get("train_loss") for m in phase.messages if m.kind == "progress" and m.body.get("rank") == 0
              and m.body.get("train_loss") is not None]
    record.train_loss = losses[-1] if losses else None
    record.throughput_source = "reported"
    record.extra["reported_by_script"] = bool(reports)
    check_reports(record, phase)


def apply_open_checkpoint(record: RunRecord, found: dict, report: dict, spec: OpenSpec) -> None:
    """What the checkpoint says (read by harness code alone: step, config, its tensors' sizes) and what
    the model check measured in the sandboxed process that ran model.py: FLOPs per token, and which
    names are parameters. The parameter count is harness code's: the checkpoint's tensors under those
    names, each distinct tensor once (a tied embedding once, buffers not at all), never more than the
    checkpoint holds whatever the check claims."""
    record.params, record.config = parameter_count(found, report.get("param_names")), found.get("config", {})
    record.flops_per_token = team_number(report.get("flops_per_token"))  # report.json: team code ran beside it
    saved = found.get("config") if isinstance(found.get("config"), dict) else {}
    if spec.config is not None:  # the model checked before training was built from [open.config]
        differ = sorted(str(k) for k in set(spec.config) | set(saved) if spec.config.get(k) != saved.get(k))
        if differ:
            record.notes.append(f"the checkpoint's config differs from [open.config], which was checked before "
                                f"training, in {', '.join(differ[:10])}: the model scored is the checkpoint's")
    if found.get("prefixes_removed"):
        record.notes.append("the checkpoint's torch.compile/DDP key prefixes were removed")
    if record.steps is None and found.get("step") is not None:
        record.steps = found["step"]
        if spec.tokens_per_step and found["step"] * spec.tokens_per_step <= 2**62:  # a count the tables can hold
            record.tokens = found["step"] * spec.tokens_per_step
            record.extra["tokens_from"] = "the checkpoint's step x [open] tokens_per_step"
    if record.tokens and record.launcher_train_time_s:
        record.tokens_per_s = record.tokens / record.launcher_train_time_s
        record.tokens_per_s_per_device = record.tokens_per_s / max(1, record.world_size or 1)
    track = record.track
    record.peak_flops_per_device = peak_flops_per_device(track.get("peak_flops_per_device", 0.0),
                                                         track.get("device_peak", ""), record.device_name)
    record.mfu = mfu(record.flops_per_token, record.tokens_per_s_per_device, record.peak_flops_per_device)
    note = implausible_mfu_note(record.flops_per_token, record.tokens_per_s_per_device, record.peak_flops_per_device)
    if note:
        record.notes.append(note)


def parameter_count(found: dict, names) -> int | None:
    """The checkpoint's distinct tensors under the model's parameter names (checkpoint.distinct_tensors);
    without usable names, every distinct tensor (buffers included)."""
    tensors = found.get("tensors")
    if not isinstance(tensors, dict):
        return found.get("params")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        names = list(tensors)
    distinct = {tensors[n][0]: tensors[n][1] for n in set(names) if n in tensors}
    return sum(distinct.values())


NORMALIZE_TIMEOUT_S = 600.0


def expanded_bytes(path: Path) -> int | None:
    """What a torch.save file unpacks to (its zip entries' declared sizes), read without unpacking;
    None when it is no zip (the legacy format: its size is what it is)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError):
        return None


def normalize_in_own_process(src: Path, dst: Path, log_path: Path) -> dict:
    """The team's checkpoint into the harness's form, in a process that imports no team code
    (harness/ranks/checkpoint.py's main): a malformed or huge file cannot hurt the launcher. torch.save
    stores its entries uncompressed, so a file that unpacks to much more than its size is refused (a
    zip bomb), and what the process may write is bounded by the file's size."""
    size = src.stat().st_size
    unpacked = expanded_bytes(src)
    if unpacked is not None and unpacked > 2 * size + (1 << 20):
        return {"error": f"the file unpacks to {unpacked} bytes from {size}: torch.save writes uncompressed "
                         "entries, save the checkpoint with torch.save"}
    limit = 2 * size + (64 << 20)

    def bounded() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(interpreter.python_argv("harness.ranks.checkpoint", src, dst), env=interpreter.child_environment(),
                                  stdout=subprocess.PIPE, stderr=log, text=True, timeout=NORMALIZE_TIMEOUT_S,
                                  start_new_session=True, preexec_fn=bounded)
        except subprocess.TimeoutExpired:
            return {"error": f"reading the checkpoint took more than {NORMALIZE_TIMEOUT_S:.0f} s"}
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        if not isinstance(found, dict):
            raise ValueError("not an object")
    except (ValueError, IndexError, RecursionError):
        return {"error": f"the process that reads the checkpoint died ({ended_how(proc.returncode)}); see {log_path}"}
    # Its config is the team's (saved by its script), and the record keeps it: bounded as the check's report is
    bounded, problem = bound_report({"config": found.get("config")})
    if problem:
        return {"error": f"the checkpoint's config {problem}: save a dict of the model's settings"}
    return {**found, "config": bounded["config"]}


def finish_open_training(record: RunRecord, snapshot: Path, spec: OpenSpec, track: Track, area: WorkArea,
                         checkpoint: Path, log_path: Path, seed: int, protected: list[str]) -> bool:
    """The script's checkpoint into the record, once every process of the job is gone: taken as a
    regular file only (a link could point at the validation data), normalised by harness code alone,
    hashed, then its model checked in a sandbox that may only read it. False (outcome set) if not."""
    taken = checkpoint.with_name("team-checkpoint.pt")
    got = area.take_staged("checkpoint.pt", taken, held=True)  # where the launcher watched it (takeback.StagedWatch)
    area.release_job_folder()  # the job's file system (memory) goes before the processes that read the file start
    if got is None:
        set_outcome(record, "crashed", "the script finished without saving a checkpoint at --checkpoint_path "
                                       "(rank 0 must torch.save {'model': state_dict, 'config': dict} there)")
        return False
    if not got:
        set_outcome(record, "invalid", "the file at --checkpoint_path is not a regular file (a link?); save the "
                                       "checkpoint itself there")
        return False
    t0 = time.monotonic()
    found = normalize_in_own_process(taken, checkpoint, log_path.with_name("checkpoint-read.log"))
    taken.unlink(missing_ok=True)
    if "error" in found:
        set_outcome(record, "invalid", f"the checkpoint rank 0 saved at --checkpoint_path: {found['error']}")
        return False
    digest = file_sha256(checkpoint)
    report = check_open(snapshot, spec, track, record, log_path, seed, protected, checkpoint=checkpoint)
    record.timings["checkpoint_check_s"] = time.monotonic() - t0
    if file_sha256(checkpoint) != digest:
        set_outcome(record, "invalid", "the checkpoint changed while its model was checked")
        flag_run(record, record.reason)
        return False
    if not report["ok"]:
        first = report["problems"][0]
        record.extra["problems"] = report["problems"]
        set_outcome(record, "invalid", f"{first['file']}: {first['problem']}"
                    + (f" Fix: {first['fix']}" if first.get("fix") else ""), tb=first.get("traceback"))
        return False
    apply_open_checkpoint(record, found, report, spec)
    return True
