"""The check process, seen from the launcher: started, held before team code where a job starts beside it,
released, waited for, and its report read as what it is, a file in a folder where team code ran.

The process itself is harness/ranks/models/preflight.py. The fixed loop's runs start it the moment the run's
folder is ready, before the training job, held (`hold=True`): it enters its sandbox, sends its sandbox report
and the static screen, and imports torch (the harness's own second on a small CPU; its compiler only where the
submission's files mention compiling: harness/ranks/models/lazy_dynamo.py) while the launcher imports torch elastic and
the ranks start, on a core that would otherwise wait; its team code runs only
once the launcher releases it, when every rank holds its connection (harness/launcher/run/check_phase.py).
`harness check` and the open division start it released.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable

from harness.launcher.control import process_tree
from harness.launcher.control.job_limits import caps_reached
from harness.ranks import interpreter
from harness.ranks.confine import logs, sandbox, scratch
from harness.ranks.process import MODEL_PROCESS_ENV, ended_how

PREFLIGHT_TIMEOUT_S = 300.0  # the check before a run, from its release: import, model build, one tiny step
CLOSE_WAIT_S = 30.0  # a killed check's exit; past it the launcher goes on (a process stuck in the kernel)


class CheckProcess:
    """Contract checks in a throw-away, sandboxed process, started here; `finish()` returns the report (ok,
    problems, params, config).

    `open_division` asks for the open division's checks (its keys go into the request: model_file,
    script, checkpoint); `read_files` are files outside the submission the process may read. Nothing the
    process writes is kept: it ran team code. `caps` (job_limits.Caps): the memory and tasks its processes
    may hold together. With `hold`, the process runs no team code before `release()` (or `finish()`); the
    timeout runs from the release. `close()` ends it whatever state it is in (idempotent)."""

    def __init__(self, submission_dir: Path, *, vocab_size: int, device: str, seed: int, log_path: Path,
                 eval_seq_len: int | None = None, precision: str = "bfloat16", sandbox_mode: str = "auto",
                 protected: list[str] = (), timeout_s: float = PREFLIGHT_TIMEOUT_S,
                 open_division: dict | None = None, read_files: list[str] = (), caps=None, hold: bool = False):
        self.submission_dir, self.log_path, self.timeout_s = submission_dir, log_path, timeout_s
        self.open_division, self.protected = open_division, list(protected)
        self.tmp = tmp = scratch.private_folder("harness-preflight-")  # not in the run folder: nodes may share it
        self.policy = None
        if sandbox_mode != "off":
            self.policy = sandbox.build_policy(submission_dir=str(submission_dir), private_dir=str(tmp),
                                               gpu=device == "cuda", read_files=list(read_files),
                                               protected=self.protected)
        request = {"submission_dir": str(submission_dir), "vocab_size": vocab_size, "device": device, "seed": seed,
                   "eval_seq_len": eval_seq_len, "precision": precision, "threads": process_tree.usable_cpus(),
                   "sandbox": sandbox_mode, "policy": self.policy.to_dict() if self.policy else None}
        if open_division is not None:
            request.update(division="open", **open_division)
        req, self.report_path = tmp / "request.json", tmp / "report.json"
        req.write_text(json.dumps(request))
        env = {**sandbox.private_environment(tmp), **MODEL_PROCESS_ENV}
        self.proc: subprocess.Popen | None = None
        self._closed = False
        self._finishing = False  # finish() has waited: it reads the folder after close()
        self._waited_out = False  # finish() waited CLOSE_WAIT_S for a killed process in vain
        self.code: int | None = None
        self.timed_out = False
        self._drain: _Drain | None = None
        self._box_read = self._hold_write = -1
        box_write = hold_read = -1
        self.scope = None
        try:
            # The process's sandbox report comes over a pipe, sent before any team code runs: report.json is in
            # its writable folder, where the team's code could rewrite it.
            self._box_read, box_write = os.pipe()
            if hold:
                hold_read, self._hold_write = os.pipe()
            # Nothing it starts may linger: it joins a cgroup of its own first thing, ended with the scope.
            self.scope = process_tree.ProcessScope(grace_s=2.0, contain="check", caps=caps)
            argv = [self.report_path, box_write] + ([hold_read] if hold else [])
            with open(log_path, "w") as log:
                self.proc = subprocess.Popen(interpreter.python_argv("harness.ranks.models.preflight", req, *argv),
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True, cwd=tmp, env={**env, **self.scope.env()},
                                             pass_fds=(box_write,) + ((hold_read,) if hold else ()))
            self.scope.own(self.proc.pid)  # a job started beside it never ends it (process_tree._OWNED)
            self._t_start = time.monotonic()
            drain, box_read = _Drain(self._box_read), self._box_read  # read as it is written: a report past the
            self._box_read = -1  # pipe's 64 KiB must not block; the drain's to close, once its read returns
            try:
                drain.start()
            except BaseException:
                os.close(box_read)
                raise
            self._drain = drain
        except BaseException:
            self.close()
            raise
        finally:
            for fd in (box_write, hold_read):
                if fd >= 0:
                    os.close(fd)

    def release(self) -> None:
        """The check's team code may run now: the processes started since the scope began (a training job's, beside
        it) are no longer the scope's to end; the timeout runs from here."""
        if self._hold_write < 0:
            return
        self.scope.rebase(keep=self.proc.pid)
        try:
            os.write(self._hold_write, b"go")
        except OSError:  # the process is gone already (BrokenPipeError): finish() reads how it ended
            pass
        os.close(self._hold_write)
        self._hold_write = -1
        self._t_start = time.monotonic()

    def finish(self, meanwhile: Callable[[], None] | None = None, abort=None) -> dict:
        """Releases the process where it is held, does `meanwhile` (the launcher's own work) while it runs, waits
        for it within the timeout, ends all it started, and returns the report. `abort` (watch.AbortFlag): a stop
        (Ctrl-C, scancel) ends the process at once, never released where it came first; the report then says
        it died, and the caller reads the abort."""
        try:
            if abort is None or not abort.is_set:
                self.release()
            if meanwhile is not None:
                meanwhile()  # an exception here closes the scope, which ends the process
            while True:
                left_s = self.timeout_s - (time.monotonic() - self._t_start)
                try:
                    self.code = self.proc.wait(timeout=max(0.0, min(left_s, 0.1)))
                    break
                except subprocess.TimeoutExpired:
                    stopped = abort is not None and abort.is_set
                    if left_s <= 0.1 or stopped:
                        self.proc.kill()
                        self.timed_out = not stopped
                        try:
                            self.code = self.proc.wait(timeout=CLOSE_WAIT_S)
                        except subprocess.TimeoutExpired:  # stuck in the kernel: close() ends its cgroup
                            self._waited_out = True  # how it ended is not known yet; the reason is the timeout's
                        break
        except BaseException:
            self.close()
            raise
        self._finishing = True
        self.close()
        return self._report()

    def close(self) -> None:
        """Ends the process and everything it started; the pipes closed, the process waited for (idempotent). A
        held process reads the end of its hold pipe and leaves by itself, as it does when the launcher dies."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._hold_write >= 0:
                os.close(self._hold_write)
                self._hold_write = -1
            if self.scope is not None:
                self.scope.close()
            if self.proc is not None:
                try:  # ended with the scope: its status; one stuck in the kernel (a driver, a file system) is left,
                    # after a short look where finish() already waited its bound for it
                    self.proc.wait(timeout=1.0 if self._waited_out else CLOSE_WAIT_S)
                except subprocess.TimeoutExpired:
                    pass
                if self.code is None and self._finishing:
                    self.code = self.proc.returncode  # it ended with the scope after all: how, said
            if self._drain is not None:
                self._drain.join(timeout=5.0)  # the process and all it started are gone: the writers are closed
        finally:
            if self._box_read >= 0:
                os.close(self._box_read)
                self._box_read = -1
            logs.reset_log(self.log_path)
            if not self._finishing:  # ended unreleased (its run ended first) or unfinished: nothing of it is read
                scratch.remove_tree(self.tmp)

    def _report(self) -> dict:
        submission_dir, log_path, timeout_s, rep = self.submission_dir, self.log_path, self.timeout_s, self.report_path
        open_division, scope, policy, tmp = self.open_division, self.scope, self.policy, self.tmp
        code, timed_out, protected = self.code, self.timed_out, self.protected
        box = self._drain.data()
        contained = scope.containment()  # with what the caps refused, counted as the scope closed
        capped = caps_reached(contained)  # the job's own caps; or, else, a limit above the job
        outside = caps_reached(contained, outside=True)
        report = _read_report(rep)
        guessed = bool(open_division and open_division.get("config") is not None)  # only then is there an interim
        if guessed and report is not None and report.get("interim") and (timed_out or code != 0):
            # An open-division check with a config the harness guessed, which never rejects: what was checked
            # before it stands, and its end is a warning (harness/ranks/models/open_checks.py writes this report first).
            how = (f"did not finish within {timeout_s:.0f} s" if timed_out
                   else f"ended the check process ({ended_how(code)})")
            report["warnings"] = [*report.get("warnings", []), f"{report.pop('interim')}: it {how}; see {log_path}"]
        elif timed_out:
            report = {"ok": False, "problems": [{"file": str(submission_dir), "problem":
                      f"checking the submission took more than {timeout_s:.0f} s (model build and one tiny step)",
                      "fix": "make get_model and one forward at batch 2 fast"}]}
        elif report is None and capped:  # the team's model, too large for the job's caps: said as such
            memory = bool(((contained.get("limits") or {}).get("refused") or {}).get("oom_kills"))
            report = {"ok": False, "problems": [{"file": str(submission_dir), "problem":
                      f"the check process died ({ended_how(code)}) before reporting, at the job's cap: {capped}; "
                      f"see {log_path}",
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


def run_preflight(submission_dir: Path, *, meanwhile: Callable[[], None] | None = None, **options) -> dict:
    """The check, started and waited for: `meanwhile` is the launcher's own work, done while the process runs
    (its import of torch: on a small CPU, seconds the check would otherwise wait for). Options: CheckProcess's."""
    return CheckProcess(submission_dir, **options).finish(meanwhile)


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
    so the writer never blocks on a full pipe. The thread closes the pipe itself when its read ends: closed
    under a read still waiting (a writer stuck in the kernel past close()'s join), the number would be reused by
    the launcher's next file, and the read that then returned would take that file's bytes."""

    def __init__(self, fd: int):
        super().__init__(name="harness-check-pipe", daemon=True)
        self.fd, self.chunks, self.size = fd, [], 0

    def run(self) -> None:
        try:
            while chunk := os.read(self.fd, 65536):
                if self.size < PIPE_MAX_BYTES:
                    self.chunks.append(chunk)
                    self.size += len(chunk)
        except OSError:
            pass
        finally:
            os.close(self.fd)

    def data(self) -> bytes:
        return b"".join(self.chunks)[:PIPE_MAX_BYTES]


PIPE_MAX_BYTES = 16 << 20


