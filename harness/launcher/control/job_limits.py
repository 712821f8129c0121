"""A job's memory and process-count caps (the track's `job_memory_gib`, `job_pids_max`), held by the kernel.

A team that allocates without end, or forks without end, must end its own job, never the launcher or a scorer:
the kernel charges every page and every task of the job's processes to cgroups of the job's own, and refuses (a
fork: EAGAIN) or ends (memory: the cgroup's own out-of-memory killer) what passes the cap. Each job's cap is its
own: jobs that run at once on a node are kept apart only where their caps add up to less than it (the default,
90% of the node, protects the launcher, not one concurrent job from another).

Where each cap lives, per controller (`memory`, `pids`):
- cgroup v2: the job's own cgroup (harness/launcher/control/job_cgroup.py), where its parent enables the controller
  for its children (`cgroup.subtree_control`): `memory.max`, `pids.max`. The harness never enables a controller
  itself: a v2 cgroup that holds processes (the launcher's) may not hand controllers down.
- cgroup v1, where the controller is bound to a v1 hierarchy instead (a hybrid host, whose v2 tree holds no
  controller; this machine, many container hosts): a cgroup of the job's in that hierarchy, below this process's
  own place in it, named as the v2 one (`memory.limit_in_bytes`, `pids.max`). A process joins it as its first act,
  as it joins the v2 one (harness/ranks/confine/cgroup.py), so everything it starts is charged there too.
- neither (no controller, no right to write it): no cap, and `why` says so in the record and in `harness doctor`.

The caps are per job on one node (each phase's: the check, training, evaluation). Memory counts what the kernel
charges the job's processes: their pages, the page cache of files they write (reclaimed first), /dev/shm's tmpfs,
and socket buffers (v2 in memory.max; v1 apart, in memory.kmem.tcp, a limit of its own at the same figure, which
v1 enforces loosely: memory and sockets together may reach twice the cap there). Kernel memory charged to no cgroup
(perf ring buffers; BPF maps before Linux 5.11) is refused at its calls by the seccomp filter
(harness/ranks/confine/seccomp.py). Pids count tasks, threads included (a torch rank holds dozens), at most
half of what the host holds.
"""

from __future__ import annotations

import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.ranks.confine.cgroup import LIMITS_ENV  # read there, in the process that joins

CONTROLLERS = ("memory", "pids")
MEMORY_SHARE_OF_NODE = 0.9  # job_memory_gib = 0: this share of what the node offers the launcher
# The v1 files of each cap, and the files that count what the cap refused (v1 and v2 name them alike, but for memory).
V1_LIMIT = {"memory": "memory.limit_in_bytes", "pids": "pids.max"}
V2_LIMIT = {"memory": "memory.max", "pids": "pids.max"}


@dataclass(frozen=True)
class Caps:
    """What one job's processes may hold together on a node."""

    memory_bytes: int
    pids: int
    room_bytes: int = 0  # of memory_bytes, what harness processes sharing the job's cgroups have (evaluation's scorers)

    def __post_init__(self) -> None:
        if self.memory_bytes < 1 << 20 or self.pids < 16:
            raise ValueError(f"a job needs at least 1 MiB and 16 tasks, got {self.memory_bytes} bytes and {self.pids}")

    def value(self, controller: str) -> int:
        return self.memory_bytes if controller == "memory" else self.pids

    def with_room(self, memory_bytes: int, at_most_bytes: int) -> "Caps":
        """The same caps with room for harness processes that share the job's cgroups (evaluation's scorers), the
        whole never past `at_most_bytes` (the share of the node the caps never exceed)."""
        total = min(self.memory_bytes + memory_bytes, max(self.memory_bytes, at_most_bytes))
        return Caps(memory_bytes=total, pids=self.pids, room_bytes=total - self.memory_bytes)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _int(text: str) -> int:
    text = text.strip()
    return int(text) if text.isdigit() else 0


def _try_write(path: Path, value: str) -> None:
    """A setting that holds where the kernel offers it (swap accounting may be off): best effort."""
    try:
        path.write_text(value)
    except OSError:
        pass


