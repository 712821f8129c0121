"""A team's folder as harness processes read it: regular files only, never through a link.

Everything in a submission folder is the team's: a file may be a symbolic link to where the
validation shard probably is (the cache path follows from the public track file), a FIFO that
blocks whoever opens it, a device that never ends (/dev/zero), or a file that changes while it is
copied. So the launcher never follows, opens or waits on anything of the folder but regular files:

- `walk` lists the folder without following any link (os.fwalk, follow_symlinks=False); a link, a
  FIFO, a socket or a device anywhere in it (outside the ignored caches) is an `UnsafeEntry`
  naming the file: the run is `invalid`, nothing of it is read;
- each regular file is opened with O_NOFOLLOW | O_NONBLOCK relative to its folder's descriptor and
  checked again on the open descriptor (fstat), so a file swapped for a link between the listing and
  the open is refused, not followed;
- reads are bounded: the whole folder by `MAX_SUBMISSION_BYTES`, one text file by what the caller
  asks for.

The snapshot in the run record is made this way, and it is what every later phase imports.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

IGNORED_DIRS = {"__pycache__", ".git", ".ipynb_checkpoints", ".mypy_cache", ".pytest_cache", ".ruff_cache", "wandb",
                "lightning_logs"}  # caches and run logs: never code the run imports
IGNORED_SUFFIXES = (".pyc",)
MAX_SUBMISSION_BYTES = 200 * 1024 * 1024
# Files and folders in a submission: every run copies them into the ranks' folder (a tmpfs of the track's scratch
# cap) before any rank starts, and into its record; a team's hundreds of thousands of empty files slowed that copy
# past its holder's ready time (no namespace for the job) and broke the folder's cap with the copy alone.
MAX_SUBMISSION_ENTRIES = 10_000
CHUNK = 1 << 20


MAX_REL_PATH_BYTES = 512  # a file's path inside a submission: copies of it go under the harness's own folders


class UnsafeEntry(OSError):
    """Something in the folder the harness will not read: `rel` names it, `kind` says what it is."""

    WHY = "the harness copies and imports regular files only, and follows no link out of a submission folder."

    def __init__(self, rel: str, kind: str, fix: str, why: str = WHY):
        self.rel, self.kind, self.fix, self.why = rel, kind, fix, why
        super().__init__(f"{rel}: {kind}")


class TooLarge(OSError):
    def __init__(self, total: int, limit: int):
        self.total, self.limit = total, limit
        super().__init__(f"more than {limit} bytes")


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "not a regular file"


@dataclass(frozen=True)
class Entry:
    rel: str  # path relative to the folder, with "/"
    dir_fd: int  # the open folder it is in (valid during the walk only)
    name: str
    size: int


def walk(folder: str | Path) -> Iterator[Entry]:
    """Every regular file of the folder, in sorted order, without following any link; raises
    UnsafeEntry at the first entry that is not a regular file or a folder, or past MAX_SUBMISSION_ENTRIES."""
    entries, tops = 0, {}  # how many entries under each top-level folder: the error names the largest
    for dirpath, dirnames, filenames, dir_fd in os.fwalk(folder, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, folder)
        prefix = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)  # never opened: not the team's code
        for name in [*dirnames, *sorted(filenames)]:
            if name.endswith(IGNORED_SUFFIXES) and name not in dirnames:
                continue
            entries += 1
            top = (prefix + name).split("/", 1)[0] if prefix else None
            if top is not None:
                tops[top] = tops.get(top, 0) + 1
            if entries > MAX_SUBMISSION_ENTRIES:
                largest = max(tops, key=tops.get) if tops else None
                where = f" ({tops[largest]:,} of them under {largest}/)" if largest else ""
                raise UnsafeEntry(prefix + name, f"past the {MAX_SUBMISSION_ENTRIES:,}th file or folder{where}",
                                  f"keep at most {MAX_SUBMISSION_ENTRIES:,} files and folders in the submission "
                                  "(code and small config files)",
                                  why="every run copies the submission into the ranks' folder and its record.")
            if len((prefix + name).encode(errors="surrogateescape")) > MAX_REL_PATH_BYTES:
                # Whether a copy fits PATH_MAX would depend on where it is copied: a node's copy lies deeper than
                # node 0's, so one node would refuse what another accepts. Refused wherever it is read.
                raise UnsafeEntry((prefix + name)[:120] + "...", f"a path longer than {MAX_REL_PATH_BYTES} bytes",
                                  "shorten the names of its folders and files",
                                  why="the harness copies a submission into folders of its own, whose paths come "
                                      "first, on every node.")
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                continue  # fwalk goes in (its own check refuses a folder swapped for a link meanwhile)
            if not stat.S_ISREG(st.st_mode):
                target = ""
                if stat.S_ISLNK(st.st_mode):
                    try:
                        target = f" to {os.readlink(name, dir_fd=dir_fd)}"
                    except OSError:
                        pass
                raise UnsafeEntry(prefix + name, _kind(st.st_mode) + target,
                                  "put the file itself in the folder (the harness copies regular files only)")
            yield Entry(prefix + name, dir_fd, name, st.st_size)


def open_regular(name: str | Path, dir_fd: int | None = None) -> int:
    """A descriptor of `name` if it is a regular file reached without following a link (the last
    component; callers walk folders with descriptors); raises UnsafeEntry or OSError otherwise."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UnsafeEntry(str(name), _kind(mode), "")
    return fd


