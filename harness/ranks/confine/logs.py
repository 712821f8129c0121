"""The log files of the check and model processes: the cap on what such a process writes, and what is undone on its log
once it is gone (modes, extended attributes), with evaluation's live logs moved beside the others. Training ranks are
sandboxed too, but neither capped nor reset here (their logs are the launcher's: harness/launcher/control/workarea.py).

Which process runs what: `cap_file_size` runs in the sandboxed process itself, as it enters its sandbox
(sandbox.enter); `reset_log` in the launcher (the check's log, check_process.py) or the scorer (its model processes'
logs, harness/scoring/workers.py); `settle_logs` in the launcher, after evaluation (phases.py).
"""

from __future__ import annotations

import os
from pathlib import Path

LIVE_LOGS = ".live"  # where evaluation's model processes write their logs while they run (workers.py)
FILE_CAP_BYTES = 64 << 20  # the largest file a check or model process may write (its log is one)


def cap_file_size(limit_bytes: int) -> None:
    """RLIMIT_FSIZE, soft and hard: a write past it fails (EFBIG, "File too large": Python ignores the
    SIGXFSZ that would otherwise kill the process). Lowered for good (the process has no capability to
    raise it back), and inherited by whatever it starts."""
    import resource

    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        limit = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    except (ValueError, OSError):
        pass


def reset_log(path: str | Path) -> None:
    """Undo what a sandboxed process can do to the log file it was handed as stdout: no sandbox governs
    fchmod or fsetxattr on a descriptor it already holds (a setuid bit, mode 000, extended attributes).
    Called once the process is gone; its content stays as written. Read and write bits stay within
    0644 and the owner keeps read-write; nothing else survives."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except PermissionError:  # mode 000, set through its descriptor: not readable by its owner, whose it still is
        if not _owner_may_read(path):
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return
        os.fchmod(fd, (stat.S_IMODE(st.st_mode) & 0o644) | 0o600)
        for name in os.listxattr(fd):
            # its own attributes, and an access ACL (which could give another local user the right to read it)
            if name.startswith("user.") or name == "system.posix_acl_access":
                os.removexattr(fd, name)
    except OSError:
        pass
    finally:
        os.close(fd)


def _owner_may_read(path: str | Path) -> bool:
    """Gives a regular file's owner read-write again, through a descriptor that needs no right to the file
    (O_PATH, no link followed: chmod of its /proc/self/fd entry); False where that cannot be done (no O_PATH)."""
    import stat

    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except AttributeError:  # no O_PATH (macOS): its chmod does not follow a link
        try:
            os.chmod(path, 0o600, follow_symlinks=False)
            return True
        except (OSError, NotImplementedError):
            return False
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.chmod(f"/proc/self/fd/{fd}", 0o600)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def settle_logs(logs_dir: str | Path) -> None:
    """After evaluation, whatever happened to the scorer: the live logs of its model processes (left
    under their random names when it was killed) are reset and join the other logs."""
    live = Path(logs_dir) / LIVE_LOGS
    if not live.is_dir() or live.is_symlink():
        return
    for entry in list(live.iterdir()):
        reset_log(entry)
        if entry.is_file() and not entry.is_symlink():
            try:
                os.replace(entry, live.parent / entry.name)
            except OSError:
                pass
    try:
        live.rmdir()
    except OSError:
        pass
