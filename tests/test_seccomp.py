"""The seccomp filter of every sandboxed process (harness/ranks/seccomp.py): another process's limits,
priority and scheduling are refused; the process's own, and reading another's, are not; its children
inherit it; torch runs under it."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

PROBE = """
import os, resource, subprocess, sys
from harness.ranks import seccomp
assert seccomp.install() == "", "not installed"
parent = os.getppid()
def outcome(call):
    try:
        call()
        return "ok"
    except OSError as exc:
        return f"errno {exc.errno}"
nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
results = {
    "another's limit": outcome(lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE, nofile)),
    "another's limit, read": outcome(lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE)),
    "its own limit": outcome(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)),
    "its own limit by prlimit(0)": outcome(lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, nofile)),
    "another's priority": outcome(lambda: os.setpriority(os.PRIO_PROCESS, parent, 0)),
    "the user's priority": outcome(lambda: os.setpriority(os.PRIO_USER, 0, 0)),
    "its own priority": outcome(lambda: os.setpriority(os.PRIO_PROCESS, 0, 1)),
    "another's scheduler": outcome(lambda: os.sched_setscheduler(parent, os.SCHED_IDLE, os.sched_param(0))),
}
child = subprocess.run([sys.executable, "-c", "import os, resource; resource.prlimit(os.getppid(), "
                        "resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))"], capture_output=True)
results["a child, another's limit"] = "errno 1" if b"PermissionError" in child.stderr else "ok"
import torch
torch.set_num_threads(2)
results["torch"] = "ok" if float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()) == 64 ** 3 else "wrong"
print(results)
"""


def test_other_processes_limits_and_priorities_are_refused_and_its_own_are_not():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == {
        "another's limit": "errno 1", "another's limit, read": "ok", "its own limit": "ok",
        "its own limit by prlimit(0)": "ok", "another's priority": "errno 1", "the user's priority": "errno 1",
        "its own priority": "ok", "another's scheduler": "errno 1", "a child, another's limit": "errno 1",
        "torch": "ok"}
