"""A control group (cgroup v2) of a job's own, so that ending the job ends every process it made, however they fork.

The launcher's teardown (process_tree.ProcessScope) lists a job's processes and signals them: a process that forks
and lets its parent exit faster than the list is read is never in the list it is killed from, and one kept alive
past the run can carry a run's weights into the team's next one. The kernel ends a cgroup's processes atomically
(`cgroup.kill`, Linux 5.14) and says when none is left (`populated 0` in `cgroup.events`).

Each process that will run team code (a training or evaluation rank, the check process) writes itself into the
job's cgroup as its first act (harness/ranks/confine/cgroup.py), before it can start anything, so everything it
starts is born inside; the path goes to it in `HARNESS_JOB_CGROUP`. The cgroup is a child of the launcher's own
(`/proc/self/cgroup`), which needs a writable cgroup2 mount: root, or a subtree delegated to the harness's user
(systemd's `Delegate=yes` on the system unit that starts it). Where there is none, `why` says so and the record, the
summary and `harness doctor` say it: the job is then held by the process-list teardown alone.

A cgroup's name carries its launcher's pid and start time, so a cgroup left populated by a launcher that was
killed outright (SIGKILL: no teardown ran) is ended and removed by the next launcher on the host.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path

import psutil

from harness.launcher.control.job_limits import Caps, JobLimits, caps_for
from harness.ranks.confine.cgroup import ENV  # read there, in the process that joins
PREFIX = "harness-job-"
OFF_ENV = "HARNESS_CGROUP"  # "off": no cgroup per job (a host whose cgroup v2 misbehaves; the tests of the fallback)
EMPTY_WITHIN_S = 10.0
_serial = itertools.count()


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup on a pure-v2 host, /sys/fs/cgroup/unified on a
    hybrid one; None without one."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            return Path(before.split()[4])
    return None


def own_cgroup(proc_cgroup: str = "/proc/self/cgroup") -> str | None:
    """This process's place in the v2 hierarchy (the `0::` line), e.g. "/" or "/user.slice/..."."""
    try:
        for line in Path(proc_cgroup).read_text().splitlines():
            if line.startswith("0::"):
                return line[3:] or "/"
    except OSError:
        pass
    return None


def _start_ticks(pid: int) -> str:
    """A process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat): with its pid, who it is."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _members(path: Path) -> list[int]:
    """Every process in the cgroup and in any cgroup below it."""
    pids: set[int] = set()
    for folder in _cgroup_dirs(path):
        try:
            pids.update(int(x) for x in (folder / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(pids)


def _cgroup_dirs(path: Path) -> list[Path]:
    """The cgroup and every cgroup below it, each once."""
    return [path, *(p for p in path.glob("**/") if p != path)]


def _listed(folder: Path) -> set[int]:
    """The processes a cgroup lists: its cgroup.procs, and the process of each thread in its cgroup.threads (a
    thread moved alone lists its process nowhere else there)."""
    found: set[int] = set()
    for name in ("cgroup.procs", "cgroup.threads"):
        try:
            ids = [int(x) for x in (folder / name).read_text().split()]
        except (OSError, ValueError):  # gone; or a threaded cgroup's cgroup.procs (EOPNOTSUPP)
            continue
        if name == "cgroup.procs":
            found.update(ids)
            continue
        for tid in ids:
            try:
                with open(f"/proc/{tid}/status") as f:
                    found.update(int(line.split()[1]) for line in f if line.startswith("Tgid:"))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _kill_members(path: Path) -> None:
    """SIGKILL each process the cgroup (or one below it) still lists, one by one. cgroup.kill passes over a process
    whose main thread has exited while another of its threads runs on (Linux 6.18 left one running, the cgroup
    populated, measured); a kill to its pid ends it. Each is pinned by a pidfd and then found listed again, so a
    pid freed and taken by a process outside the cgroup meanwhile is never signalled."""
    folders = _cgroup_dirs(path)
    listed = set().union(*(_listed(f) for f in folders))
    pinned: dict[int, int] = {}
    try:
        for pid in listed:
            try:
                pinned[pid] = os.pidfd_open(pid)
            except OSError:  # gone; or no pidfd (Linux < 5.3, which has no cgroup.kill either)
                continue
        still = set().union(*(_listed(f) for f in folders))  # after the pins: a listed pid is the pinned process
        for pid, fd in pinned.items():
            if pid in still:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
                except OSError:
                    pass
    finally:
        for fd in pinned.values():
            os.close(fd)


def _populated(path: Path) -> bool:
    try:
        return "populated 1" in (path / "cgroup.events").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True


def end(path: Path, within_s: float = EMPTY_WITHIN_S) -> tuple[list[int], str]:
    """SIGKILL everything in the cgroup at once, wait until it is empty, remove it (and any cgroup below it).
    Returns the pids that were in it and "" or why it could not be emptied or removed."""
    pids = _members(path)
    try:
        # Frozen first: a process that cgroup.kill passes over (_kill_members) cannot start another meanwhile, and a
        # process forked while the freeze spreads is born frozen. SIGKILL ends frozen processes.
        (path / "cgroup.freeze").write_text("1")
    except OSError:  # no freezer (Linux < 5.2, which has no cgroup.kill either), or the cgroup is gone: the kill says
        pass
    try:
        (path / "cgroup.kill").write_text("1")
    except FileNotFoundError:
        return pids, ""  # already removed
    except OSError as exc:
        return pids, f"cgroup.kill of {path} failed: {exc}"
    deadline = time.monotonic() + within_s
    while _populated(path):
        if time.monotonic() > deadline:
            return pids, f"{path} still held processes {within_s:.0f} s after cgroup.kill"
        time.sleep(0.02)
        _kill_members(path)  # what cgroup.kill passed over
    for below in sorted(path.glob("**/"), key=lambda p: len(p.parts), reverse=True):  # the deepest first
        try:
            below.rmdir()
        except FileNotFoundError:
            continue
        except OSError as exc:
            return pids, f"{below} could not be removed: {exc}"
    return pids, ""


def launcher_gone(name: str) -> bool:
    """Whether the launcher that made a job cgroup of this name (PREFIX<pid>-<start ticks>-...) is dead: neither this
    process nor a live process with that pid and start time. Names of another shape are never a job's."""
    parts = name[len(PREFIX):].split("-") if name.startswith(PREFIX) else []
    if len(parts) < 2 or not parts[0].isdigit():
        return False
    pid, ticks = int(parts[0]), parts[1]
    return not (pid == os.getpid() or (psutil.pid_exists(pid) and _start_ticks(pid) == ticks))


