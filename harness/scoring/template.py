"""The scorer's end of evaluation's model-process template (harness/ranks/models/model_template.py).

A clean process, started before the scorer reads anything, imports torch once and forks one
single-use copy per model process before any model process exists; each model process is a fork of
one copy. Only the scorer holds the copies' sockets (Linux: SOCK_SEQPACKET and SCM_RIGHTS), and it
draws which copy serves which role. ModelWorker (workers.py) sees a forked model process as it sees
a subprocess.Popen: a pid and wait().
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.ranks import interpreter
from harness.ranks.confine import sandbox
from harness.scoring.children import WorkerFailed, descendants, remove_tree


class ForkedProcess:
    """A model process forked by one copy of the template, seen as ModelWorker sees a subprocess.Popen
    (pid, wait). Its pid is read when first needed, so the scorer goes on (importing torch) while the
    template is still importing it; the copy is its parent, so its exit code comes from there."""

    def __init__(self, channel: "_Channel"):
        self._channel, self._pid, self.returncode = channel, None, None

    @property
    def pid(self) -> int:
        if self._pid is None:
            self._pid = int(self._channel.reply(FORK_REPLY_TIMEOUT_S)["pid"])
        return self._pid

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; subprocess.TimeoutExpired if it still runs after `timeout`; ChildProcessError
        if the copy cannot say (it is gone, or broke its protocol)."""
        if self.returncode is None:
            timeout_s = 3600.0 if timeout is None else max(0.0, timeout)
            try:
                pid = self.pid
                self._channel.send({"op": "wait", "pid": pid, "timeout_s": timeout_s})
                code = self._channel.reply(timeout_s + 30.0)["code"]
            except WorkerFailed as exc:
                raise ChildProcessError(str(exc)) from None
            self.returncode = None if code is None else int(code)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"model process {self._pid}", timeout)
        return self.returncode


FORK_REPLY_TIMEOUT_S = 600.0  # the template's import of torch on a loaded machine, at most


class _Channel:
    """The scorer's socket to one copy of the template. Any failure breaks it for good: a reply that
    comes late is never taken for the answer to a later question."""

    def __init__(self, sock):
        self.sock, self.broken = sock, ""

    def send(self, request: dict, fds: list[int] = ()) -> None:
        import socket

        if self.broken:
            raise WorkerFailed("crashed", self.broken)
        try:
            self.sock.settimeout(30.0)
            socket.send_fds(self.sock, [json.dumps(request).encode()], list(fds))
        except OSError as exc:
            self._break(f"the model-process template took no request ({exc})")

    def reply(self, timeout_s: float) -> dict:
        if self.broken:
            raise WorkerFailed("crashed", self.broken)
        try:
            self.sock.settimeout(timeout_s)
            data = self.sock.recv(1 << 16)
        except OSError as exc:
            self._break(f"the model-process template did not answer ({exc or 'timed out'}); see the scorer's log")
        if not data:
            self._break("the model-process template is gone; see the scorer's log")
        try:
            answer = json.loads(data)
        except ValueError:
            answer = {"error": "an unreadable reply"}
        if not isinstance(answer, dict) or "error" in answer:
            self._break(f"the model-process template refused a request: {answer.get('error') if isinstance(answer, dict) else answer}")
        return answer

    def _break(self, why: str) -> None:
        self.broken = why
        self.sock.close()
        raise WorkerFailed("crashed", why)


class ModelTemplate:
    """The scorer's end of harness/ranks/models/model_template.py: a clean process, started before the scorer
    reads anything, that imports torch once and forks one single-use copy per model process before
    any model process exists. Only this process holds the copies' sockets; a model process never does
    (Linux: SOCK_SEQPACKET and SCM_RIGHTS). Which copy serves which role is drawn at random."""

    def __init__(self, processes: int = 2):
        import socket

        self.dir = Path(tempfile.mkdtemp(prefix="harness-template-"))
        os.chmod(self.dir, 0o700)
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(processes)]
        self._channels = [_Channel(ours) for ours, _ in pairs]
        self._all = list(self._channels)
        theirs = [t.fileno() for _, t in pairs]
        try:  # its output goes to the scorer's log; it prints only if it fails
            self.proc = subprocess.Popen(
                interpreter.python_argv("harness.ranks.models.model_template", os.environ.get("HARNESS_RUN_ID", "-"), os.getpid(),
                                        *theirs),
                pass_fds=theirs, stdin=subprocess.DEVNULL, cwd=self.dir, env=sandbox.private_environment(self.dir),
                close_fds=True, start_new_session=True)
        except BaseException:
            for channel in self._all:
                channel.sock.close()
            remove_tree(self.dir)
            raise
        finally:
            for _, t in pairs:
                t.close()
        self._closed = False

    def fork(self, *, log_fd: int, fds: tuple[int, int, int], logits_bytes: int, cwd: Path,
             env: dict[str, str]) -> ForkedProcess:
        """A new model process with `log_fd` as its output and `fds` (requests, replies, logits buffer),
        from a copy drawn at random among those not used yet. Returns at once: the descriptors are in
        flight, and the pid is read when first needed."""
        if not self._channels:
            raise WorkerFailed("crashed", "the model-process template has no copy left")
        channel = self._channels.pop(secrets.randbelow(len(self._channels)))
        channel.send({"op": "fork", "cwd": str(cwd), "env": env, "logits_bytes": int(logits_bytes)},
                     [log_fd, *fds])
        return ForkedProcess(channel)

    def family(self) -> set[int]:
        """The template and its copies (its children): never a model process (a copy's child)."""
        me = self.proc.pid
        return {me} | {pid for pid, parent in descendants(me).items() if parent == me}

    def close(self) -> None:
        """End the template and its copies (the model processes are ended by their ModelWorker.close,
        or die with their copy)."""
        if self._closed:
            return
        self._closed = True
        for channel in self._all:
            channel.sock.close()
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its session: the template and the copies it forked
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        remove_tree(self.dir)


def model_template() -> ModelTemplate | None:
    """A template where the model processes can be forked from one (Linux); None elsewhere: each is
    then started as a fresh interpreter."""
    import socket

    return ModelTemplate() if sys.platform.startswith("linux") and hasattr(socket, "send_fds") else None
