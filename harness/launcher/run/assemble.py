"""Turning what the training phase saw into the run record: figures, outcome, checks, the record's text
(evaluation's part: evaluation.py; the console summary: summary.py).

Pure functions of the phase results and the record, kept apart from the orchestration in
harness/launcher/run/runner.py so each can be read (and tested) on its own.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from harness.results.metrics import implausible_mfu_note, mfu, peak_flops_per_device
from harness.launcher.run.phases import PhaseResult
from harness.ranks.confine.namespaces import PROC_SYS, USERNS_OTHER_CAUSES, userns_restriction
from harness.results.records import RunRecord
from harness.submission.contract import relative_paths
from harness.submission.printable import REASON_MAX_CHARS, printable

# What the ranks report of the communication probe -> the record's `comm_probe`.
PROBE_FIELDS = {"comm_probe_steps": "steps", "comm_probe_synced_step_s": "synced_step_s",
                "comm_probe_compute_step_s": "compute_step_s", "comm_overlap_efficiency_min": "efficiency_min",
                "comm_overlap_efficiency_max": "efficiency_max", "comm_s": "comm_s"}


def team_count(value: Any) -> int | None:
    """A count from a file team code could write (the check's report.json): an int from 0 to 2**62, or
    nothing. Anything else would reach the tables as a figure they cannot hold."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2**62 else None


def team_number(value: Any) -> float | None:
    """A non-negative finite number from a file team code could write, or nothing."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def apply_training(record: RunRecord, phase: PhaseResult) -> None:
    results = phase.reports("result")
    r0 = results.get(0, {})
    record.steps, record.tokens = r0.get("steps"), r0.get("tokens")
    record.train_time_s, record.train_loss, record.params = r0.get("train_time_s"), r0.get("train_loss"), r0.get("params")
    record.device_name = r0.get("device_name")
    for key in ("max_step_s", "median_step_s", "slowest_earlier_step_s", "last_step_start_s", "tokens_per_step",
                "reports_dropped", "first_step_s", "compiled", "compile_skipped", "ddp"):
        if key in r0:
            record.extra[key] = r0[key]
    if r0.get("config"):
        record.config = r0["config"]
    if results:
        record.peak_mem_gib = max(r.get("peak_mem_gib") or 0.0 for r in results.values())
        record.data_wait_s = max(r.get("data_wait_s") or 0.0 for r in results.values())
    record.sandbox["training"] = phase.sandbox_report(0)
    record.launcher_train_time_s = phase.watch.launcher_train_time_s
    record.startup_s = phase.watch.startup_s
    saved = phase.reports("checkpoint_saved").get(0)
    if saved:  # rank 0's own account: the copy, the file and its hash (the launcher's is timings.checkpoint_s)
        record.extra["checkpoint_write"] = {"bytes": saved.get("bytes"), "save_s": saved.get("save_s")}
    check_replicas(record, results)
    check_first_step(record, r0)
    say_slow_first_step(record)
    check_reports(record, phase)
    if record.tokens and record.train_time_s:
        record.tokens_per_s = record.tokens / record.train_time_s
        record.tokens_per_s_per_device = record.tokens_per_s / max(1, record.world_size or 1)
    check_clocks(record)  # may replace the throughput with the launcher's figure
    track = record.track
    record.peak_flops_per_device = peak_flops_per_device(track.get("peak_flops_per_device", 0.0),
                                                         track.get("device_peak", ""), record.device_name)
    record.mfu = mfu(record.flops_per_token, record.tokens_per_s_per_device, record.peak_flops_per_device)
    note = implausible_mfu_note(record.flops_per_token, record.tokens_per_s_per_device, record.peak_flops_per_device)
    if note:
        record.notes.append(note)
    if r0.get("comm_overlap_efficiency") is not None:
        record.comm_overlap_efficiency = r0["comm_overlap_efficiency"]
        record.comm_probe = {new: r0.get(old) for old, new in PROBE_FIELDS.items()}
    if record.steps is None:  # killed or crashed: keep what rank 0 last reported
        progress = [m.body for m in phase.messages if m.kind == "progress" and m.body.get("rank") == 0]
        if progress:
            record.steps, record.tokens = progress[-1].get("step"), progress[-1].get("tokens")
            record.train_loss = progress[-1].get("train_loss")


def check_replicas(record: RunRecord, results: dict[int, dict]) -> None:
    """Rank 0's checkpoint is harness code's copy of the weights at the last agreement point; weights that
    moved after that copy (a thread that trains on after the clock) flag the run. DDP keeps the ranks'
    weights identical only if every rank takes the same steps with the same lr; only rank 0's are
    scored, so a difference is noted (rank-dependent code in a submission)."""
    if results.get(0, {}).get("weights_changed_after_clock") is True:
        flag_run(record, "rank 0's weights changed after the clock stopped (after harness code copied them for the "
                         "checkpoint): something of the submission kept training past the budget")
    digests = {r: res.get("weights_sha256") for r, res in results.items() if res.get("weights_sha256")}
    if len(digests) < 2:
        return
    record.extra["replicas_identical"] = len(set(digests.values())) == 1
    if not record.extra["replicas_identical"]:
        differ = sorted(r for r, d in digests.items() if d != digests.get(0))
        record.notes.append(f"the weights of rank(s) {', '.join(map(str, differ))} differ from rank 0's at the end "
                            "(only rank 0's are scored)")


def check_reports(record: RunRecord, phase: PhaseResult, phase_name: str = "training") -> None:
    """Reports the channel refused (a process claiming to be a rank it is not), and reports of the
    node's lead rank that came after it said training ended (work after the clock), flag the run."""
    seen: list[str] = []
    if phase.refused:
        record.extra.setdefault("refused_reports", []).extend(f"{phase_name}: {r}" for r in phase.refused)
        impostors = [r for r in phase.refused if "already reporting" in r]
        if impostors:
            seen.append(f"a process pretended to be a rank during {phase_name} ({impostors[0]})")
    hellos = [m.body.get("rank") for m in phase.messages if m.kind == "hello"]
    lead = min(hellos) if hellos else None
    ends = [i for i, m in enumerate(phase.messages) if m.kind == "train_end" and m.body.get("rank") == lead]
    if ends:  # in arrival order (several frames can share one arrival time): what came after the end
        late = [m for m in phase.messages[ends[0] + 1:] if m.body.get("rank") == lead
                and m.kind in ("progress", "train_start", "setup_start", "train_end")]
        if late:
            seen.append(f"rank {lead} reported {late[0].kind!r} after training had ended")
    if phase.malformed:  # dropped on arrival; a harness rank never sends one, so the run is looked at
        record.extra.setdefault("malformed_reports", []).extend(f"{phase_name}: {m}" for m in phase.malformed)
        seen.append(f"a malformed report was sent during {phase_name} ({phase.malformed[0]})")
    if seen:
        flag_run(record, "; ".join(seen))


def flag_run(record: RunRecord, reason: str) -> None:
    """Hide the run from the ranking for a person to review; every reason is kept."""
    record.flag_reason = f"{record.flag_reason}; {reason}" if record.flagged and record.flag_reason else reason
    record.flagged = True
    record.notes.append(reason)


def clock_tolerance_s(budget_s: float) -> float:
    """How far the ranks' and the launcher's training windows may differ: report latency, not cheating."""
    return max(0.5, 0.01 * budget_s)


RELABEL_GAIN_BOUND = 1.0  # nats: what relabelling the vocabulary may cost a first step before it flags the run


def check_first_step(record: RunRecord, result: dict) -> None:
    """A model that arrives trained is flagged for review, whatever the cause (weights shipped, training in
    get_model or at import, a state carried from another run). The test: its first micro-batch, before any
    optimizer step, scored by harness code as it is and under eight random relabellings of the vocabulary
    (harness/ranks/training/first_step.py). Weights drawn without the data treat every token alike: the batch as it
    is scores like one more relabelling, within their spread (measured on every example and test model:
    within 0.16 nats; an initialisation that favours repeating the current token, as tied embeddings do,
    keeps that favour under any relabelling). A trained model knows which token is which: every
    relabelling costs it nats (a bigram table trained on the data: 5-7 on the test track). Flagged when
    the relabellings' mean is above the batch's own score by more than RELABEL_GAIN_BOUND and three of
    their spreads (an initialisation with large accidents on a few token ids spreads them). A probe that
    could not run is said in the notes: evaluation calls the model the same way. (A bound on the loss
    itself, ln V - 1, flagged honest tied-embedding models on repetitive text: their first step scores
    below ln V there.)"""
    loss, relabeled = result.get("first_step_loss"), result.get("first_step_relabeled_loss")
    if loss is None or relabeled is None:
        return
    if not math.isfinite(loss) or not math.isfinite(relabeled):
        record.notes.append("the first-step probe could not score the model (it failed in eval mode, before "
                            "training): whether it arrived trained is not known")
        return
    spread = result.get("first_step_relabeled_spread")
    spread = float(spread) if spread is not None and math.isfinite(spread) else 0.0
    gain, bound = relabeled - loss, max(RELABEL_GAIN_BOUND, 3.0 * spread)
    record.extra["first_step"] = {"loss": loss, "relabeled_loss": relabeled, "relabeled_spread": spread,
                                  "knows_tokens_by": gain, "bound": bound}
    if gain > bound:
        flag_run(record, f"the model arrived trained: its first training step, before any optimizer step, scored "
                         f"{loss:.3f} nats, and {relabeled:.3f} once the vocabulary was relabelled at random; an "
                         f"untrained model scores both alike (the bound is {bound:.2f} nats). Weights "
                         "shipped with the submission, or training before the clock?")


SLOW_FIRST_STEP_SHARE = 0.5  # a first step that took this much of the budget left little for training


def say_slow_first_step(record: RunRecord) -> None:
    """A first step that took most of the budget is said, with its likely cause: a compiled model's first
    step compiles, on the clock, and on a short track it can leave a handful of steps (a val_loss near
    uniform, otherwise unexplained)."""
    first_s, budget_s = record.extra.get("first_step_s"), record.budget_s
    if not first_s or not budget_s or record.track.get("max_steps") or first_s < SLOW_FIRST_STEP_SHARE * budget_s:
        return
    why = ("torch.compile compiles in it: on this track compiling costs more than it saves; try the run without "
           "COMPILE (and return the plain model from get_model)" if record.extra.get("compiled")
           else "a slow first forward: compilation inside the model (a compiled block or attention), data, allocation")
    record.warnings.append(f"the first step took {first_s:.1f} s, {first_s / budget_s:.0%} of the {budget_s:.0f} s "
                           f"budget, and {record.steps} step(s) were trained in all ({why})")


def check_window(record: RunRecord, track) -> str:
    """"" when the launcher's training window ends within its bound, else why not. The stop rule starts no
    step predicted to end past the budget (it predicts with the slowest of the last five), so an honest
    window ends past it by at most about one step: two median steps, or the slowest step the run had
    already taken (leaving out the first, which compiles, and the last, which is the one checked) and
    one median more, for a step that is slow every k steps; or the track's `overrun_allowance_s`
    (report latency, a busy machine) if larger. The steps' part is never more than 5% of the budget,
    whatever the ranks report of their steps. A step held open past the clock (a forward that trains
    on, gradients all-reduced) shows here, in the launcher's own measurement."""
    window = record.launcher_train_time_s
    if window is None or track.max_steps or not record.budget_s:
        return ""
    if record.division == "open":
        return check_open_window(record, track)
    median = float(record.extra.get("median_step_s") or 0.0)
    slowest = float(record.extra.get("slowest_earlier_step_s") or 0.0)
    steps_part = max(2.0 * median, slowest + median)
    allowed = max(track.overrun_allowance_s, min(steps_part, 0.05 * record.budget_s))
    over = window - record.budget_s
    record.extra["window_check"] = {"launcher_window_s": window, "budget_s": record.budget_s, "over_s": over,
                                    "allowed_s": allowed, "median_step_s": median, "slowest_earlier_step_s": slowest,
                                    "ok": over <= allowed}
    if over <= allowed:
        return ""
    said = (f"training ran {window:.2f} s by the launcher's clock, {over:.2f} s past its {record.budget_s:.0f} s "
            f"budget")
    if (record.steps or 0) <= 1:  # no second step to compare with: the first one did not fit the budget
        return (f"{said}: its first step alone did not fit the budget (torch.compile compiles in the first step; a "
                "budget must hold it)")
    return (f"{said}: more than the {allowed:.2f} s a last step may end late (two median steps of {median:.3g} s, "
            f"the slowest earlier step of {slowest:.3g} s and a median, or {track.overrun_allowance_s:g} s); a step "
            "held open past the clock is training off the clock")


SAVE_S_PER_GIB = 2.0  # what the bound gives a script's checkpoint save: torch.save to a local disk, with room


def open_overrun_bound_s(track, checkpoint_bytes: int | None) -> float:
    """How far past the budget an open-division window may end: a last step (the track's overrun allowance, or 5%
    of the budget if more: wider than the fixed loop's bound, whose steps are known), and the save of its checkpoint,
    which its window includes: 1 s and SAVE_S_PER_GIB for its size, never more than the checkpoint allowance."""
    save_s = 1.0 + SAVE_S_PER_GIB * (checkpoint_bytes or 0) / 2**30
    return max(track.overrun_allowance_s, 0.05 * track.budget_s) + min(track.checkpoint_allowance_s, save_s)


def check_open_window(record: RunRecord, track) -> str:
    """The open division's hard clock: a script's window (harness/launcher/run/open_run.py open_window: from its
    first forward, or the end of the start-up allowance, to its checkpoint saved) ends within the budget and
    open_overrun_bound_s, else the run is a timeout, as a fixed-loop run held open past the clock is."""
    window = record.launcher_train_time_s
    allowed = open_overrun_bound_s(track, record.extra.get("staged_checkpoint_bytes"))
    over = window - record.budget_s
    record.extra["window_check"] = {"launcher_window_s": window, "budget_s": record.budget_s, "over_s": over,
                                    "allowed_s": allowed, "ok": over <= allowed}
    if over <= allowed:
        return ""
    start = "its first_forward()" if record.startup_s is not None else "the end of the start-up allowance"
    end = ("its checkpoint saved" if record.extra.get("window_end") == "checkpoint"
           else "the job's end")
    return (f"training ran {window:.2f} s by the launcher's clock (from {start} to {end}), {over:.2f} s past its "
            f"{record.budget_s:.0f} s budget: more than the {allowed:.2f} s an open-division window may end late "
            f"(a last step and the checkpoint's save); stop training at the budget (--time_limit_min) and save then")


def check_clocks(record: RunRecord) -> None:
    """The launcher's window is the one enforced; a rank clock that disagrees flags the run for review."""
    ranks, launcher = record.train_time_s, record.launcher_train_time_s
    if ranks is None or launcher is None:
        return
    tolerance = clock_tolerance_s(record.budget_s or 0.0)
    record.extra["clock_check"] = {"ranks_s": ranks, "launcher_s": launcher, "tolerance_s": tolerance,
                                   "agree": abs(launcher - ranks) <= tolerance}
    if abs(launcher - ranks) > tolerance:
        # The launcher's window is the enforced one: throughput is computed from it, not the ranks' claim.
        if record.tokens:
            record.tokens_per_s = record.tokens / launcher
            record.tokens_per_s_per_device = record.tokens_per_s / max(1, record.world_size or 1)
        flag_run(record, f"clock disagreement: the launcher measured {launcher:.2f} s of training, the ranks "
                         f"reported {ranks:.2f} s (tolerance {tolerance:.2f} s); was a clock patched?")


def metrics_rows(phase: PhaseResult) -> list[dict[str, Any]]:
    return [m.body for m in phase.messages if m.kind == "progress" and m.body.get("rank") == 0]


def sandbox_warnings(record: RunRecord, proc_sys: str = PROC_SYS) -> None:
    """Every process that ran the team's code without the sandbox, named in the record's warnings; first, where
    the host refused the namespaces beside Landlock, one loud line with the host's setting and its fix."""
    loud = weakened_sandbox(record, proc_sys)
    if loud and loud not in record.warnings:
        record.warnings.insert(0, loud)

    def walk(where: str, report) -> None:
        if isinstance(report, dict) and "active" in report:
            if not report["active"]:
                line = f"the {where} ran without the sandbox: {report.get('why') or 'unknown reason'}"
                if line not in record.warnings:
                    record.warnings.append(line)
            for part in ("namespaces", "filesystem"):  # evaluation's model processes: the layers beside Landlock
                sub = report.get(part)
                if report["active"] and isinstance(sub, dict) and sub.get("active") is False:
                    line = f"the {where} ran without its {part} isolation: {sub.get('why') or 'unknown reason'}"
                    if line not in record.warnings:
                        record.warnings.append(line)
                elif isinstance(sub, dict) and sub.get("active") and sub.get("own_proc") is False:
                    line = f"the {where} saw the host's processes: {sub.get('why')}"
                    if line not in record.warnings:
                        record.warnings.append(line)
        elif isinstance(report, dict):
            for name, sub in report.items():
                walk(f"{where} ({name} process)", sub)

    names = {"check": "check before the run", "training": "training ranks", "evaluation": "evaluation"}
    for phase, report in record.sandbox.items():
        walk(names.get(phase, phase), report)
    uncontained = {phase: r.get("why") for phase, r in (record.extra.get("containment") or {}).items()
                   if isinstance(r, dict) and r.get("active") is False}
    swept = [name for r in (record.extra.get("containment") or {}).values() if isinstance(r, dict)
             for name in r.get("swept") or []]
    if swept:  # an earlier run on this host left processes alive (its launcher was killed outright): said
        line = (f"processes of an earlier run were still alive when this one started (their launcher was killed "
                f"outright) and were ended: {', '.join(swept[:5])}")
        if line not in record.warnings:
            record.warnings.append(line)
    uncapped = sorted({f"{c} ({why})" for r in (record.extra.get("containment") or {}).values() if isinstance(r, dict)
                       for c, why in ((r.get("limits") or {}).get("why") or {}).items()})
    if uncapped:  # the host's, the same for every phase: a job may then exhaust the node's memory or pids
        line = (f"no cap of the job's own on {'; '.join(uncapped)}: a job that allocates or forks without end can "
                "exhaust the node's (docs/rules.md, \"Signals and other processes\")")
        if line not in record.warnings:
            record.warnings.append(line)
    if uncontained:  # one line: the cause is the host's, the same for every phase
        held = (record.extra.get("job_namespace") or {}).get("pid_namespace") is True
        line = (f"no cgroup of the job's own for {', '.join(names.get(p, p) for p in uncontained)} "
                f"({next(iter(uncontained.values()))}): " +
                ("the training job's processes were ended with its PID namespace (the check's and evaluation's model "
                 "processes have their own), but nothing caps what a job allocates or forks"
                 if held else "a process that forks faster than the teardown lists the job's processes can outlive "
                 "the run") + " (docs/rules.md, \"Processes\")")
        if line not in record.warnings:
            record.warnings.append(line)


def weakened_sandbox(record: RunRecord, proc_sys: str = PROC_SYS) -> str:
    """One line, "" unless a process that ran team code lacked the namespaces its sandbox asks for (the track's
    sandbox not "off"): the user namespaces the host refused leave Landlock alone, and nothing else says why
    (harness/ranks/confine/namespaces.py userns_restriction: Ubuntu 24.04's AppArmor default, and the fix)."""
    if record.track.get("sandbox") == "off":
        return ""
    missing: dict[str, str] = {}
    job = record.extra.get("job_namespace")
    if isinstance(job, dict) and job.get("active") is False and job.get("why") != "off":
        missing["training ranks"] = str(job.get("why") or "")

    def walk(where: str, report) -> None:
        if isinstance(report, dict) and "active" in report:
            sub = report.get("namespaces")
            if isinstance(sub, dict) and sub.get("active") is False:
                missing.setdefault(where, str(sub.get("why") or ""))
        elif isinstance(report, dict):
            for name, sub in report.items():
                walk(f"{where} ({name})", sub)

    for phase in ("check", "evaluation"):  # training's own account is the job namespace's, above
        walk({"check": "the check process", "evaluation": "evaluation's model processes"}[phase],
             record.sandbox.get(phase))
    if not missing:
        return ""
    cause = userns_restriction(proc_sys) or f"{next(iter(missing.values()))}; {USERNS_OTHER_CAUSES}"
    return (f"SANDBOX WEAKENED: this host refused the user namespaces of {', '.join(missing)}, so team code ran "
            "with Landlock alone (no /dev/shm and IPC of the job's own, file modes and times changeable, no PID, "
            f"IPC or network namespace and no root of its own). {cause}")


def set_outcome(record: RunRecord, status: str, reason: str = "", rank: int | None = None, tb: str | None = None) -> None:
    record.status, record.reason, record.failing_rank = status, reason, rank
    if isinstance(tb, str) and tb:
        record.traceback = tb[-TRACEBACK_MAX_CHARS:]


TRACEBACK_MAX_CHARS = 8000


def traceback_tail(text: str) -> str:
    """A traceback as a record shows it: team text escaped (printable), and its end kept where it is long, since
    the error is its last line (escaping control characters lengthens it: a cut at the start lost that line)."""
    shown = printable(text, max(len(text) * 6, 1), one_line=False)  # no cut: an escape is at most 6 characters
    if len(shown) <= TRACEBACK_MAX_CHARS:
        return shown
    return f"... ({len(shown) - TRACEBACK_MAX_CHARS} characters before)\n{shown[-TRACEBACK_MAX_CHARS:]}"


def name_team_files(record: RunRecord, copies: list[Path]) -> None:
    """Errors name the team's files relative to the submission folder ("submission.py:5"), not the path of the
    record's copy, the ranks' private copy or the folder on the machine that ran it: a reason on a leaderboard
    reads the same wherever the run happened."""
    record.reason = printable(relative_paths(record.reason, copies), REASON_MAX_CHARS, one_line=False)
    record.warnings = [printable(relative_paths(str(w), copies)) for w in record.warnings]
    if isinstance(record.traceback, str) and record.traceback:
        record.traceback = traceback_tail(relative_paths(record.traceback, copies))
    elif record.traceback is not None:  # not text (a forged account's): none
        record.traceback = None
    for problem in record.extra.get("problems", []):
        for key in ("file", "problem", "fix"):
            if isinstance(problem.get(key), str):
                problem[key] = printable(relative_paths(problem[key], copies), REASON_MAX_CHARS, one_line=key == "file")