def sweep_orphans(parent: Path) -> list[str]:
    """End and remove the job cgroups under `parent` whose launcher is no longer alive (it was killed outright):
    nothing of an earlier run outlives it into the next. Returns the names of those it ended."""
    ended = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return ended
    for entry in entries:
        if not entry.is_dir() or not launcher_gone(entry.name):
            continue  # this launcher's, or a live launcher's (another run on this host)
        end(entry)
        ended.append(entry.name)
    return ended


def v2_own_and_mount() -> tuple[Path | None, Path | None]:
    """This process's own v2 cgroup folder and the v2 mount (None where there is none)."""
    mount, own = cgroup2_mount(), own_cgroup()
    return (mount / own.lstrip("/") if mount is not None and own is not None else None), mount


def track_caps(track) -> Caps:
    """A track's `job_memory_gib` and `job_pids_max` for one job on this node (0 GiB: a share of what it offers)."""
    return caps_for(track.job_memory_gib, track.job_pids_max, *v2_own_and_mount())


class JobCgroup:
    """One job's cgroup: made in the constructor (`active`, else `why` not), ended in close(). With `caps`, the
    job's memory and pids caps too (job_limits.JobLimits: in this cgroup, or in v1 cgroups beside it)."""

    def __init__(self, label: str, caps: Caps | None = None) -> None:
        self.path: Path | None = None
        self.active, self.why, self.swept = False, "", []
        self.limits: JobLimits | None = None
        self.name = f"{PREFIX}{os.getpid()}-{_start_ticks(os.getpid())}-{label}-{next(_serial)}"
        if os.environ.get(OFF_ENV, "").strip().lower() == "off":  # neither the cgroup nor the caps
            self.why = f"turned off ({OFF_ENV}=off)"
            return
        self._make()
        # The caps hold where they can, with or without the v2 cgroup (a hybrid host's v1 controllers).
        if caps is not None:
            self.limits = JobLimits(self.name, caps, self.path if self.active else None, launcher_gone)

    def _make(self) -> None:
        mount, own = cgroup2_mount(), own_cgroup()
        if mount is None or own is None:
            self.why = "no cgroup v2 hierarchy is mounted here" if mount is None else "this process is in no v2 cgroup"
            return
        parent = mount / own.lstrip("/")
        if not os.access(parent / "cgroup.procs", os.W_OK):  # a process moves in only where its origin's can be written
            self.why = (f"{parent}/cgroup.procs is not writable by the harness's user (a read-only cgroup2 mount, or a "
                        "subtree not delegated to it): no process could join a cgroup made there")
            return
        self.swept = sweep_orphans(parent)
        name = self.name
        try:
            (parent / name).mkdir()
        except OSError as exc:
            self.why = (f"no cgroup could be made under {parent} ({exc.strerror or exc}): the harness's user needs a "
                        "writable cgroup v2 subtree of its own (see harness doctor's containment line)")
            return
        self.path = parent / name
        if not (self.path / "cgroup.kill").exists():  # Linux < 5.14: no atomic kill; a list-and-kill is no better
            end_without_kill = self.path
            self.path = None
            try:
                end_without_kill.rmdir()
            except OSError:
                pass
            self.why = "this kernel has no cgroup.kill (Linux 5.14 or later is needed)"
            return
        self.active = True
        self.why = f"cgroup v2 {self.path} (ended with cgroup.kill)"

    def env(self) -> dict[str, str]:
        """What a process that joins needs to find it; nothing when there is no cgroup (it then joins none)."""
        return {**({ENV: str(self.path)} if self.active else {}), **(self.limits.env() if self.limits else {})}

    def members(self) -> list[int]:
        return _members(self.path) if self.path is not None else []

    def close(self) -> list[int]:
        """End everything still in the cgroup and remove it; returns the pids that were still in it."""
        pids: list[int] = []
        if self.limits is not None:  # counted before the cgroups go (their files go with them)
            self.limits.count()
        if self.path is not None:
            pids, why = end(self.path)
            if why:
                self.why = f"{self.why}; at the end: {why}"
            self.path = None if not why else self.path
        if self.limits is not None:
            why = self.limits.close()
            if why:
                self.why = f"{self.why}; at the end: {why}"
        return pids

    def report(self) -> dict:
        out = {"active": self.active, "why": self.why}
        if self.swept:  # an earlier run's processes outlived it (its launcher was killed outright): ended now
            out["swept"] = self.swept[:10]
        if self.limits is not None:
            out["limits"] = self.limits.report()
        return out
