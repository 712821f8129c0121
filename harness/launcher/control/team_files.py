"""Reading what team code wrote, in the launcher: a file copied, a log's tail, a folder measured, logs cut to a
budget. Never through a link (each name is opened with O_NOFOLLOW relative to a folder's descriptor), never a FIFO
or a device, never more bytes than a file held when it was opened or than a budget allows, and never recursive
(a team's thousand-folder chain once made a walk raise RecursionError). Used on the ranks' private folder
(workarea.py), the record's logs and torch elastic's per-rank files.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.results.records import atomic_path


def copy_regular_file(name: str, dest: Path, dir_fd: int, max_bytes: int | None = None) -> bool:
    """Copy `name` (in the folder open as dir_fd) if it is a regular file, opened without following a
    link (O_NOFOLLOW); False if it is anything else (a link, a FIFO, a device) or gone. With max_bytes,
    only that much is copied (the rest of a log past its cap), and the copy says so at its end. `dest` is
    written beside and renamed into place: whatever stood there (a link, a FIFO) is replaced, never
    followed or opened."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device: never read
            return False
        # Never more than the file held when it was opened: a file a process still writes (a sparse one
        # grown to a terabyte while this reads) would otherwise be copied until the records' disk is full.
        left = st.st_size if max_bytes is None else min(st.st_size, max_bytes)
        with atomic_path(dest) as (out_fd, _), os.fdopen(out_fd, "wb") as out:
            while left > 0 and (chunk := fh.read(min(1 << 20, left))):
                out.write(chunk)
                left -= len(chunk)
            if max_bytes is not None and st.st_size > max_bytes:
                out.write(f"\n[harness] cut here: {st.st_size} bytes in all, past the cap of {max_bytes}\n".encode())
    return True


def regular_size(name: str, dir_fd: int) -> int | None:
    """The size of a regular file in the folder open as dir_fd, not following a link; None for anything else."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def fair_shares(sizes: dict[str, int], budget_bytes: int | None) -> dict[str, int | None]:
    """How much of each file to copy within one budget for all: the smallest whole first, and what a small file
    leaves goes to the larger ones (max-min fair), so one flooded log never crowds out the others. None: no
    budget, all of each."""
    if budget_bytes is None:
        return {name: None for name in sizes}
    shares: dict[str, int | None] = {}
    left = max(0, int(budget_bytes))
    order = sorted(sizes, key=lambda n: sizes[n])
    for i, name in enumerate(order):
        shares[name] = min(sizes[name], left // (len(order) - i))
        left -= shares[name]
    return {name: shares[name] for name in sizes}


def trim_logs(folder: Path, budget_bytes: int) -> list[str]:
    """Every log of a run's record (its logs/ and the harness's folders one level below it: eval-node<N>, rescore)
    held to one budget for all: each regular file cut to its fair share (fair_shares), with a line that says so.
    Evaluation's and the check's processes write their logs there themselves, each bounded alone (RLIMIT_FSIZE):
    together they are bounded here. Never follows a link. Returns the names of the files it cut."""
    found: dict[str, int] = {}
    try:
        tops = list(os.scandir(folder))
    except OSError:
        return []
    for entry in tops:
        try:
            if entry.is_file(follow_symlinks=False):
                found[entry.name] = entry.stat(follow_symlinks=False).st_size
            elif entry.is_dir(follow_symlinks=False):
                for inner in os.scandir(entry.path):
                    if inner.is_file(follow_symlinks=False):
                        found[f"{entry.name}/{inner.name}"] = inner.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    cut = []
    for name, share in fair_shares(found, budget_bytes).items():
        if share is None or share >= found[name]:
            continue
        try:
            fd = os.open(folder / name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, share)
                os.lseek(fd, 0, os.SEEK_END)
                os.write(fd, f"\n[harness] cut here: {found[name]} bytes in all, past this log's share of the run's "
                             f"log budget\n".encode())
                cut.append(name)
        finally:
            os.close(fd)
    return cut


def read_tail(path: str | Path, max_bytes: int = 64 << 10, dir_fd: int | None = None) -> str:
    """The last `max_bytes` of a log team code could have written: its folder and the file are opened
    without following a link, only a regular file is read, and never more than that; "" otherwise. With
    dir_fd, `path` is a name in the folder open as dir_fd."""
    path = Path(path)
    if dir_fd is None:
        try:
            folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            return ""
    else:
        folder = dir_fd
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return ""
    finally:
        if dir_fd is None:
            os.close(folder)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        os.lseek(fd, max(0, st.st_size - max_bytes), os.SEEK_SET)
        return os.read(fd, max_bytes).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


class Unmeasurable(OSError):
    """A folder of the team's that the launcher cannot list (it took its own rights away: mode 0300 hides what
    it holds from a harness that does not run as root): what cannot be measured is not under the cap."""


def tree_usage(dir_fd: int, max_entries: int | None = None) -> tuple[int, int, int]:
    """(apparent bytes of regular files, bytes on disk, entries) under the folder open as dir_fd, without
    following a link: a log is capped by what it would copy into the record, the folder by what it holds
    on disk and by its number of entries (empty files fill a file system's inodes). Stops counting past
    max_entries. Never recursive and at most two folders open at once, whatever the depth (a chain of a
    thousand folders broke os.fwalk with RecursionError, and the cap went unchecked); raises Unmeasurable for
    a subfolder it cannot list (the caller ends the run: never a cap passed by hiding)."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    apparent = on_disk = entries = 0
    fd = os.dup(dir_fd)
    levels: list[tuple[str, list[str]]] = []

    def scan(fd: int, where: str) -> list[str]:
        nonlocal apparent, on_disk, entries
        try:
            with os.scandir(fd) as it:
                found = list(it)
        except PermissionError as exc:
            raise Unmeasurable(f"{where or '.'}: {exc.strerror}") from None
        except OSError:
            return []
        subs = []
        entries += len(found)
        for e in found:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                subs.append(e.name)
            elif stat.S_ISREG(st.st_mode):
                apparent += st.st_size
            on_disk += st.st_blocks * 512
        return subs

    try:
        levels.append(("", scan(fd, "")))
        while levels and (max_entries is None or entries <= max_entries):
            name, pending = levels[-1]
            if pending:
                sub = pending.pop()
                try:
                    child = os.open(sub, flags, dir_fd=fd)
                except PermissionError as exc:
                    raise Unmeasurable(f"{'/'.join([n for n, _ in levels[1:]] + [sub])}: {exc.strerror}") from None
                except OSError:  # gone meanwhile, or replaced by a link: nothing of it is counted here
                    continue
                os.close(fd)
                fd = child
                levels.append((sub, scan(fd, "/".join([n for n, _ in levels[1:]] + [sub]))))
                continue
            levels.pop()
            if levels:
                parent = os.open("..", flags, dir_fd=fd)
                os.close(fd)
                fd = parent
    finally:
        os.close(fd)
    return apparent, on_disk, entries