def v1_dirs(mountinfo: str = "/proc/self/mountinfo", proc_cgroup: str = "/proc/self/cgroup") -> dict[str, Path]:
    """This process's own cgroup folder in each v1 controller's hierarchy (a controller belongs to one at most).
    /proc/self/cgroup names a place from the hierarchy's root; a mount may show only a part of it (a container's
    `/docker/<id>`, mountinfo's fourth field): the place is then read from that part, and a place outside it is
    unreachable here."""
    mounts: dict[str, tuple[str, Path]] = {}
    for line in _read(Path(mountinfo)).splitlines():
        before, _, after = line.partition(" - ")
        fields, head = after.split(), before.split()
        if len(fields) >= 3 and fields[0] == "cgroup" and len(head) >= 5:
            for option in fields[2].split(","):
                if option in CONTROLLERS:
                    mounts.setdefault(option, (head[3], Path(head[4])))
    out: dict[str, Path] = {}
    for line in _read(Path(proc_cgroup)).splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[1]:
            continue
        for controller in parts[1].split(","):
            if controller not in mounts:
                continue
            root, mount = mounts[controller]
            place = parts[2] or "/"
            if root != "/" and place != root and not place.startswith(root.rstrip("/") + "/"):
                continue  # outside what this mount shows
            out[controller] = mount / place[len(root.rstrip("/")):].lstrip("/")
    return out


