"""A process that will run team code joins its job's control group as its first act, and offers itself first to
the kernel's out-of-memory killer.

The launcher makes the cgroup (harness/launcher/control/job_cgroup.py) and names it in HARNESS_JOB_CGROUP. Joining
before anything else, single-threaded, means every process the team's code starts is born in it, and ends with it
(`cgroup.kill`). It must come before the job's namespaces: in them /sys is read-only.
"""

from __future__ import annotations

import os

ENV = "HARNESS_JOB_CGROUP"
# The job's v1 cgroups that hold its memory and pids caps, where the v2 one cannot (harness/launcher/control/job_limits.py):
# os.pathsep-separated folders, joined beside the v2 one.
LIMITS_ENV = "HARNESS_JOB_LIMITS"
OOM_SCORE_ADJ = "1000"  # the first to go when memory runs out: never the launcher, a scorer or another job's rank


def offer_to_oom_killer() -> None:
    """A process that runs team code is the first the kernel ends when memory runs out: its oom_score_adj raised
    (no privilege needed; its children inherit it)."""
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(OOM_SCORE_ADJ)
    except OSError:
        pass  # not Linux, or /proc hidden: the cgroup is what matters


def join_from_environment(oom_first: bool = True) -> dict | None:
    """Join the cgroup the launcher named; None where it named none, else {"active", "why"}. `oom_first`: for a
    process that runs team code (offer_to_oom_killer)."""
    if oom_first:
        offer_to_oom_killer()
    path = os.environ.pop(ENV, None)  # joined once: team code has no use for either
    limits = [p for p in os.environ.pop(LIMITS_ENV, "").split(os.pathsep) if p]
    out = None
    for where in limits:  # first: the caps hold before anything this process starts exists
        try:
            _join(where)
        except OSError as exc:
            out = {"active": False, "why": f"this process could not join its job's capped cgroup {where}: {exc}"}
    if not path:
        return out
    try:
        _join(path)
    except OSError as exc:
        return {"active": False, "why": f"this process could not join its job's cgroup {path}: {exc}"}
    return out or {"active": True, "why": f"in the job's cgroup {path}"}


def _join(path: str) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as fh:
        fh.write("0")  # "0": the writing process itself (v1 and v2 alike)
