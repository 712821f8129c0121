"""The training processes' private working folder, and an environment that does not point at results.

The ranks get a folder of their own (mode 0700, outside runs/): a copy of the submission to
import, a logs folder and a staging folder for the checkpoint, and it is their working
directory. While they run, the launcher's environment loses the variables that name the
runs, leaderboard, data and cache locations, so the ranks inherit none of them. After the
job the launcher copies the logs into the record and takes the checkpoint over.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from harness.ranks import sandbox

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


def copy_regular_file(src: Path, dest: Path) -> bool:
    """Copy src if it is a regular file, opened without following a link (O_NOFOLLOW); False if not."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # a link, or gone
        return False
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):  # a FIFO or a device: never read
            return False
        with open(dest, "wb") as out:
            shutil.copyfileobj(fh, out)
    return True


HIDDEN_ENV = ("HARNESS_RUNS_DIR", "HARNESS_LEADERBOARD_DIR", "HARNESS_PLOTS_DIR", "HARNESS_DATA_ROOT",
              "HARNESS_CACHE_DIR")


class WorkArea:
    def __init__(self, snapshot: Path):
        self.dir = Path(tempfile.mkdtemp(prefix="harness-train-"))
        os.chmod(self.dir, 0o700)
        self.submission = self.dir / "submission"
        self.logs = self.dir / "logs"
        self.staging = self.dir / "staging"
        shutil.copytree(snapshot, self.submission)
        self.logs.mkdir()
        self.staging.mkdir()

    def hidden_environment(self):
        return patched_environ(unset=HIDDEN_ENV)

    def rank_environment(self) -> dict[str, str]:
        """Home, temporary folder and compiler caches of the ranks: all inside the private folder."""
        tmp = self.dir / "tmp"
        tmp.mkdir(exist_ok=True)
        return {"HOME": str(self.dir), "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(self.dir / "inductor"),
                "TRITON_CACHE_DIR": str(self.dir / "triton"), "CUDA_CACHE_PATH": str(self.dir / "cuda")}

    def sandbox_policy(self, train_files: list[str], gpu: bool) -> sandbox.Policy:
        """The training ranks may read the train shards one by one, never the folder they sit in."""
        return sandbox.build_policy(submission_dir=str(self.submission), private_dir=str(self.dir),
                                    read_files=train_files, gpu=gpu, training=True)

    def link_logs(self, dest: Path, names: list[str]) -> None:
        """Live logs in the record while the job runs: links into the private folder (the ranks see no path)."""
        dest.mkdir(parents=True, exist_ok=True)
        for name in names:
            link = dest / name
            if not link.exists() and not link.is_symlink():
                link.symlink_to(self.logs / name)

    def collect_logs(self, dest: Path) -> None:
        """The logs become plain files of the record (links replaced by copies). Only regular files are
        copied, never through a link: the ranks wrote this folder, and a link they left in it could
        otherwise make the launcher copy any file it can read (the validation shards) into the record."""
        dest.mkdir(parents=True, exist_ok=True)
        for folder, dirs, files in os.walk(self.logs):  # does not descend into linked folders
            for name in files:
                path = Path(folder) / name
                target = dest / path.relative_to(self.logs)
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_symlink():
                    target.unlink()
                copy_regular_file(path, target)
        for link in dest.iterdir():  # a link whose file was never written (a rank that never started)
            if link.is_symlink() and Path(link.resolve()).is_relative_to(self.dir):
                link.unlink()

    def take_checkpoint(self, dest: Path) -> bool:
        staged = self.staging / "checkpoint.pt"
        if not staged.is_file():
            return False
        shutil.move(str(staged), str(dest))  # the staging folder may be on another file system
        return True

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
