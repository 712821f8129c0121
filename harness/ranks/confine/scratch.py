"""Where the private folders of the processes that run team code are made: the scratch root.

Every process that runs team code works in a private folder of its own (the training ranks', the
check process's, each of evaluation's model processes'): its home, temporary folder and compiler
caches (harness/ranks/confine/sandbox.py `private_environment`). Triton and Inductor build shared objects
there and load them, so the folder's file system must allow executing: on a `noexec` /tmp (common on
hardened clusters) Triton fails with "failed to map segment from shared object". The root is
HARNESS_SCRATCH_DIR where it is set, else tempfile's folder (TMPDIR, else /tmp); `harness check`, every
run, `harness eval` and `harness scale` refuse a root they cannot use (`refuse_unusable`), naming it
and the fix, before anything starts.

The harness's own Unix sockets (the control channel, the job's namespace holder) are not made here:
they stay in tempfile's folder, in folders of mode 0700 outside every folder team code may write, and
short enough for a socket's path. (Keep the scratch root's path short too, under about 45
characters: the ranks' multiprocessing sockets, <root>/harness-train-XXXXXXXX/tmp/pymp-XXXXXXXX/
listener-XXXXXXXX, must fit a socket path's 107 bytes.)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SCRATCH_ENV = "HARNESS_SCRATCH_DIR"
MIN_FREE_INODES = 10_000  # a run's ranks, check and model processes make a few thousand files (compiler caches)


class ScratchError(ValueError):
    """The scratch root cannot hold the private folders (missing, not a folder, or mounted noexec)."""


def scratch_root(value: str | os.PathLike | None = None) -> Path:
    """`value`, else HARNESS_SCRATCH_DIR, else tempfile's folder; absolute, because the folders made under
    it are handed to processes that start elsewhere."""
    chosen = value or os.environ.get(SCRATCH_ENV) or tempfile.gettempdir()
    return Path(chosen).expanduser().absolute()


def mount_flags(path: str | os.PathLike) -> int:
    """The flags of the file system `path` is on (statvfs f_flag: ST_RDONLY, ST_NOEXEC...)."""
    return os.statvfs(path).f_flag


def noexec(path: str | os.PathLike) -> bool:
    """Is `path` on a file system mounted noexec (Linux; never elsewhere, where statvfs does not say)?"""
    return bool(mount_flags(path) & getattr(os, "ST_NOEXEC", 0))


def unusable(root: Path | None = None) -> str:
    """"" when private folders can be made under `root` (default: scratch_root()) and the libraries
    built there loaded; else one sentence naming the folder and the fix."""
    root = root or scratch_root()
    chosen_by = SCRATCH_ENV if os.environ.get(SCRATCH_ENV) else f"tempfile's folder: {SCRATCH_ENV} is not set"
    where = f"the scratch folder {root} ({chosen_by})"
    fix = f"set {SCRATCH_ENV} to a folder on a local file system mounted with exec"
    if not root.is_dir():
        return f"{where} is not a folder. Fix: create it, or {fix}"
    if noexec(root):
        return (f"{where} is on a file system mounted noexec: Triton and Inductor could not load the libraries "
                f"they build there (\"failed to map segment from shared object\"). Fix: {fix}, or remount it "
                "with exec")
    return ""


def short_of_space(need_bytes: int, root: Path | None = None, why: str = "") -> str:
    """"" when the scratch root has `need_bytes` free; else one sentence with the figures, `why` that much is
    needed, and the fix. A root too full for an honest run would end it in ENOSPC, charged to the team: the
    infrastructure's failure, said before any team code runs."""
    root = root or scratch_root()
    try:
        st = os.statvfs(root)
    except OSError as exc:
        return f"the scratch folder {root} cannot be measured ({exc})"
    free = st.f_bavail * st.f_frsize
    if st.f_files and st.f_favail < MIN_FREE_INODES:  # empty files fill a file system too (f_files 0: not counted)
        return (f"the scratch folder {root} has {st.f_favail:,} free inodes (files) left, and a run makes thousands: "
                f"the infrastructure's failure, not the team's. Fix: remove what fills it, or set {SCRATCH_ENV} to "
                "another file system; then run it again")
    if free >= need_bytes:
        return ""
    return (f"the scratch folder {root} has {free / 2**30:.2f} GiB free, and a run needs {need_bytes / 2**30:.2f} GiB "
            f"there{' (' + why + ')' if why else ''}: the infrastructure's failure, not the team's. Fix: free space "
            f"there, or set {SCRATCH_ENV} to a folder with room; then run it again")


def refuse_unusable(root: Path | None = None) -> None:
    """Raise ScratchError with `unusable`'s sentence, if there is one."""
    problem = unusable(root)
    if problem:
        raise ScratchError(problem)


def remove_tree(root: str | os.PathLike) -> bool:
    """Remove a folder team code wrote in, whatever it made there; True when it is gone.

    Never recursive (a chain of 1,000 folders broke shutil.rmtree with RecursionError, and the folder stayed,
    filling the scratch root for the runs after), never by a path longer than one name (a deep chain's path
    passes PATH_MAX), never through a link, at most two folders open at once, and a folder the team took its
    own rights away from (mode 0300: enter and write, not list) is given them back first. Safe only once every
    process of the team is gone: nothing may move the tree meanwhile. What cannot be removed is left, and
    the answer says so."""
    import stat

    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    root = os.fspath(root)
    try:
        fd = os.open(root, flags)
    except FileNotFoundError:
        return True
    except OSError:  # not a folder (a link, a file): remove the name itself
        try:
            os.unlink(root)
        except OSError:
            pass
        return not os.path.lexists(root)
    levels: list[tuple[str, list[str]]] = []  # (this folder's name in its parent, its subfolders still to empty)

    def open_level(fd: int) -> list[str]:
        """Unlink what is not a folder; return the subfolders."""
        try:
            with os.scandir(fd) as it:
                entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
        except OSError:
            return []
        subs = []
        for name, is_dir in entries:
            if is_dir:
                subs.append(name)
                continue
            try:
                os.unlink(name, dir_fd=fd)
            except OSError:
                pass
        return subs

    try:
        try:
            os.fchmod(fd, stat.S_IRWXU)
        except OSError:
            pass
        levels.append(("", open_level(fd)))
        while levels:
            name, pending = levels[-1]
            if pending:
                sub = pending.pop()
                try:
                    os.chmod(sub, stat.S_IRWXU, dir_fd=fd, follow_symlinks=False)
                except (OSError, NotImplementedError):
                    try:  # a folder (scandir said so, and nothing of the team runs to swap it): rights back to list it
                        os.chmod(sub, stat.S_IRWXU, dir_fd=fd)
                    except OSError:
                        pass
                try:
                    child = os.open(sub, flags, dir_fd=fd)
                except OSError:
                    continue
                os.close(fd)
                fd = child
                levels.append((sub, open_level(fd)))
                continue
            levels.pop()
            if not levels:
                break
            parent = os.open("..", flags, dir_fd=fd)
            os.close(fd)
            fd = parent
            try:
                os.rmdir(name, dir_fd=fd)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(root)
    except OSError:
        pass
    return not os.path.lexists(root)


def private_folder(prefix: str, root: str | os.PathLike | None = None) -> Path:
    """A new folder of mode 0700 under `root` (default: scratch_root()): one process's (or one job's)
    private folder."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=scratch_root(root)))
    os.chmod(folder, 0o700)
    return folder
