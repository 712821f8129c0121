"""The launcher and the scorer collect every ended child, orphans adopted as a subreaper included, without taking
a status that a subprocess.Popen still waits for (harness/ranks/process.py: reap_children)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from harness.ranks.process import reap_children


def _until_ended(pid: int, timeout_s: float = 60.0) -> None:
    """Wait until `pid` is a zombie, without reaping it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return
        time.sleep(0.01)
    raise AssertionError(f"{pid} did not end")


def test_a_crashed_process_that_a_popen_waits_for_keeps_its_exit_code():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    _until_ended(proc.pid)
    reap_children()  # as the training job's close does while the check process's Popen is still to be waited
    assert proc.wait(timeout=30) == 3, "the status was taken from the Popen: a crash would read as exit code 0"


def test_an_ended_child_that_nothing_waits_for_is_reaped():
    pid = os.fork()
    if pid == 0:  # a process the harness did not start through Popen (an orphan adopted as a subreaper is one)
        os._exit(0)
    _until_ended(pid)
    reap_children()
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return
    os.waitpid(pid, 0)
    raise AssertionError("the ended child was left a zombie")
