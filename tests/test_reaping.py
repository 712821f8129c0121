"""Every process that ends is collected, and every process that runs is ended: the launcher and the scorer reap
every ended child (orphans adopted as a subreaper included) without taking a status a Popen still waits for
(harness/ranks/process.py: reap_children), and a process whose main thread exited while another of its threads
runs on (/proc shows it as a zombie) is found and killed with its children, by the scorer's kill_tree and by the
launcher's teardown alike."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT
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


def test_a_popen_that_never_forked_does_not_stop_the_reaping():
    """A fork refused (a task cap) leaves a Popen without a pid, kept alive by the exception's traceback (the
    elastic job keeps its error): the reaping passes it by and still collects what ended."""
    try:
        subprocess.Popen(["echo", "a\0b"])  # refused before its fork (as a fork at a task cap is)
    except ValueError as exc:
        kept = exc  # its traceback holds the Popen whose __init__ failed
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _until_ended(pid)
    reap_children()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    del kept


UNDER_ITS_OWN_PID_NAMESPACE = """
import os, subprocess, sys, time
sys.path.insert(0, {root!r})
from harness.ranks.process import reap_children
assert os.readlink("/proc/self") != str(os.getpid()), "this /proc is the parent namespace's"
proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
pid = os.fork()
if pid == 0:
    os._exit(0)
time.sleep(1.0)
while True:  # both ended: the first to end is looked at first
    reap_children()
    try:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            time.sleep(0.05)
            continue
    except ChildProcessError:
        break
    raise SystemExit("the ended child was left a zombie")
print("popen", proc.wait(timeout=30))
"""


def test_under_a_pid_namespace_whose_proc_is_the_parents_the_reaping_still_works():
    """`unshare -p` without a /proc of its own (a CI sandbox's): /proc's pids are not this process's, so the
    reaping looks at ended children through waitid instead, and still leaves a Popen's to it."""
    unshare = shutil.which("unshare")
    assert unshare, "util-linux's unshare is needed (the Debian base system has it)"
    script = UNDER_ITS_OWN_PID_NAMESPACE.format(root=str(ROOT))
    out = subprocess.run([unshare, "--user", "--map-root-user", "--pid", "--fork", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["popen", "3"], out.stdout + out.stderr


# A process C below the one that is ended (M): C leaves M's session, starts D in a session of its own, then ends
# its main thread alone while another thread runs on. /proc shows C as a zombie; C and D run.
MAIN_THREAD_ENDS_FIRST = """
import ctypes, os, sys, threading, time
sys.path.insert(0, {root!r})
r, w = os.pipe()
m = os.fork()
if m == 0:
    os.setsid()
    c = os.fork()
    if c == 0:
        os.setsid()
        d = os.fork()
        if d == 0:
            time.sleep(60); os._exit(0)
        os.write(w, f"{{os.getpid()}} {{d}}\\n".encode())
        threading.Thread(target=lambda: time.sleep(60)).start()
        ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: the main thread alone
    time.sleep(60); os._exit(0)
c, d = map(int, os.read(r, 100).split())
while open(f"/proc/{{c}}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.01)
{end}
time.sleep(0.5)
def state(pid):  # "Z": ended, its parent yet to collect it; "Z+threads": its main thread alone ended
    try:
        st = open(f"/proc/{{pid}}/stat").read().rsplit(")", 1)[1].split()[0]
        return st + "+threads" if st == "Z" and len(os.listdir(f"/proc/{{pid}}/task")) > 1 else st
    except OSError:
        return "gone"
print(state(c), state(d))
for pid in (c, d, m):
    try:
        os.kill(pid, 9)
    except OSError:
        pass
"""


def _survivors(end: str) -> list[str]:
    script = MAIN_THREAD_ENDS_FIRST.format(root=str(ROOT), end=textwrap.dedent(end).strip())
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return [s for s in out.stdout.split() if s not in ("gone", "Z")]


def test_the_scorer_kills_a_process_whose_main_thread_ended_first_and_what_it_started():
    """The scoring model process's descendants must all be gone before the check process exists."""
    assert _survivors("""
        from harness.scoring.workers import become_subreaper, kill_tree
        become_subreaper()
        kill_tree(m, m, timeout_s=10)
    """) == [], "a process the model started outlived kill_tree"


def test_the_launchers_teardown_kills_a_process_whose_main_thread_ended_first_and_what_it_started():
    assert _survivors("""
        from harness.launcher.control.process_tree import become_subreaper, terminate_descendants
        become_subreaper()
        terminate_descendants(grace_s=0.5)
    """) == [], "a process of the job outlived the teardown"


def test_a_process_whose_main_thread_ended_first_is_not_taken_for_one_that_is_dying():
    """kill_tree gives a process that is only dying (a GPU context torn down) 120 s more; one whose main thread
    exited while another runs on carries the exit flag too, and is not dying until its threads are told to die."""
    from harness.scoring.workers import _dying

    pid = os.fork()
    if pid == 0:
        import ctypes
        import threading

        threading.Thread(target=lambda: time.sleep(60)).start()
        ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: the main thread alone
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(f"/proc/{pid}/task")) != 2 or \
                open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "its main thread never ended"
            time.sleep(0.01)
        assert not _dying(pid), "a process that runs on was taken for one that is dying"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_what_the_caller_names_as_no_popens_is_reaped_without_the_walk_over_every_object(monkeypatch):
    """The scorer's kill_tree names what it found below its model process: reaped at once, with no walk over the
    heap (tens of ms with torch loaded, twice in every evaluation)."""
    from harness.ranks import process

    def no_walk():
        raise AssertionError("walked the heap for a zombie the caller named")

    monkeypatch.setattr(process, "_live_popens", no_walk)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _until_ended(pid)
    reap_children(unclaimed={pid})
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
