"""The training processes' private working folder, and an environment that does not point at results.

The ranks get a folder of their own (mode 0700, outside runs/, under the scratch root of
harness/ranks/confine/scratch.py): a copy of the submission to import, a logs folder and a staging folder
for the checkpoint, and it is their working directory. While they run, the launcher's environment
loses the variables that name the runs, leaderboard, data and cache locations, so the ranks inherit
none of them. Where the job has namespaces of its own, the folder the ranks see is a tmpfs over this one
(harness/launcher/control/job_namespace.py), reached here through one descriptor. After the job the launcher
copies the logs into the record and takes the checkpoint over, reading through
harness/launcher/control/team_files.py, which follows no link.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time
from contextlib import contextmanager
from pathlib import Path

from harness.launcher.control.team_files import copy_regular_file, fair_shares, read_tail, regular_size, tree_usage
from harness.ranks.confine import sandbox, scratch
from harness.submission.contract import PACKAGE_DIR_ENV


@contextmanager
def patched_environ(set_vars: dict[str, str] | None = None, unset: tuple[str, ...] = ()):
    """Set and remove environment variables for a while (children inherit it), then put them back."""
    keys = [*(set_vars or {}), *unset]
    saved = {k: os.environ.get(k) for k in keys}
    for key in unset:
        os.environ.pop(key, None)
    os.environ.update(set_vars or {})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


MAX_ENTRIES = 1_000_000  # files and folders in the ranks' private folder: a compiler's cache is thousands
HIDDEN_ENV = ("HARNESS_RUNS_DIR", "HARNESS_LEADERBOARD_DIR", "HARNESS_PLOTS_DIR", "HARNESS_DATA_ROOT",
              "HARNESS_CACHE_DIR")


class WorkArea:
    def __init__(self, snapshot: Path):
        self.dir = scratch.private_folder("harness-train-")  # under HARNESS_SCRATCH_DIR, else tempfile's folder
        self.submission = self.dir / "submission"
        self.logs = self.dir / "logs"
        self.staging = self.dir / "staging"
        self.named_logs: list[str] = []  # the logs the record takes (link_logs)
        self.own_logs: list[str] = []  # the launcher's own, in self.own
        # The launcher's own logs (torch elastic's agent): on the scratch root's local disk, beside the ranks' folder
        # and never in it (a rank could append to a log the record says is the harness's)
        self.own = scratch.private_folder("harness-launcher-")
        shutil.copytree(snapshot, self.submission)
        self.logs.mkdir()
        self.staging.mkdir()
        # Opened now, before any rank exists: the folder itself cannot be swapped for a link later (the
        # ranks may write inside it, not in /tmp), and everything taken back is reached through this fd,
        # one component at a time, never following a link the ranks left (`logs` or `staging` included).
        self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        self.live_dir = self.dir  # where this process reaches the folder the ranks write by name (enter_job_folder)
        # staging/ itself, held before any rank exists: the open division's file is watched and taken there, however
        # the ranks rename folders (one renamed its staging away while it wrote its checkpoint unseen, then back)
        self._staging_fd = self._subfolder_fd("staging")

    def enter_job_folder(self, dir_fd: int, live_dir: Path) -> None:
        """The ranks' folder is a file system of the job's own (harness/launcher/control/job_namespace.py: a tmpfs
        over self.dir, seen only in the job's mount namespace): everything taken back is reached through dir_fd
        (opened before any rank existed; this area closes it), and by name, while the job lives, at live_dir (its
        holder's root). self.dir stays the ranks' name for it, and the disk folder beneath is removed at cleanup."""
        os.close(self._dir_fd)
        self._dir_fd, self.live_dir = dir_fd, live_dir
        self._hold_staging()

    def _hold_staging(self) -> None:
        if self._staging_fd is not None:
            os.close(self._staging_fd)
        self._staging_fd = self._subfolder_fd("staging")

    def _staging(self, held: bool) -> int | None:
        """A descriptor of staging/ for the caller to close: the one held since before the ranks started (`held`),
        else the folder the name leads to now."""
        if not held:
            return self._subfolder_fd("staging")
        return os.dup(self._staging_fd) if self._staging_fd is not None else None

    def live(self, path: Path) -> Path:
        """Where this process reaches a path of the ranks' folder by name (a log the record links to while the job
        runs)."""
        return self.live_dir / Path(path).relative_to(self.dir)

    def hidden_environment(self):
        return patched_environ(unset=HIDDEN_ENV)

    def rank_environment(self) -> dict[str, str]:
        """Home, temporary folder and compiler caches of the ranks: all inside the private folder."""
        tmp = self.dir / "tmp"
        tmp.mkdir(exist_ok=True)
        return {"HOME": str(self.dir), "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(self.dir / "inductor"),
                "TRITON_CACHE_DIR": str(self.dir / "triton"), "CUDA_CACHE_PATH": str(self.dir / "cuda"),
                # set from the start, before NCCL's threads read the environment (contract.import_submission_module)
                PACKAGE_DIR_ENV: str(self.submission.resolve())}

    def sandbox_policy(self, train_files: list[str], gpu: bool, protected: list[str] = ()) -> sandbox.Policy:
        """The training ranks may read the train shards one by one, never the folder they sit in."""
        return sandbox.build_policy(submission_dir=str(self.submission), private_dir=str(self.dir),
                                    read_files=train_files, gpu=gpu, training=True, protected=protected)

    def link_logs(self, dest: Path, names: list[str], own: list[str] = ()) -> None:
        """Live logs in the record while the job runs: links into the private folder (the ranks see no path), and
        to the launcher's `own` logs in self.own. These are the logs the record takes after the job (collect_logs)."""
        self.named_logs, self.own_logs = list(names), list(own)
        dest.mkdir(parents=True, exist_ok=True)
        for name, target in [*((n, self.live(self.logs / n)) for n in names), *((n, self.own / n) for n in own)]:
            link = dest / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(target)

    def same_disk(self, path: Path) -> bool:
        """Whether `path` (a folder of the records) is on the file system the ranks' private folder is on: a disk
        the team's processes can fill."""
        try:
            return os.stat(path).st_dev == os.fstat(self._dir_fd).st_dev
        except OSError:
            return False

    def _subfolder_fd(self, name: str) -> int | None:
        try:
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=self._dir_fd)
        except OSError:  # replaced by a link or a file, or removed
            return None

    def usage(self, max_entries: int | None = None) -> tuple[int, int, int]:
        """(bytes of the logs, bytes the whole private folder holds on disk, its entries): what the track's
        caps bound. On a file system of the job's own (enter_job_folder), the file system's own count of its blocks
        and files: files without a name (O_TMPFILE, deleted but open) too, and a file of several names once."""
        logs = self._subfolder_fd("logs")
        try:
            log_bytes = tree_usage(logs)[0] if logs is not None else 0
        finally:
            if logs is not None:
                os.close(logs)
        if self.live_dir != self.dir:  # a file system of the job's own: what it holds, named or not (a hard link once)
            st = os.fstatvfs(self._dir_fd)
            return log_bytes, (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_files - st.f_ffree - 1  # the root: no entry
        _, disk, entries = tree_usage(self._dir_fd, max_entries)
        return log_bytes, disk, entries

    def log_tail(self, name: str, max_bytes: int = 64 << 10) -> str:
        """The end of a log the ranks wrote at the top of logs/, read through this area's descriptor (read_tail's
        rules: no link followed, a regular file only)."""
        logs = self._subfolder_fd("logs")
        if logs is None:
            return ""
        try:
            return read_tail(name, max_bytes, dir_fd=logs)
        finally:
            os.close(logs)

    def release_job_folder(self) -> None:
        """Let the job's file system go (its pages are memory, up to scratch_cap_gib) once the logs and the checkpoint
        are taken: before evaluation, or another node's part of it, runs beside it. What is taken after this finds
        the launcher's empty folder."""
        if self.live_dir != self.dir:
            os.close(self._dir_fd)
            self._dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            self.live_dir = self.dir
            self._hold_staging()

    def page_bytes(self) -> int:
        """What the launcher's own tree in the folder (the submission's copy, the open division's data links; before
        any rank exists) takes in a tmpfs: every file and link in whole pages, whatever a disk's blocks say (a file
        of a few bytes may take no block on btrfs, and a page of memory there)."""
        page, total = os.sysconf("SC_PAGE_SIZE"), 0
        for folder, dirs, files in os.walk(self.dir, followlinks=False):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
                st = os.lstat(os.path.join(folder, name))
                total += page if stat.S_ISLNK(st.st_mode) else -(-st.st_size // page) * page
        return total

    def free_bytes(self) -> int | None:
        """What the ranks' folder's file system has left for them; None where it cannot be read."""
        try:
            st = os.fstatvfs(self._dir_fd)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def collect_logs(self, dest: Path, budget_bytes: int | None = None, names: list[str] | None = None) -> list[str]:
        """The logs the harness names (`names`, else those given to link_logs: the node's ranks', at the top of logs/,
        and the launcher's own, in self.own) become plain files of the record, within one budget for all of them (links replaced by copies). Only regular files are
        copied, reached without following any link: the ranks wrote this folder, and a link they left (a file, or
        the logs folder itself) could otherwise make the launcher copy any file it can read (the validation
        shards) into the record. Nothing else the ranks left there is taken, and nothing is walked: a run's
        record is as large as its budget, however many files or folders a team makes. Returns the names of
        what else logs/ held (at most 20)."""
        dest.mkdir(parents=True, exist_ok=True)
        logs = self._subfolder_fd("logs")
        others: list[str] = []
        if logs is not None:
            try:
                sizes = {name: regular_size(name, logs) for name in dict.fromkeys(names or self.named_logs)}
                shares = fair_shares({n: s for n, s in sizes.items() if s is not None}, budget_bytes)
                for name, share in shares.items():
                    target = dest / name
                    if target.is_symlink():
                        target.unlink()
                    copy_regular_file(name, target, logs, share)
                with os.scandir(logs) as it:
                    for entry in it:
                        if entry.name not in sizes and len(others) < 20:
                            others.append(entry.name)
            except OSError:
                pass  # the folder changed under the copy: what was copied stays
            finally:
                os.close(logs)
        if self.own_logs:  # the launcher's own: harness-written, each cut at the same budget
            own = os.open(self.own, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                for name in self.own_logs:
                    target = dest / name
                    if target.is_symlink():
                        target.unlink()
                    copy_regular_file(name, target, own, budget_bytes)
            finally:
                os.close(own)
        for link in dest.iterdir():  # a link whose file was never written (a rank that never started)
            try:
                where = os.readlink(link)
            except OSError:  # not a link, or gone: nodes on one machine share this folder, and another
                continue     # node's launcher may be replacing its own links with copies right now
            target = Path(os.path.abspath(os.path.join(link.parent, where)))
            if any(target.is_relative_to(mine) for mine in (self.dir, self.live_dir, self.own)):
                try:
                    link.unlink()
                except FileNotFoundError:
                    pass
        return others

    def take_staged(self, name: str, dest: Path, max_bytes: int | None = None, held: bool = False) -> bool | None | int:
        """A file rank 0 left in staging/, copied to dest if it is a regular file reached without following
        a link; None when there is nothing there, False when what is there is not a regular file, and its
        size (an int, nothing copied) when it is larger than max_bytes. `held`: in the staging/ held since before
        the ranks started (_staging), not the one its name leads to now."""
        fd = self._staging(held)
        if fd is None:
            try:  # in the folder the ranks wrote (a file system of the job's own may hide one of that name)
                os.stat("staging", dir_fd=self._dir_fd, follow_symlinks=False)
            except OSError:
                return None
            return False
        try:
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            except OSError:  # the team's folder refused its own reader (its rights taken away): the team's doing
                return False
            if max_bytes is not None and stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
                return int(st.st_size)
            copied = copy_regular_file(name, dest, fd, max_bytes)
            if copied and max_bytes is not None and dest.stat().st_size > max_bytes:  # grew while it was copied
                dest.unlink()
                return max_bytes + 1
            return copied
        finally:
            os.close(fd)

    def staged_changed(self, name: str, held: bool = False) -> tuple[float, int] | None:
        """When a file rank 0 left in staging/ last changed (its ctime: content, rename or metadata; the kernel sets
        it, and no call sets it back), on the monotonic clock, and its size; None if there is no regular file."""
        fd = self._staging(held)
        if fd is None:
            return None
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return time.monotonic() - (time.time() - st.st_ctime), int(st.st_size)

    def staged_key(self, name: str) -> tuple[int, int, int, int] | None:
        """What identifies a version of a file rank 0 left in staging/ (its device, inode, size and ctime in ns):
        every write, rename or change of it moves one of them, but a write through a shared mapping does not (the
        kernel moves the ctime on a mapping's first write at most). None: no regular file; PermissionError where the
        folder is kept from this reader. In the staging/ held since before the ranks started."""
        fd = self._staging(True)
        if fd is None:
            return None
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except PermissionError:  # the folder kept from this reader (its rights taken away): said, not hidden
            raise
        except OSError:
            return None
        finally:
            os.close(fd)
        return (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns) if stat.S_ISREG(st.st_mode) else None

    def staged_digest(self, name: str, max_bytes: int) -> tuple[tuple[int, int, int, int], str] | None:
        """(staged_key, sha256 of the bytes) of a regular file rank 0 left in staging/, read through a descriptor
        opened without following a link, in the staging/ held since before the ranks started; None for anything else,
        or a file past max_bytes. Raises OSError where the file is there and cannot be read."""
        import hashlib

        fd = self._staging(True)
        if fd is None:
            return None
        try:
            file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP):  # nothing there, or a link: no file to read
                return None
            raise
        finally:
            os.close(fd)
        with os.fdopen(file_fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
                return None
            digest, left = hashlib.sha256(), st.st_size
            while left > 0 and (chunk := fh.read(min(1 << 22, left))):
                digest.update(chunk)
                left -= len(chunk)
        return (st.st_dev, st.st_ino, st.st_size, st.st_ctime_ns), digest.hexdigest()

    def take_checkpoint(self, dest: Path) -> bool:
        return self.take_staged("checkpoint.pt", dest) is True

    def cleanup(self) -> bool:
        """Remove the private folder, whatever the ranks made in it; False when something of it is left
        (the runner flags the run: what a team leaves fills the scratch root for the runs after)."""
        for fd in (self._dir_fd, self._staging_fd):
            try:
                os.close(fd)
            except (OSError, TypeError):
                pass
        shutil.rmtree(self.own, ignore_errors=True)  # the launcher's own logs: no team code wrote there
        return scratch.remove_tree(self.dir)