def read_regular(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of a regular file (not a link, FIFO or device), at most max_bytes; raises UnsafeEntry
    for anything else, TooLarge past the bound, FileNotFoundError when there is nothing."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise UnsafeEntry(str(path), "a symbolic link", "put the file itself there") from None
        raise
    chunks, total = [], 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(min(CHUNK, max_bytes + 1 - total)):  # never max_bytes allocated up front
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise TooLarge(total, max_bytes)
    return b"".join(chunks)


def copy_tree(folder: str | Path, dest: str | Path, max_bytes: int = MAX_SUBMISSION_BYTES) -> int:
    """Copy every regular file of `folder` into `dest` (created); returns the bytes copied. Raises
    UnsafeEntry (nothing is followed) or TooLarge (the folder holds more than max_bytes)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    for entry in walk(folder):
        fd = open_regular(entry.name, entry.dir_fd)
        target = dest / entry.rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(fd, "rb") as src, open(target, "wb") as out:
            while chunk := src.read(CHUNK):
                total += len(chunk)
                if total > max_bytes:
                    raise TooLarge(total, max_bytes)
                out.write(chunk)
    return total


def tree_sha256(folder: str | Path) -> str:
    """One hash over the folder's regular files: their relative paths and contents, in sorted order
    (what `copy_tree` copies). Raises UnsafeEntry for anything else in it."""
    hashed = []
    for entry in walk(folder):
        inner = hashlib.sha256()
        with os.fdopen(open_regular(entry.name, entry.dir_fd), "rb") as fh:
            while chunk := fh.read(CHUNK):
                inner.update(chunk)
        hashed.append((tuple(entry.rel.split("/")), entry.rel, inner.digest()))
    digest = hashlib.sha256()
    for _parts, rel, inner_digest in sorted(hashed):  # the order of sorted paths: the hash records have always had
        digest.update(os.fsencode(rel) + b"\0")  # a name that is no UTF-8 (surrogate-escaped) hashes as its bytes
        digest.update(inner_digest)
    return digest.hexdigest()


# What serialised tensors start with: torch.save (a zip archive, or a raw pickle in the legacy format), numpy's
# .npy (and .npz, a zip), safetensors (an 8-byte header length, then a JSON header), HDF5 (Keras, h5py).
WEIGHT_MAGIC = ((b"PK\x03\x04", "a zip archive (torch.save, numpy .npz)"), (b"\x80\x02", "a pickle"),
                (b"\x80\x03", "a pickle"), (b"\x80\x04", "a pickle"), (b"\x80\x05", "a pickle"),
                (b"\x93NUMPY", "a numpy array"), (b"\x89HDF", "an HDF5 file"))
BINARY_DATA_BYTES = 1 << 20  # code is text: a binary file this large is data
LARGE_FILE_BYTES = 4 << 20  # nor is code this long: weights can ride as text (base64 in a .py)


def weight_like_files(folder: str | Path) -> list[str]:
    """Files of the folder that hold serialised tensors or a large binary payload, as "name (what, size)":
    weights trained off the clock come this way. Read by their first bytes, never parsed."""
    found = []
    for entry in walk(folder):
        with os.fdopen(open_regular(entry.name, entry.dir_fd), "rb") as fh:
            head = fh.read(4096)
        what = next((w for magic, w in WEIGHT_MAGIC if head.startswith(magic)), None)
        if what is None and len(head) >= 10 and head[8:10] == b'{"':
            what = "a safetensors file"
        if what is None and entry.size >= BINARY_DATA_BYTES and b"\0" in head:
            what = "binary data"  # a compiled extension too: a person looks (a header is easy to forge)
        if what is None and entry.size >= LARGE_FILE_BYTES:
            what = "a large file"
        if what is not None:
            found.append(f"{entry.rel} ({what}, {entry.size / 2**20:.1f} MiB)")
    return found
