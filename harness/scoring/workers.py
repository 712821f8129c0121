"""The scorer's end of a model process (harness/ranks/model_worker.py): start it, feed it batches,
take its logits out of the shared buffer, end it.

Each model process gets a private folder of its own (its working directory, HOME and TMPDIR),
an environment that names nothing of the harness's files, two pipes and the shared buffer as
inherited file descriptors, and its stdout and stderr as a log file the scorer opened: it never
needs a path into the runs tree. Both model processes of a scorer are started the same way; only
the scorer knows which one scores and which one checks.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.ranks import sandbox
from harness.ranks.wire import BATCH, DTYPES, ERROR, LOGITS, QUIT, READY, SETUP, receive, send

class WorkerFailed(RuntimeError):
    """The model process failed; `harness_status` is the status its failure maps to."""

    def __init__(self, status: str, reason: str, traceback: str = ""):
        super().__init__(reason)
        self.harness_status, self.worker_traceback = status, traceback


class ModelWorker:
    def __init__(self, *, name: str, setup: dict, buffer_bytes: int, log_path: Path, protected: list[str]):
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix="harness-model-"))
        os.chmod(self.dir, 0o700)
        self.log_path = log_path
        policy = sandbox.build_policy(submission_dir=setup["submission_dir"], private_dir=str(self.dir),
                                      read_files=[setup["checkpoint"]], gpu=setup["device"].startswith("cuda"))
        self.exposed = sandbox.check_protected(policy, protected)
        self.setup = {**setup, "policy": policy.to_dict() if setup.get("sandbox") != "off" else None}
        self.buffer_fd = os.memfd_create("harness-logits", 0) if hasattr(os, "memfd_create") else _anon_file(self.dir)
        os.ftruncate(self.buffer_fd, max(1, buffer_bytes))
        self.buffer = mmap.mmap(self.buffer_fd, max(1, buffer_bytes))
        req_r, self.requests = os.pipe()
        self.replies, rep_w = os.pipe()
        env = sandbox.private_environment(self.dir)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "harness.ranks.model_worker", str(req_r), str(rep_w),
                 str(self.buffer_fd), str(max(1, buffer_bytes))],
                pass_fds=(req_r, rep_w, self.buffer_fd), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                cwd=self.dir, env=env, close_fds=True)
        os.close(req_r)
        os.close(rep_w)
        send(self.requests, SETUP, payload=json.dumps(self.setup).encode())
        self.ready: dict = {}

    def wait_ready(self) -> dict:
        self.ready = self._expect(READY)[1]
        return self.ready

    def submit(self, x) -> None:
        """Hand over the inputs of one batch (int64 [rows, seq_len]); the logits are taken by `logits()`."""
        import numpy as np

        x = np.ascontiguousarray(x, dtype=np.int64)
        send(self.requests, BATCH, x.shape[0], x.shape[1], payload=x.tobytes())

    def logits(self, vocab: int):
        """This batch's logits, copied out of the shared buffer before anything reads them (the model
        process could keep writing there; a private copy is one fixed answer)."""
        import torch

        (rows, seq_len, code), _ = self._expect(LOGITS)
        dtype = getattr(torch, DTYPES[code])
        n = rows * seq_len * vocab
        return torch.frombuffer(self.buffer, dtype=dtype, count=n).view(rows, seq_len, vocab).clone()

    def _expect(self, kind: int) -> tuple[tuple[int, int, int], dict]:
        try:
            got, a, b, c, payload = receive(self.replies)
        except (EOFError, OSError):
            code = self._exit_code()
            raise WorkerFailed("crashed", f"the model process died (exit code {code}) without a report; "
                                          f"see logs/{self.log_path.name}") from None
        if got == ERROR:
            report = json.loads(payload)
            raise WorkerFailed(report.get("status", "crashed"), report.get("reason", ""), report.get("traceback", ""))
        if got != kind:
            raise WorkerFailed("crashed", f"the model process answered message {got}, expected {kind}")
        return (a, b, c), (json.loads(payload) if payload else {})

    def _exit_code(self, wait_s: float = 5.0):
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        try:
            send(self.requests, QUIT)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.requests, self.replies):
            try:
                os.close(fd)
            except OSError:
                pass
        self.buffer.close()
        os.close(self.buffer_fd)
        shutil.rmtree(self.dir, ignore_errors=True)


def _anon_file(folder: Path) -> int:
    """Where memfd_create is missing: an unlinked file in the model process's own folder."""
    fd, path = tempfile.mkstemp(dir=folder)
    os.unlink(path)
    return fd
