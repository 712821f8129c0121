"""The scorer's end of a model process (harness/ranks/models/model_worker.py): start it, feed it batches,
take its logits out of the shared buffer, end it.

Each model process gets a private folder of its own (its working directory, HOME and TMPDIR),
an environment that names nothing of the harness's files, two pipes and the shared buffer as
inherited file descriptors, and its stdout and stderr as a log file the scorer opened: it never
needs a path into the runs tree. Both model processes of a scorer are started the same way (on
Linux as forks of a clean template's copies, harness/scoring/template.py; elsewhere as fresh
interpreters), each in a session of its own, and never at the same time: the scorer ends the
scoring process, and every process it started, before the check process exists (`kill_tree`; the scorer is a child subreaper,
so a process that leaves its session or is orphaned is still the scorer's descendant and is found).
"""

from __future__ import annotations

import builtins
import json
import mmap
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.ranks import interpreter
from harness.ranks.confine import logs, sandbox, scratch
from harness.ranks.process import MODEL_PROCESS_ENV, reap_children, thread_group_lives
from harness.scoring.children import WorkerFailed, _proc_stat, descendants, remove_tree, runs  # noqa: F401
from harness.ranks.models.wire import BATCH, DTYPES, ERROR, LOGITS, READY, SANDBOX, SETUP, receive, send

if TYPE_CHECKING:
    from harness.scoring.template import ModelTemplate

PR_SET_CHILD_SUBREAPER = 36
MODEL_STATUSES = ("invalid", "crashed")  # the only statuses taken from a model process's own report


