"""Where a run's launcher runs, and whether it is still alive: the run's lock first, else its host and pid (and
its SLURM job). What `harness finalize` and a resumed queue ask before they close a record as `aborted`, and
what every launcher writes into its record (`launcher_where`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import psutil

from harness.results import locks
from harness.results.records import RunRecord, stamp_epoch_s

STARTED_AT_RESOLUTION_S = 1.0  # started_at is written to the second: a launcher may have started up to 1 s after it


def launcher_where() -> dict:
    """What tells the launcher's process apart from another with its pid: the machine's boot (a pid of an
    earlier boot is no process now), its PID namespace (a container on the same host name sees other
    pids), and its SLURM job (which the cluster can be asked about from any node)."""
    where: dict = {"slurm_job_id": os.environ.get("SLURM_JOB_ID")}
    try:
        where["boot_id"] = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        where["pid_ns"] = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pass
    return where


def slurm_job_gone(job_id: str) -> bool | None:
    """Whether SLURM has no such job any more (True), still has it (False), or cannot be asked (None)."""
    squeue = shutil.which("squeue")
    if squeue is None or not str(job_id).replace("_", "").isdigit():
        return None
    try:
        proc = subprocess.run([squeue, "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode == 0:
        return not proc.stdout.strip()
    return True if "invalid job id" in proc.stderr.lower() else None  # a job long finished is forgotten


def launcher_alive(record: RunRecord, here: str | None = None, run_dir: Path | None = None) -> str:
    """"" when this host can tell that the record's launcher is gone; else why it may still be alive.

    A free lock is proof only on the launcher's own machine: flock on a shared file system may be local to
    each client (NFS `local_lock`, Lustre `localflock`), where another host sees every lock free. From
    another host, the SLURM job is asked; without one, nothing can be told."""
    here = here or socket.gethostname()
    where = record.extra.get("launcher_where") or {}
    same_host = record.hostname == here and where.get("boot_id") in (None, _here().get("boot_id"))
    held = locks.launcher_alive(run_dir) if run_dir is not None else None
    if held is True:
        return f"its launcher holds the run's lock ({Path(run_dir) / locks.RUN_LOCK})"
    if held is False and same_host:
        return ""
    if not same_host:
        job = where.get("slurm_job_id")
        gone = slurm_job_gone(job) if job else None
        if gone is True:
            return ""
        if gone is False:
            return f"its SLURM job {job} is still in the queue (squeue)"
        return (f"its launcher ran on host {record.hostname or '(not recorded)'}, not on this one ({here}), "
                "and no SLURM job can be asked about it: whether it is alive cannot be seen from here")
    if where.get("pid_ns") not in (None, _here().get("pid_ns")):
        return ("its launcher ran in another PID namespace on this host (a container): its pid means nothing here, "
                "whether it is alive cannot be seen")
    pid = record.launcher_pid
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return "the record does not say which process is its launcher (a record of a harness before schema 3)"
    try:
        proc = psutil.Process(pid)
        created_s, command = proc.create_time(), " ".join(proc.cmdline())
    except psutil.NoSuchProcess:  # a zombie too: it has ended, and only waits for its parent to reap it
        return ""
    except psutil.Error as exc:  # AccessDenied: a process is there and cannot be looked at
        return f"process {pid} is alive and cannot be inspected ({type(exc).__name__})"
    started_s = stamp_epoch_s(record.started_at)
    if started_s is None:
        return f"process {pid} is alive and the record's start ({record.started_at!r}) cannot be read ({command[:200]})"
    if created_s < started_s + STARTED_AT_RESOLUTION_S:
        return f"process {pid} is alive and started before the run did: it is the launcher ({command[:200]})"
    if "harness" in command:
        return f"process {pid} is alive and runs the harness ({command[:200]})"
    return ""  # the pid now belongs to a process started after the run: the launcher is gone


def _here() -> dict:
    where = launcher_where()
    where.pop("slurm_job_id", None)
    return where


