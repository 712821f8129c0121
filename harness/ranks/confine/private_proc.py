"""A /proc of the job's own, where a sandboxed process and whatever it starts may write their own files and
nothing global.

CUDA's driver names each thread it starts by writing /proc/self/task/<tid>/comm; refused, cuInit fails with
error 304 ("OS call failed") and no GPU works (seen on the lent H200, harness/ranks/confine/sandbox.py). Landlock
decides by path, from rules made before the process started anything: a process started later (Inductor's
compile workers, `python -m torch._inductor.compile_worker`, which ask CUDA whether a GPU is there before they
compile a kernel; a worker a team spawns) has a /proc/<pid> that no earlier rule names. The one rule that
reaches every process's own files is a rule on /proc. Alone it would also grant, to a process running as
root (whose /proc files these are), /proc/sys (kernel.core_pattern runs a program as root on the host),
/proc/sysrq-trigger and /proc/irq. So it is granted only on a /proc that is

- a procfs of the job's own PID namespace, mounted with hidepid=invisible: a process sees, and so can write,
  only the processes it may ptrace, which Landlock's scope limits to its own domain (itself and what it
  started): not another rank, not the job's first process, not the torch elastic agent;
- with every entry beside the processes' folders (sys, sysrq-trigger, irq, driver, fs, ...) bound read-only
  onto itself, so a write there fails with EROFS whoever owns the file.

`mount_private` makes such a /proc (the training job's first process, harness/launcher/control/namespace_holder.py,
and the check's and model processes' own root, harness/ranks/confine/rootfs.py); `hardened` says whether this
process's /proc is one (sandbox.apply asks it before granting). Where either cannot be had, the grant falls
back to the process's own threads (OWN_TASKS): the process itself starts CUDA, what it starts cannot.
"""

from __future__ import annotations

import os

# mount(2)'s flags; the calls go through rootfs.Libc, given by the caller (rootfs imports this module)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC = 2, 4, 8, 4096, 0x4000
HIDEPID = "hidepid=invisible"
# hidepid spares the members of its gid= group, root's (0) unless named: a harness run as root would see, and
# write, every process. Named instead: a group outside the namespace's id map, which the kernel keeps as the
# invalid group (shown as the overflow gid, 65534): no process is a member of it.
UNMAPPED_GID = 65534
PROCESS_LINKS = ("self", "thread-self")


def _global_entries(proc: str) -> list[str]:
    """What /proc holds beside the processes' folders, its links to them excepted."""
    return sorted(name for name in os.listdir(proc)
                  if not name.isdigit() and name not in PROCESS_LINKS and not os.path.islink(os.path.join(proc, name)))


