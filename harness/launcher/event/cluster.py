"""A SLURM cluster as the harness's commands meet it: the one-machine cluster (slurm_cluster.sh beside this
file: `scripts/slurm-cluster`, `harness rehearse`), and the few SLURM calls a rehearsal makes (sbatch's job
id, whether a job is still queued or running, scancel), each through SLURM's own commands.

Runs in the `harness` process (the rehearsal) and in the tests; no team code runs beside it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).with_name("slurm_cluster.sh")


class ClusterError(RuntimeError):
    """A SLURM command or the one-machine cluster failed: the message says which, and its own words."""


def _run(argv: list[str], timeout_s: float = 60.0, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None and not Path(argv[0]).is_file():
        raise ClusterError(f"{argv[0]} is not on PATH: SLURM's commands are needed (scripts/slurm-cluster up "
                           "installs and starts a cluster on this machine)")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{' '.join(argv)} did not answer within {timeout_s:.0f} s") from None
    if check and proc.returncode != 0:
        words = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise ClusterError(f"{' '.join(argv)} failed ({proc.returncode}): {words}")
    return proc


def one_machine(action: str, nodes: int | None = None, timeout_s: float = 900.0) -> str:
    """`slurm_cluster.sh up N | down | status` (installs Debian's packages on first use: minutes). Returns what
    it said; raises ClusterError with its words when it fails."""
    argv = ["bash", str(SCRIPT), action, *([str(nodes)] if nodes is not None else [])]
    proc = _run(argv, timeout_s=timeout_s, check=False)
    said = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise ClusterError(f"scripts/slurm-cluster {action}{'' if nodes is None else f' {nodes}'} failed: {said[-2000:]}")
    return said


def submitted_job_id(sbatch_output: str) -> str:
    """The job id in sbatch's "Submitted batch job 123" (also with --parsable's "123" or "123;cluster")."""
    found = re.search(r"Submitted batch job (\d+)", sbatch_output) or re.fullmatch(r"\s*(\d+)(;\S+)?\s*", sbatch_output)
    if not found:
        raise ClusterError(f"sbatch did not say which job it queued: {sbatch_output.strip()!r}")
    return found.group(1)


def active_tasks(job_id: str, attempts: int = 5) -> list[str]:
    """The job's tasks SLURM still has queued, running or completing (an array's as `<id>_<task>`). "Invalid job
    id" means gone from the controller's memory, so not active; any other failure (a controller slow to answer
    on a busy machine) is asked again, and raises after `attempts`: a round must never end early on a hiccup."""
    for attempt in range(attempts):
        try:
            proc = _run(["squeue", "-h", "-j", job_id, "-o", "%i %T"], timeout_s=60.0, check=False)
        except ClusterError:
            proc = None
        if proc is not None and proc.returncode == 0:
            return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
        if proc is not None and "invalid job id" in (proc.stderr + proc.stdout).lower():
            return []
        time.sleep(min(10.0, 2.0 ** attempt))
    raise ClusterError(f"squeue -j {job_id} failed {attempts} times: "
                       f"{(proc.stderr or proc.stdout).strip() if proc is not None else 'no answer'}")


def wait_for_job(job_id: str, timeout_s: float, poll_s: float = 1.0, while_waiting=None) -> bool:
    """True once no task of the job is queued or running; False at the timeout. `while_waiting()` is called
    every poll (a rehearsal's faults)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if while_waiting is not None:
            while_waiting()
        if not active_tasks(job_id):
            return True
        time.sleep(poll_s)
    return False


def cancel(job_id: str) -> None:
    """scancel of the whole job (every array task): SLURM signals each step's processes, SIGTERM first."""
    _run(["scancel", job_id])
