"""A second core for a board's rebuild: a fork of this process does half of a job where that is safe.

A cold rebuild at event size is two jobs of about a second each on one core: parsing every run.json
(leaderboard.load_rows) and drawing the charts (charts/parallel.py). Both share nothing but their inputs, which a
fork holds already. A fork is made only from a process with no other thread (a lock another thread held at the
fork would stay held in the copy for ever: a watcher, the launcher during a run and pytest-xdist's workers do their
work in one process, as before). The copy never outlives the process that made it, leaves with `os._exit` (never
returning into the caller's code), and whatever it did not finish, whatever the cause, is done again here: the
result is the same, and an error is raised where it always was, with its traceback.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence, TypeVar

FORK_WAIT_S = 120.0  # a copy slower than this is stuck, not busy: this process does its share itself
PR_SET_PDEATHSIG, PR_GET_DUMPABLE, PR_SET_DUMPABLE = 1, 3, 4
T = TypeVar("T")


def may_fork() -> bool:
    """A fork is safe here: Linux (macOS forbids much of what a fork after numpy would use), one Python thread,
    and a second CPU this process may run on to give the copy."""
    return sys.platform.startswith("linux") and threading.active_count() == 1 and len(os.sched_getaffinity(0)) >= 2


def die_with_parent(parent: int) -> bool:
    """In the copy: ask to be killed when the process that made it ends (it would write an older chart over a newer,
    or hold a core for nothing). False when that process has ended already."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above
        return False
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends the copy with its parent, without a traceback
    return True


def reap(pid: int, wait_s: float) -> bool:
    """True when the copy ended by itself with success; a copy past `wait_s` is killed (and False). Interrupted
    (a Ctrl-C while it waits), it kills and reaps the copy before the interruption goes on: no zombie is left."""
    end = time.monotonic() + wait_s
    delay = 0.002
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status) == 0
            if time.monotonic() > end:
                end_copy(pid)
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    except BaseException:
        end_copy(pid)
        raise


def end_copy(pid: int) -> None:
    """Kills the copy and reaps it (where this process's own share failed, its copy's is not waited for)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # reaped already
        pass


def map_in_two(items: Sequence[T], fn: Callable[[T], Any], *, min_items: int = 1000, fork: bool | None = None,
               meanwhile: Callable[[], Any] | None = None) -> list[Any]:
    """[fn(x) for x in items], the second half computed by a fork where that is safe (`fork`: None decides by
    may_fork()) and there are at least `min_items` (below that a fork costs more than it saves). Each fn(x) must
    be a JSON value that survives the way back unchanged (lists, not tuples; str keys): the copy's results come
    back as stdlib JSON through an anonymous file, and are used only when the copy ended with success and gave one
    result per item; else this process computes that half itself. `meanwhile`: work this process does before its
    own half (its caller's next import, say), which its copy's extra cost, sending its results back, leaves room
    for; done once, fork or not. An error in this process's own half is raised at once, its copy ended."""
    def alone() -> list[Any]:
        if meanwhile is not None:
            meanwhile()
        return [fn(x) for x in items]

    if len(items) < min_items or not (may_fork() if fork is None else fork):
        return alone()
    half = len(items) // 2
    mine, theirs = items[:half], items[half:]
    with undumpable():  # no other process of this user may open the anonymous file through /proc and rewrite it
        try:
            out = os.memfd_create("harness-half", os.MFD_CLOEXEC)
        except (OSError, AttributeError):  # no memfd (an old kernel, a seccomp filter): one process does it all
            return alone()
        try:
            parent = os.getpid()
            try:
                pid = os.fork()
            except OSError:  # no memory or no process left for a copy
                return alone()
            if pid == 0:  # the copy: its share, written whole, and never a return into the caller's code
                _copy_share(parent, out, fn, theirs)
            try:
                if meanwhile is not None:
                    meanwhile()
                first = [fn(x) for x in mine]
            except BaseException:  # this process's error is raised at once, not after the copy's share
                end_copy(pid)
                raise
            second = _results(out, len(theirs)) if reap(pid, FORK_WAIT_S) else None
        finally:
            os.close(out)
    if second is None:
        second = [fn(x) for x in theirs]
    return first + second


def _copy_share(parent: int, out: int, fn: Callable[[Any], Any], items: Sequence[Any]) -> None:
    """In the copy: its results, as UTF-8 JSON (a lone surrogate kept), into the anonymous file; then os._exit."""
    code = 1
    try:
        if die_with_parent(parent):
            data = json.dumps([fn(x) for x in items], ensure_ascii=False, separators=(",", ":"))
            view = memoryview(data.encode("utf-8", "surrogatepass"))  # escaped ASCII would be 3x the size
            while view:
                view = view[os.write(out, view):]
            code = 0
    except BaseException:  # noqa: BLE001  (the parent does the share again, and raises its error)
        pass
    os._exit(code)


def _results(fd: int, count: int) -> list | None:
    """The copy's results from its anonymous file: a JSON list of `count` values, else None."""
    with os.fdopen(os.dup(fd), "rb") as fh:
        fh.seek(0)
        try:
            values = json.loads(fh.read().decode("utf-8", "surrogatepass"))
        except ValueError:  # UnicodeDecodeError included
            return None
    return values if isinstance(values, list) and len(values) == count else None


@contextmanager
def undumpable() -> Iterator[None]:
    """This process is not dumpable while the block runs (a process of the same user can then neither open its
    files through /proc/<pid>/fd nor read its memory), and as it was after: a board's process, not a launcher's."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        was = libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
        changed = was == 1 and libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: no /proc to guard
        libc, changed = None, False
    try:
        yield
    finally:
        if changed:
            libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
