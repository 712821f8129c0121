"""`harness check SUBMISSION [--track T]`: what the organisers' harness will say, in seconds on a CPU.

The same checks as before every run (in a throw-away process): import, the contract, output
shapes at the run's micro-batch, parameter count and FLOPs per token on the meta device, then the
model built from CONFIG and one forward and backward at batch 1 for real (dtypes, a finite loss),
the evaluation length, the causality probe; plus the static screen and, when accepted, the exact
command the organisers will run. Every problem is listed at once.
"""

from __future__ import annotations

import math
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.launcher.control.job_cgroup import track_caps
from harness.launcher.run.identity import ROSTER, RosterError, resolve_identity
from harness.submission.open_division import OPEN, config_before_training, division_of, read_open_spec, script_argv
from harness.launcher.run.check_process import run_preflight
from harness.ranks.confine.scratch import refuse_unusable, remove_tree
from harness.results.records import runs_root
from harness.submission.contract import find_submission, read_team, relative_paths
from harness.submission.printable import printable
from harness.submission.portability import portability_target, split_screen, warning_lines
from harness.tracks.resolve import track_option
from harness.tracks.spec import Track, load_track


@dataclass
class CheckResult:
    accepted: bool
    report: dict
    team: str
    track: Track
    command: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # worth fixing, not a reason to reject

    @property
    def wont_run(self) -> list[dict]:
        """The lines the portability screen says will not run on this track's device (a hard-coded "nccl"
        or "cuda" on a CPU track): the contract holds, but a run there crashes at launch. Not a rejection
        (the screen reads source and may miss a guard; the queue's check keeps such a team), but never
        ACCEPTED for this track either."""
        return [f for f in self.report.get("portability", []) if "will not run on" in str(f.get("what", ""))]

    @property
    def verdict(self) -> str:
        """accepted, "not ready" (accepted by the contract, with lines that will not run on this track's
        device), or rejected; `harness check` exits 0 only for accepted."""
        if not self.accepted:
            return "rejected"
        return "not ready" if self.wont_run else "accepted"


def _open_division(folder: Path, track: Track) -> dict | None:
    """For an open-division folder: what the preflight must check, and the script's command line."""
    if division_of(folder) != OPEN:
        return None
    spec = read_open_spec(folder)
    argv = script_argv(spec, data_dir="<train shards>", checkpoint_path="<private>/checkpoint.pt",
                       vocab_size=track.data.vocab_size, budget_s=track.budget_s, seq_len=track.eval.seq_len)
    config, declared = config_before_training(spec, vocab_size=track.data.vocab_size, seq_len=track.eval.seq_len)
    return {"model_file": spec.model, "script": spec.script, "argv": [spec.script, *argv], "config": config,
            "config_declared": declared, "track_device": track.device,
            "target_track": portability_target(track)}  # this check runs on a CPU; the script on the track's device


def check(submission: str, track_name: str = "local", seed: int = 1, runs_dir: str | None = None,
          sandbox_mode: str = "auto", protected: list[str] = ()) -> CheckResult:
    """`sandbox_mode` and `protected`: as a run's check process gets them; an organiser's command that checks
    every team's folder (harness slurm) passes the track's mode and what no team may read there."""
    refuse_unusable()  # where the check process's private folder goes: noexec is refused before anything runs
    folder = find_submission(submission)
    track = load_track(track_name)
    open_division = _open_division(folder, track)
    tmp = tempfile.mkdtemp(prefix="harness-check-")  # removed as any folder team code may have touched
    try:
        report = run_preflight(folder, vocab_size=track.data.vocab_size, device="cpu", seed=seed, caps=track_caps(track),
                               log_path=Path(tmp) / "check.log", eval_seq_len=track.eval.seq_len,
                               sandbox_mode=sandbox_mode, protected=list(protected),
                               precision="float32",  # on a CPU: bf16 may be emulated there, ~45x slower
                               open_division={k: open_division[k] for k in ("model_file", "script", "config",
                                                                              "config_declared", "track_device",
                                                                              "target_track")}
                               if open_division else None)
        if open_division:
            report["division"], report["script_argv"] = OPEN, open_division["argv"]
        if not report["ok"] and not report["problems"]:
            report["problems"].append({"file": str(folder), "problem": "the check process failed", "fix": ""})
        log = (Path(tmp) / "check.log").read_text(errors="replace")[-4000:]
    finally:
        remove_tree(tmp)
    report["log_tail"] = log
    problems = report["problems"]
    try:
        team = read_team(folder).name
    except Exception as exc:  # submission.toml problems are problems too
        problems.append({"file": str(folder / "submission.toml"), "problem": str(exc), "fix": ""})
        team = folder.name
    for p in problems:  # the team's own files, as they name them: paths relative to the submission folder
        p["file"] = relative_paths(p.get("file", ""), [folder]) or "."
        p["problem"] = relative_paths(p.get("problem", ""), [folder])
    # Lines that will not run on the track's device: for the team to fix, not for a reviewer to read.
    report["screen"], report["portability"] = split_screen(report.get("screen", []))
    warnings = [relative_paths(str(w), [folder]) for w in report.get("warnings", [])]
    warnings += warning_lines(report["portability"])
    report["warnings"] = warnings
    try:
        identity = resolve_identity(runs_root(runs_dir), team, folder)
    except RosterError as exc:  # the organiser's file: said, and the check cannot say who the team is
        identity = None
        problems.append({"file": ROSTER, "problem": str(exc), "fix": "the organisers fix their roster"})
    if identity is not None and identity.refused:
        on_roster = (runs_root(runs_dir) / ROSTER).exists()
        problems.append({"file": ROSTER if on_roster else "submission.toml", "problem": identity.refused, "fix": ""})
    elif identity is not None:
        if identity.note:
            warnings.append(identity.note)
        team = identity.name
    command = ["harness", "run", submission, "--track", track_option(track)]  # works from any folder, any node
    return CheckResult(accepted=not problems, report=report, team=team, track=track, command=command,
                       warnings=warnings)


