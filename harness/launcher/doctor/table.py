"""The doctor's table: one line per check (`Check`), the checks' names in the table's order, the options and
the report. Every check module writes its lines in these types; harness/launcher/doctor/checkup.py runs them."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.ranks.confine.namespaces import PROC_SYS

STATUSES = ("ok", "warn", "fail", "skipped")
# Every check's name, in the table's order: what `--skip` takes.
CHECKS = ("gpus", "driver", "cpus", "memlock", "user", "namespaces", "containment", "sandbox", "eval-model", "locks", "disk-runs",
          "disk-scratch", "scratch-root", "data", "allreduce-node", "allreduce-nodes", "gloo-nodes", "data-nodes",
          "infiniband", "clock-sync", "clock-skew")


@dataclass(frozen=True, kw_only=True)
class Check:
    """One line of the table: what was measured, and what to do when it is not ok."""

    name: str  # one of CHECKS
    status: str  # one of STATUSES
    measured: str = ""  # the figure or the finding, in words
    fix: str = ""  # what to do; empty when there is nothing to do
    value: float | None = None  # the figure itself, for --json (its unit in `unit`)
    unit: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"check {self.name}: status {self.status!r} is not one of {STATUSES}")
        if self.name not in CHECKS:
            raise ValueError(f"check {self.name!r} is not one of {CHECKS}")


@dataclass(kw_only=True)
class DoctorOptions:
    track: str = "local"
    runs_dir: str | None = None
    data_root: str | None = None
    data_fingerprint: str | None = None  # the fingerprint the data must have (a rehearsal record's data_fingerprint)
    node_rank: int = 0
    rdzv_endpoint: str = ""  # HOST:PORT of node 0: the all-reduce between the nodes (harness slurm --doctor)
    skip: tuple[str, ...] = ()
    proc_sys: str = PROC_SYS  # where /proc/sys is read (tests point it at a folder of their own)

    def __post_init__(self) -> None:
        unknown = [name for name in self.skip if name not in CHECKS]
        if unknown:
            raise ValueError(f"unknown check(s) to skip: {', '.join(unknown)}; the checks are {', '.join(CHECKS)}")


@dataclass
class DoctorReport:
    track: str
    host: str
    node_rank: int
    nnodes: int
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict:
        return {"track": self.track, "host": self.host, "node_rank": self.node_rank, "nnodes": self.nnodes,
                "seconds": round(self.seconds, 2), "exit_code": self.exit_code,
                "counts": {s: sum(c.status == s for c in self.checks) for s in STATUSES},
                "checks": [asdict(c) for c in self.checks]}


GIB = 2**30


def disk(name: str, path: Path, need_bytes: float, what: str, fix: str, warn_below: int = 10) -> Check:
    """A failure below `need_bytes` free, a warning below `warn_below` times it (a day's queue of runs)."""
    probe = path
    while not probe.exists() and probe != probe.parent:  # the runs folder may not exist yet: its file system
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError as exc:
        return Check(name=name, status="fail", measured=f"{path}: {exc}", fix=fix)
    measured = f"{free / GIB:.1f} GiB free at {path}; {what}: {need_bytes / GIB:.2g} GiB"
    if free < need_bytes:
        return Check(name=name, status="fail", measured=measured, fix=fix, value=free / GIB, unit="GiB")
    if free < warn_below * need_bytes:
        return Check(name=name, status="warn", measured=f"{measured} (room for {int(free // need_bytes)})", fix=fix,
                     value=free / GIB, unit="GiB")
    return Check(name=name, status="ok", measured=measured, value=free / GIB, unit="GiB")
