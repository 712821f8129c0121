"""Process hygiene for the launcher: no process of a job may outlive it.

torch elastic starts each rank in its own session, so signals to our process group never reach
them, and SIGKILL to the agent would orphan them. The launcher therefore makes itself a child
subreaper (Linux): every process a rank starts, even a double-forked daemon, stays a descendant of
the launcher and is found and killed here. Elsewhere, the direct descendants are still found.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable

import psutil

from harness.ranks.process import listed_children, thread_group_lives

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux only); returns whether it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


PR_SET_DUMPABLE = 4


def make_undumpable() -> bool:
    """No process of the same user may read this one's memory, environment (/proc/<pid>/environ holds
    the environment the launcher started with: an organiser's tokens), open files or root through /proc,
    nor attach to it. Children get their own setting back when they exec. Returns whether it worked."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descends_from(pid: int, ancestor: int) -> bool | None:
    """Whether the live process `pid` descends from `ancestor`; None when it has already exited (it
    cannot be checked any more), False when it cannot be checked while alive."""
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.NoSuchProcess:
        return None
    except (psutil.Error, OSError):
        return False


def first_line(proc, within_s: float) -> str | None:
    """The first line a helper process of the harness prints on its stdout pipe (how it says it is ready, or
    why not), at most 500 characters; None when it printed nothing within within_s."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(within_s):
            return None
    return proc.stdout.readline().decode(errors="replace").strip()[:500]


def descendants() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _alive(proc: psutil.Process) -> bool:
    """Running, or a zombie whose other threads run on (its main thread exited first): that one runs code too."""
    try:
        return proc.is_running() and (proc.status() != psutil.STATUS_ZOMBIE or thread_group_lives(proc.pid))
    except psutil.Error:
        return False


def identity(proc: psutil.Process | int) -> tuple[int, int] | None:
    """A process as the kernel tells it apart over time: its pid and its start time, in clock ticks since boot. A pid
    alone is reused: team code can cycle the pid counter until it takes the pid of a process that has ended (the
    check's, say), and a list of pids to spare would then spare it. Ticks since boot, not psutil's create_time():
    that adds the boot time as the wall clock sees it now, which a clock step (NTP, a VM resumed) moves."""
    pid = proc.pid if isinstance(proc, psutil.Process) else int(proc)
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return pid, int(fields[19])  # field 22, starttime
    except (OSError, IndexError, ValueError):  # gone (or no /proc): it can be told apart from nothing
        return None


def terminate_descendants(grace_s: float, exclude: set[tuple[int, int]] | None = None,
                          spare: Callable[[], set] | None = None) -> list[int]:
    """SIGTERM every descendant but those `exclude` names (identity()) and those `spare()` names, asked again at
    each look (what an owned tree starts meanwhile stays its own), SIGKILL what is left after grace_s; returns every
    pid it ended.

    Zombies are not reaped here (a Popen in torch elastic may still want their exit status);
    `harness.ranks.process.reap_children` does that once the agent is done.
    """
    exclude = exclude or set()

    def ending() -> list[psutil.Process]:
        listed = descendants()  # first: what an owned tree started before the list is in spare()'s answer
        keep = exclude | (spare() if spare is not None else set())
        return [p for p in listed if identity(p) not in keep]

    procs = [p for p in ending() if _alive(p)]
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in procs):
        time.sleep(0.05)
    killed = []
    # Look again: a process may have forked while being told to stop.
    for p in ending() + procs:
        if _alive(p):
            try:
                p.kill()
                killed.append(p.pid)
            except psutil.Error:
                pass
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(p) for p in procs):
        time.sleep(0.05)
    return sorted({p.pid for p in procs} | set(killed))


# Processes that one scope owns while others are open beside it: pid -> (its identity, the owning scope). The check
# process is made before the training job that starts beside it (harness/launcher/run/check_process.py): the job's
# scope must never end the check's tree, whichever of the two the kernel lists first.
_OWNED: dict[int, tuple] = {}
_OWNED_LOCK = threading.Lock()


def _tree(pid: int) -> set[tuple[int, int]]:
    """The identities of `pid` and its descendants; empty where it is gone."""
    try:
        root = psutil.Process(pid)
        return {identity(p) for p in [root, *root.children(recursive=True)]} - {None}
    except psutil.Error:  # gone: nothing of it left to spare
        return set()


def _owned_by_others(scope: "ProcessScope") -> set[tuple[int, int]]:
    """The trees other scopes own, each only while its root is the process that was owned (not a pid reused)."""
    with _OWNED_LOCK:
        roots = [(pid, ident) for pid, (ident, owner) in _OWNED.items() if owner is not scope]
    spared: set = set()
    for pid, ident in roots:
        if ident is not None and identity(pid) == ident:
            spared |= _tree(pid)
    return spared


class ProcessScope:
    """Everything started inside the scope is ended when it closes (`killed` lists what had to be).

    With `contain` (a label), the scope also makes a cgroup of its own (job_cgroup.JobCgroup): processes started
    with `env()` join it first thing, and close() ends everything in it at once, after the graceful SIGTERM round:
    what forks faster than the process list can be read is ended all the same. `caps` (job_limits.Caps): the
    memory and tasks its processes may hold together."""

    def __init__(self, grace_s: float, contain: str | None = None, caps=None):
        become_subreaper()  # orphans of what starts in the scope stay ours to find (idempotent)
        self.grace_s = grace_s
        self.before = {identity(p) for p in descendants()} - {None}  # identities: a pid alone is reused
        self.killed: list[int] = []
        self.cgroup = None
        if contain is not None:
            from harness.launcher.control.job_cgroup import JobCgroup

            self.cgroup = JobCgroup(contain, caps)

    def env(self) -> dict[str, str]:
        return self.cgroup.env() if self.cgroup is not None else {}

    def containment(self) -> dict:
        """For the record: whether the scope's processes were held in a cgroup, or why not."""
        return self.cgroup.report() if self.cgroup is not None else {"active": False, "why": "not asked for"}

    def rebase(self, keep: int) -> None:
        """The processes started since the scope began are no longer its own, but `keep` and what it started: a
        process held before team code while a job starts beside it (a check, harness/launcher/run/check_process.py),
        whose ranks must outlive its scope. The cgroup, where there is one, holds `keep`'s processes exactly."""
        self.before = {identity(p) for p in descendants()} - {None} - _tree(keep)

    def own(self, pid: int) -> None:
        """`pid` and what it starts are this scope's alone: another scope's close never ends them, this one's does."""
        with _OWNED_LOCK:
            _OWNED[pid] = (identity(pid), self)

    def close(self) -> list[int]:
        try:
            killed = terminate_descendants(self.grace_s, exclude=self.before, spare=lambda: _owned_by_others(self))
            if self.cgroup is not None:
                killed = sorted(set(killed) | set(self.cgroup.close()))
        finally:
            with _OWNED_LOCK:
                for pid in [pid for pid, (_, owner) in _OWNED.items() if owner is self]:
                    del _OWNED[pid]
        self.killed = killed
        return self.killed

    def __enter__(self) -> "ProcessScope":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, not the machine's count. A SLURM step gets only
    the CPUs it asked for (one per task by default, since 20.11), and a container or taskset fewer than
    the machine has: threads sized to os.cpu_count() would then share one core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def _pid_depth(pid: int | str) -> int:
    """How many PID namespaces a process's pid is counted in (its status's NSpid; readable for a zombie too)."""
    with open(f"/proc/{pid}/status", "rb") as status:
        for line in status:
            if line.startswith(b"NSpid:"):
                return len(line.split()) - 1
    return 1  # a kernel before 4.1 says nothing: no deeper namespace can be told apart


def _children() -> set[int]:
    """This process's children (harness/ranks/process.py `listed_children`); where the kernel keeps no list of them
    (CONFIG_PROC_CHILDREN off), from every process's parent pid."""
    listed = listed_children()
    return listed if listed is not None else {p.pid for p in psutil.Process().children()}


def reap_adopted_from_deeper_namespaces() -> int:
    """Collect the exit status of every finished child of this process that lives in a PID namespace below its
    own, and return how many such children are left (alive, or dying). Nothing this process started itself is
    one: the launcher never enters a PID namespace, and the holder's unshare moves only the holder's later
    children, so a deeper child is always a process of a job's PID namespace that this subreaper adopted when its
    parent, outside the namespace, died first (a rank's outer process that ended before the child it forked into
    the namespace), or that namespace's PID 1 once the holder is gone. Until the adopted process is reaped, the
    namespace's PID 1 cannot finish dying (the kernel's zap_pid_ns_processes waits for every pid of the namespace
    to be freed), so whoever waits for PID 1 waits for this process. Exit statuses a Popen of this process or torch
    elastic's agent waits for are never taken."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        mine = _pid_depth("self")
    except OSError:
        return 0
    left = 0
    for pid in _children():
        try:
            if _pid_depth(pid) > mine:
                left += os.waitpid(pid, os.WNOHANG)[0] != pid
        except (OSError, ChildProcessError):  # gone, or reaped by another thread meanwhile
            pass
    return left