def mount_private(libc, target: str, what: str) -> str:
    """Mount the procfs of this process's PID namespace at target, hidepid=invisible, its global entries
    read-only. Returns "" when done, else why it is not hardened (the procfs is then mounted without: a
    kernel older than 5.8 refuses hidepid=invisible on a mount of its own). Raises Refused when no procfs
    could be mounted at all (rootfs.Libc's). Call it with CAP_SYS_ADMIN over the mount namespace, before
    capabilities go."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    gid = UNMAPPED_GID if os.getgid() != UNMAPPED_GID else UNMAPPED_GID - 1  # the map holds this process's alone
    try:
        libc.mount("proc", target, "proc", flags, what, f"{HIDEPID},gid={gid}")
    except Exception as exc:  # noqa: BLE001  (rootfs.Refused: then the plain mount, which raises what it raises)
        libc.mount("proc", target, "proc", flags, what)
        return f"a /proc with {HIDEPID} was refused ({exc})"
    try:
        for name in _global_entries(target):
            path = os.path.join(target, name)
            libc.mount(path, path, None, MS_BIND | MS_REC, f"binding {path} onto itself")
            libc.read_only(path, recursive=True)
    except Exception as exc:  # noqa: BLE001  (rootfs.Refused, OSError: said, and nothing is granted on it)
        return f"its global entries could not all be made read-only ({exc})"
    return ""


def _mounts(mountinfo: str) -> list[tuple[int, int, str, list[str], str, list[str]]]:
    """(id, parent id, mount point, mount options, file system type, super options) per line of mountinfo."""
    out = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        out.append((int(fields[0]), int(fields[1]), point, fields[5].split(","), tail[0], tail[2].split(",")))
    return out


def hardened(proc: str = "/proc") -> str:
    """"" when the /proc this process sees is one mount_private made (the topmost mount at /proc a procfs with
    hidepid=invisible or 2 that spares none of this process's groups, and each global entry a read-only mount
    on it), else why not."""
    try:
        with open(os.path.join(proc, "self", "mountinfo")) as fh:
            mounts = _mounts(fh.read())
        entries = _global_entries(proc)
    except OSError as exc:
        return f"its /proc could not be read ({exc.strerror})"
    at_proc = [m for m in mounts if m[2] == proc]
    if not at_proc or at_proc[-1][4] != "proc":
        return f"{proc} is not a procfs of its own"
    proc_id, _, _, _, _, supers = at_proc[-1]
    if not {"hidepid=invisible", "hidepid=2"} & set(supers):
        return f"{proc} shows every process (no {HIDEPID})"
    spared = [int(o[4:]) for o in supers if o.startswith("gid=") and o[4:].isdigit()] or [0]
    if spared[0] in {os.getgid(), os.getegid(), *os.getgroups()}:
        return f"{proc} shows every process to this process's group {spared[0]} (hidepid's gid=)"
    read_only = {m[2] for m in mounts if m[1] == proc_id and "ro" in m[3]}
    writable = [name for name in entries if os.path.join(proc, name) not in read_only]
    if writable:
        return f"{len(writable)} global entries of {proc} are writable ({', '.join(writable[:4])}...)"
    return ""


OWN_TASKS = "/proc/self/task"
_own_tasks_fd: int | None = None  # held for the process's life (see _pin_own_tasks)


def _pin_own_tasks() -> str:
    """This process's /proc/<pid>/task, as the path Landlock's rule is added on, or "" where there is none.
    Landlock keeps a rule on an inode, and procfs makes a new inode for /proc/<pid>/task each time the
    kernel drops its cached entry and looks it up again (memory pressure, minutes into a run): the rule
    would then be gone and a thread started late (NCCL's, a compile worker's) unnamable. An open
    descriptor holds the entry, and with it the inode, for as long as the process lives; not closed
    on exec (a team's script that execs keeps it, and its rule)."""
    global _own_tasks_fd
    try:
        real = os.path.realpath(OWN_TASKS)  # /proc/<pid>/task of the procfs this process sees
        if _own_tasks_fd is not None:
            os.close(_own_tasks_fd)
        _own_tasks_fd = os.open(real, os.O_PATH | os.O_DIRECTORY)
        os.set_inheritable(_own_tasks_fd, True)
        return real
    except (OSError, AttributeError):  # no procfs (another OS, a /proc not mounted): nothing to name
        return ""


def grant_writes(ll, write) -> str:
    """The /proc rule: every process's own files where /proc is the job's own and hardened (private_proc.py:
    CUDA then starts in what this process starts too, Inductor's compile workers), else this process's own
    threads' names. Returns what was granted, for the report."""
    why_not = hardened()
    if not why_not:
        ll.add_path_rule("/proc", access=write)
        return ("its processes' own files (a /proc of the job's own: hidepid=invisible, its global entries "
                "read-only)")
    own_tasks = _pin_own_tasks()
    if own_tasks:
        ll.add_path_rule(own_tasks, access=write)
    return (f"its own threads' names only: a process it starts cannot start CUDA ({why_not})" if own_tasks
            else f"nothing ({why_not})")
