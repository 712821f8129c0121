"""Who may change records and derived files, and when: three file locks.

- `TrackLock`: flock on runs/<track>/.records.lock, held shared by a run's guard while its
  ranks train, and exclusively by `harness flag` / `harness unflag` to change a finished record
  (so an organiser's flag is never taken for tampering).
- `leaderboard_lock`: rebuilds of a leaderboard folder are serialised, so two runs finishing at
  once leave a consistent leaderboard.
- `RunLock`: flock on <run_dir>/.launcher.lock, held by node 0's launcher from its run directory to
  its final record. The kernel drops it when the launcher's process ends, however it ends (SIGKILL
  included). A free lock proves the launcher gone on the launcher's own machine only: on a shared
  file system flock may be local to each client (NFS `local_lock`, Lustre `localflock`), or held
  by a lost client until it reboots (NFSv3); launcher/event/finalize.py decides with that in mind.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time
from contextlib import contextmanager
from pathlib import Path


def _lock_path(track_dir: Path) -> Path:
    return track_dir / ".records.lock"


def open_lock_file(path: Path):
    """The lock file, opened without following a link or blocking on a FIFO: a lock file is the harness's
    own, so anything else standing there (a team that ran without the sandbox could plant it) is removed
    and a regular file made in its place."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for _attempt in range(2):
        try:
            fd = os.open(path, flags, 0o666)
        except OSError:  # a link (ELOOP), a FIFO without a reader (ENXIO), a folder (EISDIR)
            fd = None
        if fd is not None and stat.S_ISREG(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            return os.fdopen(fd, "r+")
        if fd is not None:
            os.close(fd)
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    raise OSError(f"{path}: not a regular file, and it could not be replaced by one")


# What flock raises where a file system has no locks (Lustre without `-o flock`, NFS mounted `nolock`):
# the harness then runs without the lock and says so, rather than crashing every run at training start.
NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


def no_locks_here(exc: OSError) -> bool:
    return not isinstance(exc, BlockingIOError) and exc.errno in NO_LOCKS


class TrackLock:
    """flock on runs/<track>/.records.lock: shared while ranks run, exclusive to change a finished record.
    Where the file system has no locks, it is held by nobody: `unavailable` says why (the caller tells)."""

    def __init__(self, track_dir: Path, exclusive: bool, timeout_s: float | None = None):
        self.path, self.exclusive, self.timeout_s = _lock_path(track_dir), exclusive, timeout_s
        self.fh = None
        self.unavailable = ""

    def __enter__(self) -> "TrackLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open_lock_file(self.path)
        mode = fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            try:
                fcntl.flock(self.fh, mode | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if deadline is not None and time.monotonic() > deadline:
                    self.fh.close()
                    raise TimeoutError(f"{self.path} is held: a run is training on this track") from None
                time.sleep(0.2)
            except OSError as exc:
                if not no_locks_here(exc):
                    raise
                self.unavailable = f"{self.path}: the file system has no locks ({os.strerror(exc.errno)})"
                return self

    def __exit__(self, *exc) -> None:
        if not self.unavailable:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


@contextmanager
def leaderboard_lock(directory: Path):
    """Rebuilds of one leaderboard folder, one at a time (where the file system has locks: without them,
    two rebuilds at once may interleave, and the next rebuild makes the folder the records' again)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open_lock_file(directory / ".lock") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError as exc:
            if not no_locks_here(exc):
                raise
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


RUN_LOCK = ".launcher.lock"


class RunLock:
    """Held by node 0's launcher for its run's life (never waited for: a run directory is one launcher's)."""

    def __init__(self, run_dir: Path):
        self.fh = open_lock_file(Path(run_dir) / RUN_LOCK)
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.fh.close()
            raise

    def release(self) -> None:
        if not self.fh.closed:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()


def launcher_alive(run_dir: Path) -> bool | None:
    """Whether the launcher that wrote the run's record is still running: True while it holds its RunLock,
    False when the lock is free (it ended, or died), None when the run has no lock file (a record written
    before the lock existed: not known) or the file system cannot tell (flock unsupported)."""
    path = Path(run_dir) / RUN_LOCK
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    except OSError:  # ENOLCK, ENOSYS: a shared file system without locks
        return None
    finally:
        os.close(fd)
