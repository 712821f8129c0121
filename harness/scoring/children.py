"""What the scorer and the model-process template share about the processes they start: a process's state in
/proc, every live process below one, the failure a model process maps to, and the removal of a folder team code
wrote in. Below both (workers.py, template.py): neither imports the other to share it."""

from __future__ import annotations

import os
from pathlib import Path

from harness.ranks.confine import scratch
from harness.ranks.process import thread_group_lives


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, session id) from /proc/<pid>/stat, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[3])


def runs(pid: int, state: str) -> bool:
    """Not ended, by its state in /proc: a zombie whose other threads still run is running (thread_group_lives)."""
    return state not in ("Z", "X") or (state == "Z" and thread_group_lives(pid))


def descendants(root: int) -> dict[int, int]:
    """Every live process below `root` (not a zombie, unless its other threads run on: `runs`), found by parent pid in
    /proc: {pid: parent pid}."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _proc_stat(int(d))
            if st and runs(int(d), st[0]):
                children.setdefault(st[1], []).append(int(d))
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        parent = todo.pop()
        for c in children.get(parent, []):
            if c not in found:
                found[c] = parent
                todo.append(c)
    return found


class WorkerFailed(RuntimeError):
    """The model process failed; `harness_status` is the status its failure maps to."""

    def __init__(self, status: str, reason: str, traceback: str = ""):
        super().__init__(reason)
        self.harness_status, self.worker_traceback = status, traceback


def remove_tree(folder: Path) -> None:
    """Remove the model process's folder whatever it made there (harness/ranks/confine/scratch.py remove_tree: never
    recursive, rights given back to a folder that took its own away)."""
    scratch.remove_tree(folder)