def become_subreaper() -> bool:
    """Orphans of this process's descendants are re-parented to it, not to init: a process a model
    process starts cannot leave the scorer's tree by double-forking or calling setsid (Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


PF_EXITING = 0x4  # /proc/<pid>/stat's flags: the process is in the kernel's exit path
SIGKILL_PENDING = 1 << (signal.SIGKILL - 1)  # its bit in /proc/<pid>/status's SigPnd and ShdPnd masks


def _dying(pid: int) -> bool:
    """True when the process can never again run code of its own: it is exiting, or a SIGKILL waits for it
    (delivered as soon as it leaves the kernel). A GPU's driver can take many seconds to tear a large
    CUDA context down in that state."""
    try:
        if thread_group_lives(pid):  # its main thread has exited (and says PF_EXITING) while others run on: each
            tasks = [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]  # of those must be told to die
            return all(_kill_pending(f"/proc/{pid}/task/{t}/status") for t in tasks)
        with open(f"/proc/{pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
        if flags & PF_EXITING:
            return True
        return _kill_pending(f"/proc/{pid}/status")
    except (OSError, IndexError, ValueError):
        return False  # gone (the next scan says so) or unreadable: not known to be dying


def _kill_pending(status: str) -> bool:
    with open(status) as f:
        masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(m & SIGKILL_PENDING for m in masks)


def _still_child_of(pid: int, parents: set[int]) -> bool:
    st = _proc_stat(pid)
    return st is not None and runs(pid, st[0]) and st[1] in parents


def _kill_if_still(pid: int, parents: set[int]) -> bool:
    """SIGKILL `pid` only if it is still the process that was found: a pidfd pins the process, and its
    parent is checked after the pin (a pid that was freed and reused by an unrelated process between
    the scan of /proc and the kill is never signalled). True if a live process was signalled; a
    descendant whose parent changed meanwhile is found again, with its new parent, by the next scan.
    Without pidfd_open (not Linux, or a kernel before 5.3) the parent is checked, then the pid killed."""
    fd = None
    if hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            fd = None
    try:
        if not _still_child_of(pid, parents):
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        if fd is not None:
            os.close(fd)


def _left_running(below: set[int], ready: dict) -> int | None:
    """How many processes the team's code had running when its model process was ended: those below it but the one
    the sandbox forked itself (PID 1 of its namespaces, where the team's code runs). None where the process never
    said it was ready (its sandbox report, sent before any team code, says whether it forked)."""
    if not ready:
        return None
    forked = bool(((ready.get("sandbox") or {}).get("namespaces") or {}).get("active"))
    return max(0, len(below) - (1 if forked else 0))


def kill_tree(leader: int, session: int | None = None, *, keep: set[int] = frozenset(), timeout_s: float = 10.0,
              teardown_s: float = 120.0) -> set[int]:
    """SIGKILL the process `leader`, its session, and every descendant of this process except `keep`,
    until none is left (a process forking as fast as it can is killed in later rounds); raises
    RuntimeError if some survive `timeout_s`, except processes that are only dying (_dying: a GPU's
    context torn down by its driver), which are given `teardown_s` more: they run nothing, and the next
    model process may need the GPU they still hold. Children are reaped, so none lingers as a zombie. Returns every
    process it found below the leader (all of them ended)."""
    me = os.getpid()
    deadline = time.monotonic() + timeout_s
    first = True
    # A killed process is usually gone a millisecond later: the first look comes soon, the later ones every
    # 20 ms. Two model processes end on evaluation's critical path; a fixed 20 ms was 40 ms of every run's.
    pause_s = 0.001
    below: set[int] = set()  # every process found below the leader: none is a Popen of this process (the leader may be)
    while True:
        found = descendants(me)
        targets = {pid: parent for pid, parent in found.items() if pid not in keep}
        below.update(pid for pid in targets if pid != leader)
        targets.setdefault(leader, me)  # gone from /proc: killed only if still our own child (a copy's is not)
        if session is not None and first:  # before the first reap: the leader's session id is still its own
            try:
                os.killpg(session, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        alive = set()
        for pid, parent in targets.items():
            # its parent as found, or this process (a subreaper) once that parent died
            st = _proc_stat(pid) if pid in found else None
            if _kill_if_still(pid, {parent, me}) or (st is not None and runs(pid, st[0])):
                alive.add(pid)  # signalled, or still ours and moved under another parent: another round
        reap_children(unclaimed=below)
        first = False
        if not alive:
            return below
        if time.monotonic() > deadline:
            living = sorted(pid for pid in alive if not _dying(pid))
            if living:
                raise RuntimeError(f"processes the model started could not be ended: {living}")
            if time.monotonic() > deadline + teardown_s:
                raise RuntimeError(f"processes the model started were still exiting {timeout_s + teardown_s:.0f} s "
                                   f"after SIGKILL (a driver's teardown that never ends): {sorted(alive)}")
        time.sleep(pause_s)
        pause_s = min(0.02, pause_s * 2)


# Python's own exception classes: the one name of a scoring failure the record may take from a model process.
PYTHON_EXCEPTIONS = frozenset(name for name, value in vars(builtins).items()
                              if isinstance(value, type) and issubclass(value, BaseException))
# Whether this scorer has handed validation tokens to a model process. A model process started after that (the
# check process) may know them before its first batch: the scoring process can leave them in state that outlives
# it and that the next one reads (which pages of a file the kernel holds cached), so its words are withheld too.
_tokens_handed = False


def tokens_out() -> None:
    """Validation tokens are out, in this scorer or another rank's (whose model processes run beside this rank's and
    share its node's page cache): from now on no model process of this scorer has its words kept."""
    global _tokens_handed
    _tokens_handed = True


def withheld_reason(report: dict, submission_dir: str, log_name: str) -> str:
    """The reason of a model process's failure once validation tokens are out. Its message and traceback are its
    own words, which can carry those tokens (an exception whose text is a batch's tokens, a few KB each run, the
    same validation set every run): the record, and the board, take only what the scorer writes itself. The
    status (invalid or crashed), the team's file and line, written by the scorer from the submission's own list
    of files where the report names one of its Python files and a line it has, and the exception's name where it
    is one of Python's. The words stay in the model process's own log, the organisers'."""
    site = _team_line(report.get("site"), submission_dir)
    name, cause = report.get("exception"), report.get("cause")
    name = (name if isinstance(name, str) and name in PYTHON_EXCEPTIONS
            else WITHHELD_CAUSES.get(cause, "an exception") if isinstance(cause, str) else "an exception")
    return (f"{site + ': ' if site else ''}{name}, after validation tokens were handed out (its message and traceback "
            f"are in logs/{log_name}, the organisers': what a model process says once validation tokens are out is "
            "not put in the record)")


# What describe_failure's `cause` (harness/ranks/process.py) says of an exception that is not Python's own, in the
# scorer's words: an honest team still learns it ran out of memory, or broke the contract the check checks.
WITHHELD_CAUSES = {"oom": "out of memory", "contract": "a broken contract (what harness check checks)"}


def _team_line(site: object, submission_dir: str) -> str:
    """`<rel>:<line>` for a report's `<path>:<line>` that names a Python file of the submission and a line of it,
    written from the submission's own listing (never the report's text); "" otherwise."""
    from harness.submission.files import read_regular, walk

    if not isinstance(site, str):
        return ""
    path, _, line = site.rpartition(":")
    if not (line.isascii() and line.isdigit() and len(line) <= 6):
        return ""
    for root in {submission_dir, os.path.realpath(submission_dir)}:
        wanted = os.path.relpath(path, root) if os.path.isabs(path) else ""
        try:
            rel = next((e.rel for e in walk(submission_dir) if e.rel.endswith(".py") and e.rel == wanted), None)
            if (rel is not None and rel.isprintable()  # a name chosen before any token: no terminal's escapes either
                    and 1 <= int(line) <= read_regular(Path(submission_dir) / rel, 64 << 20).count(b"\n") + 1):
                return f"{rel}:{int(line)}"
        except OSError:
            return ""
    return ""


class ModelWorker:
    _validation = True  # its batches are validation tokens (harness doctor's probe hands it its own)

    def __init__(self, *, setup: dict, buffer_bytes: int, log_dir: Path, protected: list[str],
                 template: ModelTemplate | None = None, scratch_dir: str | None = None, validation: bool = True):
        self._validation = validation
        self.dir = scratch.private_folder("harness-model-", scratch_dir)  # the launcher's scratch root
        # Its log is written under a random name and takes the name in `log_path` (set by the scorer once
        # it gives the process a role) only when every model process of the scorer is dead (name_log):
        # its stdout's path (/proc/self/fd/1) must not tell a model process whether it is the check.
        # It lives in a folder only the harness's user can enter until then: the process holds the file
        # open and could make it setuid (fchmod is no sandbox's); name_log (or the launcher's
        # settle_logs, if this scorer is killed first) resets it before it joins the other logs.
        live = log_dir / logs.LIVE_LOGS
        live.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(live, 0o700)
        self._live_log = live / f"eval-{secrets.token_hex(8)}.log"
        self.log_path = log_dir / self._live_log.name
        self._shape: tuple[int, int] | None = None  # the batch sent last: its logits must have its shape
        self._private = None  # logits(): the private float32 copy, reused
        self.left_running: int | None = None  # close(): processes the team's code had running at the end (_left_running)
        policy = sandbox.build_policy(submission_dir=setup["submission_dir"], private_dir=str(self.dir),
                                      read_files=[setup["checkpoint"]], gpu=setup["device"].startswith("cuda"),
                                      protected=protected)
        self.exposed = sandbox.check_protected(policy, protected)
        self.setup = {**setup, "policy": policy.to_dict() if setup.get("sandbox") != "off" else None}
        self.buffer_fd = _logits_buffer(self.dir, max(1, buffer_bytes))
        self.buffer = mmap.mmap(self.buffer_fd, max(1, buffer_bytes))
        req_r, self.requests = os.pipe()
        self.replies, rep_w = os.pipe()
        # The determinism settings that must be in place before CUDA or Inductor starts (scorer.DETERMINISM).
        env = {**sandbox.private_environment(self.dir), **MODEL_PROCESS_ENV,
               **setup.get("determinism", {}).get("env", {})}
        if setup.get("cuda_visible_devices") is not None:  # its rank's GPU only (scorer.one_visible_device)
            env["CUDA_VISIBLE_DEVICES"] = setup["cuda_visible_devices"]
        log_dir.mkdir(parents=True, exist_ok=True)
        self._closed = False
        self._template = template
        # Without a template: what this scorer had started before (kill_tree leaves it alone).
        self._others = set(descendants(os.getpid())) if template is None and sys.platform.startswith("linux") else set()
        try:
            with open(self._live_log, "ab") as log:
                if template is not None:
                    self.proc = template.fork(log_fd=log.fileno(), fds=(req_r, rep_w, self.buffer_fd),
                                              logits_bytes=max(1, buffer_bytes), cwd=self.dir, env=env)
                else:
                    self.proc = subprocess.Popen(
                        interpreter.python_argv("harness.ranks.models.model_worker", req_r, rep_w, self.buffer_fd,
                                                max(1, buffer_bytes)),
                        pass_fds=(req_r, rep_w, self.buffer_fd), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                        cwd=self.dir, env=env, close_fds=True, start_new_session=True)
        except BaseException:  # not started: nothing of it may stay (it is in no scorer's holders yet)
            for fd in (self.requests, self.replies):
                os.close(fd)
            self.buffer.close()
            os.close(self.buffer_fd)
            remove_tree(self.dir)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        self.ready: dict = {}  # wait_ready()'s answer; empty until then
        try:
            send(self.requests, SETUP, payload=json.dumps(self.setup).encode())
        except OSError:  # it died at once: wait_ready says so, with its exit code
            pass

    def wait_ready(self) -> dict:
        """The model process's `ready`, with the sandbox report it sent before any team code ran (the
        only one taken: a report sent later could have been rewritten by the submission)."""
        report = self._expect(SANDBOX)[1]
        if self.setup.get("sandbox") == "required" and not report.get("active"):
            raise WorkerFailed("crashed", f"the track requires the sandbox and it is not active: {report.get('why')}")
        ready = self._expect(READY)[1]
        self.ready = {**ready, "sandbox": report}
        return self.ready

    def submit(self, x) -> None:
        """Hand over the inputs of one batch (int64 [rows, seq_len]); the logits are taken by `logits()`."""
        import numpy as np

        x = np.ascontiguousarray(x, dtype=np.int64)
        self._shape = (int(x.shape[0]), int(x.shape[1]))
        if self._validation:
            tokens_out()
        send(self.requests, BATCH, x.shape[0], x.shape[1], payload=x.tobytes())

    def logits(self, vocab: int):
        """This batch's logits in float32, copied out of the shared buffer before anything reads them: the
        model process could keep writing there (a softmax that read one value twice could see two), and a
        private copy is one fixed answer. The copy is the one pass over the shared logits, converting as it
        goes, into a buffer of this worker's reused from batch to batch: valid until the next call."""
        import torch

        (rows, seq_len, code), _ = self._expect(LOGITS)
        if (rows, seq_len) != self._shape:  # the harness's own model process checks this; a patched one may not
            raise WorkerFailed("invalid", f"the model process answered a batch of {self._shape} tokens with "
                                          "logits of another shape")  # not its figures: it chose them, having seen tokens
        if code not in DTYPES:
            raise WorkerFailed("crashed", "the model process named an unknown logits dtype")
        dtype = getattr(torch, DTYPES[code])
        n = rows * seq_len * vocab
        if self._private is None or self._private.numel() < n:
            self._private = torch.empty(n, dtype=torch.float32)
        out = self._private[:n].view(rows, seq_len, vocab)
        out.copy_(torch.frombuffer(self.buffer, dtype=dtype, count=n).view(rows, seq_len, vocab))
        return out

    def _expect(self, kind: int) -> tuple[tuple[int, int, int], dict]:
        try:
            got, a, b, c, payload = receive(self.replies)
        except (EOFError, OSError):
            raise WorkerFailed("crashed", f"the model process died ({self._how_it_ended()}) without a report; "
                                          f"see logs/{self.log_path.name}") from None
        except ValueError as exc:  # a malformed or oversized message: its figures are the process's, once tokens are out
            raise WorkerFailed("crashed", "the model process sent a malformed message" if self._withheld()
                               else f"the model process sent {exc}") from None
        if got == ERROR:
            try:
                report = json.loads(payload)
            except ValueError:
                report = None
            if not isinstance(report, dict):
                raise WorkerFailed("crashed", "the model process sent an unreadable error report")
            status = report.get("status")  # the team's word: it may only say which of its own failures it was
            status = status if status in MODEL_STATUSES else "crashed"
            if self._withheld():
                raise WorkerFailed(status, withheld_reason(report, self.setup["submission_dir"], self.log_path.name))
            raise WorkerFailed(status, str(report.get("reason", "")), str(report.get("traceback", "")))
        if got != kind:
            raise WorkerFailed("crashed", f"the model process answered with another message than message {kind}"
                               if self._withheld() else f"the model process answered message {got}, expected {kind}")
        try:  # its figures (a decoder's line and column) are the process's too, once tokens are out
            message = json.loads(payload) if payload else {}
        except (ValueError, RecursionError) as exc:
            raise WorkerFailed("crashed", "the model process sent an unreadable message" if self._withheld()
                               else f"the model process sent an unreadable message ({exc})") from None
        if not isinstance(message, dict):
            raise WorkerFailed("crashed", "the model process sent an unreadable message")
        return (a, b, c), message

    def _withheld(self) -> bool:
        """Whether what this process says is kept from the record: once validation tokens are out (this one was
        handed a batch, an earlier one of this scorer was, or the scorers were about to hand them: tokens_out)."""
        return self._validation and _tokens_handed

    def _how_it_ended(self, wait_s: float = 5.0) -> str:
        """Its exit code, or the signal that ended it, in words; a forked one's copy may be gone too."""
        from harness.ranks.process import ended_how

        try:
            return ended_how(self.proc.wait(timeout=wait_s))
        except subprocess.TimeoutExpired:
            return "its pipes closed, the process itself still ran"
        except ChildProcessError as exc:  # the copy that forked it could not say
            return f"its exit code is lost: {exc}"

    def close(self) -> None:
        """End the model process and everything it started (its session, and any descendant of this
        process that it left behind), then remove its private folder: nothing it wrote or started
        outlives it. It is not asked to quit: it runs no code of its choosing on the way out."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._template is not None:
                try:
                    pid = self.proc.pid
                except WorkerFailed:  # never known: if it exists, it dies with its copy (ModelTemplate.close)
                    pid = None
                if pid is None:  # nothing may run beside the check process unseen: end the evaluation
                    raise WorkerFailed("crashed", "a model process's pid never came from the template, so it "
                                                  "could not be ended; see the scorer's log")
                below = kill_tree(pid, pid, keep=self._template.family())  # this process and all it left; not the copies
                self.left_running = _left_running(below, self.ready)
            elif sys.platform.startswith("linux"):
                below = kill_tree(self.proc.pid, self.proc.pid, keep=self._others)
                self.left_running = _left_running(below, self.ready)
            elif self.proc.poll() is None:
                self.proc.kill()
        finally:
            try:
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, ChildProcessError):
                pass
            for fd in (self.requests, self.replies):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.buffer.close()
            os.close(self.buffer_fd)
            remove_tree(self.dir)

    def name_log(self) -> None:
        """Give the log its role's name (`log_path`). Called once every model process of the scorer is
        dead: a later one must not find an earlier one's log by a name it can guess (stat() by path is
        not Landlock's), nor learn its size or times."""
        logs.reset_log(self._live_log)
        try:
            os.replace(self._live_log, self.log_path)
        except OSError:
            pass


def _logits_buffer(folder: Path, size: int) -> int:
    """The shared buffer the model process writes logits into: a memfd whose size is sealed (a model
    process that truncated it would kill the scorer with SIGBUS when it reads the logits: a crash
    with no reason, where the team's own failure should be named). Where memfd_create is missing,
    an unlinked file in the model process's own folder."""
    import fcntl

    if not hasattr(os, "memfd_create"):
        fd, path = tempfile.mkstemp(dir=folder)
        os.unlink(path)
        os.ftruncate(fd, size)
        return fd
    fd = os.memfd_create("harness-logits", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd
