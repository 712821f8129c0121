"""What produced a run's figures: software versions and the machine, recorded in run.json.

A figure without them cannot be reproduced or compared: a leaderboard page says which machine
produced it, and a dispute starts from the exact torch, CUDA and NCCL and the harness commit.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import harness
from harness import __version__

# Anchored on the package, not on this file's depth, so moving the module between rooms cannot break it.
HARNESS_ROOT = Path(harness.__file__).resolve().parent.parent  # the checkout, when the harness runs from one


def versions() -> dict[str, str | None]:
    """torch, CUDA and NCCL (where torch has them), numpy, Python, the harness and its git commit."""
    import numpy
    import torch

    out: dict[str, str | None] = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None,
                                  "numpy": numpy.__version__, "python": platform.python_version(),
                                  "harness": __version__, "harness_git_commit": git_commit(HARNESS_ROOT)}
    try:
        if torch.cuda.is_available():
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # a build without NCCL: None says so
        pass
    return out


def git_commit(root: Path) -> str | None:
    """HEAD of the checkout the harness runs from, "+dirty" when its tracked files differ; None outside one."""
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict:
    """The CPU model and cores. (The GPU is the record's `device_name`, reported by rank 0: asking for it here
    would open a CUDA context in the launcher, on a GPU the ranks need.)"""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "system": f"{platform.system()} {platform.machine()}"}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()
