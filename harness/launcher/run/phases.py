"""The launcher's side of each phase of a run: preflight, training, evaluation.

Each phase starts its processes, watches them, and returns what happened as data
(an Outcome plus the figures the processes reported); the runner turns that into the record.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.launcher.control import process_tree
from harness.ranks import interpreter
from harness.ranks.confine import sandbox, scratch
from harness.launcher.control.channel import ChannelServer, Message
from harness.launcher.run.console import NullReporter, progress_text
from harness.ranks.jobs import EvalJob, TrainJob
from harness.ranks.process import MODEL_PROCESS_ENV, ended_how
from harness.launcher.control.elastic import ElasticJob, LaunchSpec
from harness.launcher.control.job_limits import caps_reached
from harness.launcher.run.outcome import Outcome, classify, last_error_line
from harness.launcher.control.team_files import read_tail
from harness.submission.printable import printable
from harness.launcher.control.watch import AbortFlag, Deadlines, WatchResult, watch


# --------------------------------------------------------------------------- preflight


PREFLIGHT_TIMEOUT_S = 300.0  # the check before a run: import, model build, one tiny step


def run_preflight(submission_dir: Path, *, vocab_size: int, device: str, seed: int, log_path: Path,
                  eval_seq_len: int | None = None, precision: str = "bfloat16", sandbox_mode: str = "auto",
                  protected: list[str] = (), timeout_s: float = PREFLIGHT_TIMEOUT_S, open_division: dict | None = None,
                  read_files: list[str] = (), meanwhile: Callable[[], None] | None = None, caps=None) -> dict:
    """Contract checks in a throw-away, sandboxed process; returns the report (ok, problems, params, config).

    `open_division` asks for the open division's checks (its keys go into the request: model_file,
    script, checkpoint); `read_files` are files outside the submission the process may read;
    `meanwhile` is the launcher's own work, done while the process runs (its import of torch: on a
    small CPU, seconds the check would otherwise wait for). Nothing the process writes is kept: it ran
    team code. `caps` (job_limits.Caps): the memory and tasks its processes may hold together."""
    tmp = scratch.private_folder("harness-preflight-")  # not in the run folder: nodes may share it
    policy = None
    if sandbox_mode != "off":
        policy = sandbox.build_policy(submission_dir=str(submission_dir), private_dir=str(tmp), gpu=device == "cuda",
                                      read_files=list(read_files), protected=list(protected))
    request = {"submission_dir": str(submission_dir), "vocab_size": vocab_size, "device": device, "seed": seed,
               "eval_seq_len": eval_seq_len, "precision": precision, "threads": process_tree.usable_cpus(),
               "sandbox": sandbox_mode, "policy": policy.to_dict() if policy else None}
    if open_division is not None:
        request.update(division="open", **open_division)
    req, rep = tmp / "request.json", tmp / "report.json"
    req.write_text(json.dumps(request))
    env = {**sandbox.private_environment(tmp), **MODEL_PROCESS_ENV}
    # The process's sandbox report comes over a pipe, sent before any team code runs: report.json is in
    # its writable folder, where the team's code could rewrite it.
    box_read, box_write = os.pipe()
    try:
        # Nothing it starts may linger: it joins a cgroup of its own first thing, ended with the scope.
        with open(log_path, "w") as log, process_tree.ProcessScope(grace_s=2.0, contain="check", caps=caps) as scope:
            t_start = time.monotonic()
            proc = subprocess.Popen(interpreter.python_argv("harness.ranks.models.preflight", req, rep, box_write),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=tmp, env={**env, **scope.env()}, pass_fds=(box_write,))
            os.close(box_write)
            box_write = -1
            drain = _Drain(box_read)  # read as it is written: a report past the pipe's 64 KiB must not block it
            drain.start()
            if meanwhile is not None:
                meanwhile()  # an exception here leaves the scope, which ends the process
            timed_out = False
            try:
                code = proc.wait(timeout=max(0.0, timeout_s - (time.monotonic() - t_start)))
            except subprocess.TimeoutExpired:
                proc.kill()
                code, timed_out = proc.wait(), True
        drain.join(timeout=5.0)  # the process and all it started are gone: the writers are closed
        box = drain.data()
    finally:
        os.close(box_read)
        if box_write >= 0:
            os.close(box_write)
        sandbox.reset_log(log_path)
    contained = scope.containment()  # with what the caps refused, counted as the scope closed
    capped = caps_reached(contained)  # the job's own caps; or, else, a limit above the job
    outside = caps_reached(contained, outside=True)
    report = _read_report(rep)
    guessed = bool(open_division and open_division.get("config") is not None)  # only then is there an interim
    if guessed and report is not None and report.get("interim") and (timed_out or code != 0):
        # An open-division check with a config the harness guessed, which never rejects: what was checked
        # before it stands, and its end is a warning (harness/ranks/models/open_checks.py writes this report first).
        how = f"did not finish within {timeout_s:.0f} s" if timed_out else f"ended the check process ({ended_how(code)})"
        report["warnings"] = [*report.get("warnings", []), f"{report.pop('interim')}: it {how}; see {log_path}"]
    elif timed_out:
        report = {"ok": False, "problems": [{"file": str(submission_dir), "problem":
                  f"checking the submission took more than {timeout_s:.0f} s (model build and one tiny step)",
                  "fix": "make get_model and one forward at batch 2 fast"}]}
    elif report is None and capped:  # the team's model, too large for the job's caps: said as such
        memory = bool(((contained.get("limits") or {}).get("refused") or {}).get("oom_kills"))
        report = {"ok": False, "problems": [{"file": str(submission_dir), "problem":
                  f"the check process died ({ended_how(code)}) before reporting, at the job's cap: {capped}; see {log_path}",
                  "fix": "build the model in get_model without holding more than the cap (the check builds it on "
                         "the meta device: large buffers made in get_model itself are real)" if memory
                  else "start fewer processes or threads in get_model and the model's first steps"}]}
    elif report is None and outside:  # not the job's caps: a limit above the job (the node's memory) ran out
        report = {"ok": False, "problems": [{"file": str(submission_dir), "problem":
                  f"the check process died ({ended_how(code)}) before reporting, under a limit above the job's: "
                  f"{outside}; see {log_path}",
                  "fix": ""}]}
    elif report is None:
        report = {"ok": False, "problems": [{"file": str(submission_dir), "problem":
                  f"the check process died ({ended_how(code)}) before reporting; see {log_path}", "fix": ""}]}
    report.pop("interim", None)  # a finished check's report: nothing provisional about it
    if not scratch.remove_tree(tmp):  # team code ran there: whatever it made, removed, or said
        report.setdefault("warnings", []).append(f"the check process's folder {tmp} could not be removed: "
                                                 "it is left in the scratch root")
        report["leftover"] = str(tmp)
    # What the process sent before team code ran, a line each (the sandbox report, then the screen);
    # report.json's copies are not taken.
    sent: dict = {}
    for line in box.split(b"\n")[:2]:
        try:
            message = json.loads(line)
        except ValueError:
            break
        if isinstance(message, dict):
            sent.update((k, message[k]) for k in ("sandbox", "screen") if k in message and k not in sent)
    if isinstance(sent.get("sandbox"), dict):
        report["sandbox"] = {**sent["sandbox"], "reported": True}
    else:  # nothing came (the process died or was killed first): that says nothing of the sandbox
        report["sandbox"] = {"active": False, "reported": False, "why": "the check process sent no sandbox report"}
    report["screen"] = sent.get("screen") if isinstance(sent.get("screen"), list) else []
    report["containment"] = contained
    if policy is not None:
        report["sandbox_exposed"] = sandbox.check_protected(policy, list(protected))
    return report


REPORT_MAX_BYTES = 16 << 20


def _read_report(path: Path) -> dict | None:
    """report.json as the check process left it, or None. Team code ran in that folder: the file may be
    a link (to /dev/zero, a fifo), huge, or not an object; it is read without following links, only
    as a regular file, and only so far."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(REPORT_MAX_BYTES + 1)
        report = json.loads(data) if len(data) <= REPORT_MAX_BYTES else None
    except (OSError, ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return None
    finally:
        os.close(fd)
    if not isinstance(report, dict):
        return None
    bounded, problem = bound_report(report)
    if problem:  # the team's: its code ran where report.json is written, and an honest check never writes this
        return {"ok": False, "problems": [{"file": "report.json", "problem": f"the check's report {problem}",
                                           "fix": "leave the check's report.json as the harness writes it"}]}
    return bounded


REPORT_MAX_DEPTH = 12  # the harness's own report nests 4 deep; a team's CONFIG a little more
REPORT_MAX_ITEMS = 20_000  # per list or object: a model's parameter names (open division) are the longest
REPORT_MAX_TEXT = 16 << 10  # per string, cut past it (a traceback, a warning)
REPORT_MAX_KEPT_BYTES = 2 << 20  # the whole report as JSON, after the cuts: what can reach a record is far less


def bound_report(report: dict) -> tuple[dict, str]:
    """(a copy of report.json's object with each string cut at REPORT_MAX_TEXT, "") or (_, what is wrong with it):
    nested past REPORT_MAX_DEPTH, a list or object past REPORT_MAX_ITEMS, or past REPORT_MAX_KEPT_BYTES as JSON.
    The record copies parts of it (problems, warnings, config): without these bounds a team's code in the check
    could write a record too large to read back, or too deep for the record's own writer (RecursionError), and
    so void any run it chose, its queue entry re-run. Walked with a stack, never recursion."""
    root: dict = {}
    stack = [(report, root, 1)]
    while stack:
        source, target, depth = stack.pop()
        if depth > REPORT_MAX_DEPTH:
            return {}, f"is nested deeper than {REPORT_MAX_DEPTH} levels"
        if len(source) > REPORT_MAX_ITEMS:
            return {}, f"holds a list or object of more than {REPORT_MAX_ITEMS} entries"
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, value in pairs:
            if isinstance(value, str):
                value = value if len(value) <= REPORT_MAX_TEXT else value[:REPORT_MAX_TEXT] + " [cut]"
            elif isinstance(value, (dict, list)):
                copy = {} if isinstance(value, dict) else []
                stack.append((value, copy, depth + 1))
                value = copy
            if isinstance(target, dict):
                target[key if len(key) <= REPORT_MAX_TEXT else key[:REPORT_MAX_TEXT]] = value
            else:
                target.append(value)
    try:
        size = len(json.dumps(root))  # ASCII, as the record writes it: a non-ASCII character is \uXXXX
    except (ValueError, RecursionError):
        return {}, "cannot be written back as JSON"
    if size > REPORT_MAX_KEPT_BYTES:
        return {}, f"is larger than {REPORT_MAX_KEPT_BYTES >> 20} MiB"
    return root, ""


class _Drain(threading.Thread):
    """The check process's report pipe, read while the process runs (it writes the sandbox report and the
    screen before any team code, then closes it). Kept up to PIPE_MAX_BYTES; the rest is read and dropped,
    so the writer never blocks on a full pipe."""

    def __init__(self, fd: int):
        super().__init__(name="harness-check-pipe", daemon=True)
        self.fd, self.chunks, self.size = fd, [], 0

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 65536):
                if self.size < PIPE_MAX_BYTES:
                    self.chunks.append(chunk)
                    self.size += len(chunk)
        except OSError:  # closed under it after a join that timed out: what was read is what there is
            pass

    def data(self) -> bytes:
        return b"".join(self.chunks)[:PIPE_MAX_BYTES]


PIPE_MAX_BYTES = 16 << 20


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
        sandbox.settle_logs(job.log_dir)  # every scorer and model process is gone: _run_job ended them