def node_memory_bytes(v2_own: Path | None, v2_mount: Path | None = None, meminfo: str = "/proc/meminfo",
                      proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo") -> int:
    """What the node offers this process: its memory, or the lowest cap of its cgroups and of every cgroup above
    them where that is lower (a container, a SLURM job or step: SLURM caps the job's cgroup, above the step's).
    `v2_own`: this process's own v2 cgroup folder, where there is one, below `v2_mount`."""
    total = 0
    for line in _read(Path(meminfo)).splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
    caps = []
    memory_v1 = v1_dirs(mountinfo, proc_cgroup).get("memory")
    if memory_v1 is not None:  # the kernel's own minimum over the folder and every one above it
        caps.append(str(counted(_read(memory_v1 / "memory.stat"), "hierarchical_memory_limit") or ""))
    if v2_own is not None:
        folder = v2_own
        while True:
            caps.append(_read(folder / "memory.max").strip())
            if v2_mount is None or folder == v2_mount or v2_mount not in folder.parents:
                break
            folder = folder.parent
    known = [int(c) for c in caps if c.isdigit()]
    return min([total, *known]) if total else min(known, default=0)


def host_tasks(proc_sys: str = "/proc/sys/kernel") -> int:
    """How many tasks the host can hold at all: the lower of its pid_max and threads-max (0: unknown)."""
    known = [_int(_read(Path(proc_sys) / name)) for name in ("pid_max", "threads-max")]
    return min([k for k in known if k > 0], default=0)


def caps_for(memory_gib: float, pids_max: int, v2_own: Path | None = None, v2_mount: Path | None = None,
             proc_sys: str = "/proc/sys/kernel") -> Caps:
    """A track's caps in bytes and tasks: `memory_gib` 0 means MEMORY_SHARE_OF_NODE of what the node offers. The
    task cap never exceeds half of what the host holds: a job at its cap leaves the launcher room to fork."""
    memory = int(memory_gib * (1 << 30)) if memory_gib > 0 else \
        int(node_memory_bytes(v2_own, v2_mount) * MEMORY_SHARE_OF_NODE)
    host = host_tasks(proc_sys)
    return Caps(memory_bytes=max(memory, 1 << 20), pids=max(16, min(pids_max, host // 2)) if host else pids_max)


def counted(text: str, key: str) -> int:
    """The count after `key` in a flat-keyed cgroup file (`oom_kill 2`, `max 5`); 0 where it is absent."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


class JobLimits:
    """The caps of one job: set in the constructor (each controller's `held` or `why` not), counted and removed in
    close(), after the job's processes are gone."""

    def __init__(self, name: str, caps: Caps, v2_path: Path | None, gone: Callable[[str], bool], *,
                 mountinfo: str = "/proc/self/mountinfo", proc_cgroup: str = "/proc/self/cgroup") -> None:
        """`name`: the job cgroup's; `gone(name)`: whether the launcher that made a cgroup of that name is dead (its
        leftovers are removed first)."""
        self.caps = caps
        self.held: dict[str, str] = {}  # controller -> "v2 <path>" or "v1 <path>"
        self.why: dict[str, str] = {}  # controller -> why it holds no cap
        self.v1_dirs: dict[str, Path] = {}  # what a joining process writes itself into, beside the v2 cgroup
        self.cap_dirs: dict[str, Path] = {}  # controller -> the cgroup folder that holds its cap (v1 or v2)
        self.events: dict[str, int] = {}
        v2_enabled = set(_read(v2_path.parent / "cgroup.subtree_control").split()) if v2_path is not None else set()
        own_v1 = v1_dirs(mountinfo, proc_cgroup)
        for controller in CONTROLLERS:
            value = str(caps.value(controller))
            if controller in v2_enabled:
                try:
                    (v2_path / V2_LIMIT[controller]).write_text(value)
                    self.held[controller] = f"cgroup v2 {v2_path / V2_LIMIT[controller]}"
                    self.cap_dirs[controller] = v2_path
                    if controller == "memory":  # nor swap past it: none at all (the file is there with swap)
                        _try_write(v2_path / "memory.swap.max", "0")
                except OSError as exc:
                    self.why[controller] = f"{v2_path / V2_LIMIT[controller]} could not be written: {exc}"
                continue
            if controller not in own_v1:
                self.why[controller] = (f"no cgroup hierarchy here holds the {controller} controller for the job (the "
                                        "v2 tree does not hand it down, and no v1 hierarchy has it)" if v2_path is not None
                                        else f"no {controller} controller here, and no cgroup v2 of the job's own")
                continue
            parent = own_v1[controller]
            sweep_orphans(parent, gone)
            made = parent / name
            try:
                made.mkdir()
                (made / V1_LIMIT[controller]).write_text(value)
                if controller == "memory":  # memory and swap together within the cap (with swap accounting on)
                    _try_write(made / "memory.memsw.limit_in_bytes", value)
                    # v1 charges socket buffers apart from memory.limit_in_bytes (v2 counts them in memory.max): a
                    # team writing into sockets it never reads would otherwise hold the host's tcp_mem, unseen
                    _try_write(made / "memory.kmem.tcp.limit_in_bytes", value)
            except OSError as exc:
                self.why[controller] = (f"no cgroup v1 of the job's own could be made under {parent} "
                                        f"({exc.strerror or exc}): the harness's user cannot write that hierarchy")
                _remove(made)
                continue
            self.v1_dirs[controller] = self.cap_dirs[controller] = made
            self.held[controller] = f"cgroup v1 {made / V1_LIMIT[controller]}"

    def env(self) -> dict[str, str]:
        return {LIMITS_ENV: os.pathsep.join(str(d) for d in self.v1_dirs.values())} if self.v1_dirs else {}

    def count(self) -> dict[str, int]:
        """What the caps refused so far: out-of-memory kills once the job reached its memory cap, and forks refused
        once it held its task cap. Read before the cgroups are removed (their files go with them). A kill or a
        refusal with the job below its own cap came from a limit above it (the node's, a container's, a SLURM
        step's, systemd's TasksMax): counted apart, never blamed on the track's cap."""
        for controller, where in self.cap_dirs.items():
            if controller == "memory":
                if where == self.v1_dirs.get("memory"):  # v1: kills in memory.oom_control (Linux 4.13 or later)
                    kills = counted(_read(where / "memory.oom_control"), "oom_kill")
                    # The cap reached: its usage at the limit the kernel holds (the figure rounded down to a page).
                    # v1 tells no OOM of its own limit from one above it; the reason says only what both facts are.
                    limit = _int(_read(where / "memory.limit_in_bytes")) or self.caps.memory_bytes
                    reached = _int(_read(where / "memory.max_usage_in_bytes")) >= limit
                else:  # v2: `oom` counts the cgroup's own limit reached with an allocation about to fail
                    events = _read(where / "memory.events")
                    kills, reached = counted(events, "oom_kill"), counted(events, "oom") > 0
                self.events["oom_kills"] = kills if reached else 0
                if kills and not reached:
                    self.events["oom_kills_not_at_cap"] = kills
            else:
                refused = counted(_read(where / "pids.events"), "max")
                peak = _read(where / "pids.peak").strip()  # Linux 6.1 or later; without it, the count as it is
                # the kernel updates the peak without a lock: one refused at the cap may read a task or two short
                reached = not peak.isdigit() or int(peak) >= self.caps.pids - max(2, self.caps.pids // 100)
                self.events["forks_refused"] = refused if reached else 0
                if refused and not reached:
                    self.events["forks_refused_not_at_cap"] = refused
        return dict(self.events)

    def close(self) -> str:
        """Remove the v1 cgroups (the v2 one is job_cgroup's): "" or why one could not be removed."""
        problems = [why for d in self.v1_dirs.values() if (why := _remove(d))]
        self.v1_dirs, self.cap_dirs = {}, {}
        return "; ".join(problems)

    def report(self) -> dict:
        out: dict = {"memory_max_bytes": self.caps.memory_bytes, "pids_max": self.caps.pids,
                     **({"room_bytes": self.caps.room_bytes} if self.caps.room_bytes else {}),
                     "held": dict(self.held), **({"why": dict(self.why)} if self.why else {})}
        if self.events:
            out["refused"] = dict(self.events)
        return out


def _remove(path: Path) -> str:
    """Remove a v1 cgroup: a process still in it (only one that escaped the v2 cgroup's kill, or where there is
    none) is killed first, pinned by a pidfd and found in the cgroup again before the signal, so that a pid the
    kernel gave to another process meanwhile is never signalled. "" or why not."""
    for _ in range(250):  # 5 s at most
        try:
            path.rmdir()
            return ""
        except FileNotFoundError:
            return ""
        except OSError as exc:
            pids = [int(p) for p in _read(path / "cgroup.procs").split() if p.isdigit()]
            if not pids:
                return f"{path} could not be removed: {exc}"
            for pid in pids:
                _kill_if_still_in(pid, path)
            time.sleep(0.02)
    return f"{path} still held processes 5 s after they were killed"


def _kill_if_still_in(pid: int, path: Path) -> None:
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno == errno.ENOSYS and str(pid) in _read(path / "cgroup.procs").split():  # Linux < 5.3: no pidfd
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return  # else gone
    try:
        if str(pid) in _read(path / "cgroup.procs").split():  # still the process the cgroup holds
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def sweep_orphans(parent: Path, gone: Callable[[str], bool]) -> list[str]:
    """Remove the v1 job cgroups under `parent` whose launcher is gone (`gone`: job_cgroup's rule)."""
    ended = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return ended
    for entry in entries:
        if entry.is_dir() and gone(entry.name):
            _remove(entry)
            ended.append(entry.name)
    return ended


def caps_reached(containment: dict, outside: bool = False) -> str:
    """What a job's caps refused, in a sentence for a reason ("" where nothing was): from a JobCgroup's report.
    `outside`: instead, the kills and refusals that came with the job below its own caps (a limit above it: the
    node's memory, a container's, a SLURM step's), which are never the caps' doing."""
    limits = containment.get("limits") if isinstance(containment, dict) else None
    refused = (limits or {}).get("refused") or {}
    said = []
    if outside:
        if refused.get("oom_kills_not_at_cap"):
            said.append(f"the kernel's out-of-memory killer ended {refused['oom_kills_not_at_cap']} of the job's "
                        "processes while the job was below its own memory cap (the node's memory, or a limit above "
                        "the job, ran out)")
        if refused.get("forks_refused_not_at_cap"):
            said.append(f"a limit above the job (the host's or its container's) refused "
                        f"{refused['forks_refused_not_at_cap']} new process(es) or thread(s) below the job's own cap")
        return "; ".join(said)
    whose = "job_memory_gib, with room for the scorers" if limits and limits.get("room_bytes") else "job_memory_gib"
    if refused.get("oom_kills"):  # both facts hold; on v1 the page cache counts towards reaching the cap
        said.append(f"the job's memory reached its cap of {limits['memory_max_bytes'] / (1 << 30):.2f} GiB (the "
                    f"track's {whose}) and the kernel's out-of-memory killer ended {refused['oom_kills']} of its "
                    "processes")
    if refused.get("forks_refused"):
        said.append(f"the job's cap of {limits['pids_max']} tasks, threads included (the track's job_pids_max), "
                    f"refused {refused['forks_refused']} new process(es) or thread(s)")
    return "; ".join(said)