def render(result: CheckResult) -> list[str]:
    """The check's report in lines; every one passes `printable` (team text is shown, never obeyed)."""
    return [printable(line, 8000, one_line=False) for line in _render(result)]


def values_seen_by(track: Track, open_division: bool = False) -> str:
    """Who first sees the values of a model the check on this CPU took by its shapes alone."""
    if track.device == "cuda":
        return (f"on track {track.name} the run's own check, on the GPU, sees them before training (a finite first "
                "loss, causality)")
    if open_division:  # the team's own loop: the harness sees the model once it is trained
        return (f"on track {track.name} the run sees them after training: the check of the checkpoint's model and "
                "evaluation's causality check on the scoring itself")
    return (f"on track {track.name} the run sees them first: its first training step (a non-finite loss ends it "
            "diverged) and evaluation's causality check on the scoring itself")


def _render(result: CheckResult) -> list[str]:
    r, t = result.report, result.track
    lines = [f"checking team {result.team!r} for track {t.name!r} (on this CPU; the event runs {t.device})"]

    def row(name: str, text: str) -> None:
        lines.append(f"  {name:<18}{text}")

    if r.get("division") == OPEN:
        row("division", "open: your script runs on every rank (torch elastic, as torchrun) as")
        lines.append(f"      python {' '.join(r['script_argv'])}")
        before = r.get("before_training") or {}
        if before.get("ok") and before.get("values_checked"):  # a large model on a CPU: its shapes alone
            how = "[open.config]" if before.get("declared") else "the config your arguments suggest"
            row("model", f"ok before training with {how}, not by its values: {before['values_checked']}; "
                         f"{values_seen_by(t, open_division=True)}")
            for warning in before.get("warnings") or []:
                lines.append(f"  WARNING: {printable(str(warning))}")
        elif before.get("ok"):
            how = "[open.config]" if before.get("declared") else "the config your arguments suggest"
            row("model", f"ok before training with {how}: {before.get('params', 0):,} parameters, forward at the "
                         f"evaluation length {t.eval.seq_len}, causal; checked again after training, rebuilt from the "
                         "checkpoint's config")
        else:
            row("model", "its files compile and get_model is defined; the model itself is checked after training, "
                         "rebuilt from the checkpoint's config (shapes, gradients, causality, FLOPs)")
    cfg = r.get("config")
    if cfg:
        B, T, A = cfg["micro_batch_size"], cfg["seq_len"], cfg["grad_accum_steps"]
        nproc = t.nproc_per_node if isinstance(t.nproc_per_node, int) else "N"
        world = t.nnodes * nproc if isinstance(nproc, int) else "N"
        row("contract", f"ok: micro_batch_size {B}, seq_len {T}, grad_accum_steps {A}, vocab_size {cfg['vocab_size']}"
                        + (", COMPILE" if r.get("compile") else ""))
        tokens = f"{world * B * T * A:,}" if isinstance(world, int) else "?"
        row("tokens per step", f"{world} ranks x {B} x {T} x {A} = {tokens}")
    if r.get("compile"):
        how = "get_model returns a torch.compile'd module" if r.get("compiled_by_get_model") else "COMPILE = True"
        if t.compile == "eager":
            row("compile", f"yes ({how}); track {t.name} trains its plain module (compile = \"eager\"): the same "
                           "model at another speed, so another number of steps; a track that compiles does so in the "
                           "first step")
        else:
            row("compile", f"yes ({how}): the first training step compiles, on the clock (seconds to minutes; on a "
                           f"{t.budget_s:.0f} s budget on a small CPU it can be most of it). Checked here eagerly")
    if "params" in r:
        row("model", f"ok: {r['params']:,} parameters ({r['trainable_params']:,} trainable)")
        on = "on the meta device" if r.get("shapes_on") == "meta" else r.get("shapes_on", "")
        if r.get("initial_loss") is None:  # a large model on a CPU: contract_checks.values_unchecked says why
            shapes = "not run" if r.get("logits_shape") is None else f"ok: logits {r['logits_shape']}"
            row("forward/backward", f"{shapes} ({on})")
            row("values", f"not checked here: {r.get('values_checked', 'no real forward was run')}; {values_seen_by(t)}")
        else:
            row("forward/backward", f"ok: logits {r['logits_shape']} ({on}) {r['logits_dtype']}, loss {r['loss_dtype']}, "
                                    f"initial loss {r['initial_loss']:.3f} at batch {r.get('real_batch')} "
                                    f"(ln vocab = {math.log(t.data.vocab_size):.3f})")
        timings = r.get("check_timings_s") or {}
        if timings:
            row("check time", ", ".join(f"{k.removesuffix('_s').replace('_', ' ')} {v:.1f} s" for k, v in timings.items()))
    if r.get("causality"):
        row("causality", f"ok: logits unchanged at positions <= t when later tokens change "
                         f"(t in {r['causality']['positions']})")
    if r.get("flops_per_token") is not None:
        row("FLOPs per token", f"{r['flops_per_token']:,.0f} per training token (forward + backward)")
        if r.get("flops_note"):
            row("", r["flops_note"])
    box = r.get("sandbox") or {}
    if box.get("active"):
        row("sandbox", f"ok: the check ran in the sandbox ({box.get('why')}); training and evaluation use it too")
    else:
        row("sandbox", f"WARNING: not available on this machine ({box.get('why', 'unknown')}). Runs here are not "
                       "isolated from the validation data and other records; the organisers' machines must have "
                       "it, or use a separate user (docs/organizer.md)")
    screen = r.get("screen", [])
    row("static screen", "nothing to review" if not screen else f"{len(screen)} line(s) for a reviewer to look at "
        "(warnings, not verdicts: they are in the record too):")
    for f in screen:
        lines.append(f"      WARNING {f['file']}:{f['line']}  [{f['category']}] {f['what']}: {f['code']}")
    if result.verdict == "accepted":  # another one is not run as it is: its command would read as a promise
        row("organisers run", shlex.join(result.command))
        if t.nnodes > 1:
            row("", f"one launcher per node: harness slurm {result.command[2]} --track {shlex.quote(result.command[4])} --submit")
    for w in result.warnings:
        lines.append(f"  WARNING: {printable(w)}")
    shapes_only = r.get("values_checked") or (r.get("before_training") or {}).get("values_checked")
    if result.verdict == "accepted" and shapes_only:  # (for the open division, said on its `model` row)
        shapes = r.get("logits_shape") if "before_training" not in r else r["before_training"].get("logits_shape")
        by = "ITS SHAPES" if shapes is not None else "ITS BUILD"
        lines.append(f"ACCEPTED BY {by}: this submission passes every check the harness could make here; "
                     f"its values were not checked ({values_seen_by(t)}).")
    elif result.verdict == "accepted":
        lines.append("ACCEPTED: this submission passes every check the harness makes before a run.")
    elif result.verdict == "not ready":
        n = len(result.wont_run)
        lines.append(f"NOT READY for track {t.name!r}: the contract holds, but {n} line(s) above will not run on its "
                     f"device ({t.device}, {t.backend}): a run there crashes at launch. Make each edit its warning "
                     "names (the same script then runs on every track), or check against the track you will run "
                     "on. The screen reads your source: where a guard it does not recognise protects a line, "
                     "`harness run` runs the script anyway.")
    else:
        lines.append(f"REJECTED: {len(r['problems'])} problem(s):")
        for p in r["problems"]:
            text = f"{p['file']}: {p['problem']}" + (f" Fix: {p['fix']}" if p.get("fix") else "")
            lines.append("  - " + text.replace("\n", "\n    "))
    return lines
