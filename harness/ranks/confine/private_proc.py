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

- a procfs of the job's own PID namespace, mounted with hidepid=ptraceable: a process sees, and so can write,
  only the processes it may ptrace, which Landlock's scope limits to its own domain (itself and what it
  started): not another rank, not the job's first process, not the torch elastic agent;
- with every entry beside the processes' folders (sys, sysrq-trigger, irq, driver, fs, ...) bound read-only
  onto itself, so a write there fails with EROFS whoever owns the file;

and to a process that has a network namespace of its own (the check's and the model processes') or does not
write as the host's root: a training rank keeps the host's network, whose files under /proc/<pid>/net (an
xt_recent list of the firewall) the host's root may write.

`mount_private` makes such a /proc (the training job's first process, harness/launcher/control/namespace_holder.py,
and the check's and model processes' own root, harness/ranks/confine/rootfs.py); `hardened` says whether this
process's /proc is one (sandbox.apply asks it before granting). Where the grant cannot be made, it falls
back to the process's own threads (OWN_TASKS): the process itself starts CUDA, what it starts cannot, and
Inductor compiles in the process (compile_in_process).
"""

from __future__ import annotations

import os

# mount(2)'s flags; the calls go through rootfs.Libc, given by the caller (rootfs imports this module)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC = 2, 4, 8, 4096, 0x4000
# ptraceable, not invisible: invisible spares the members of its gid= group (root's unless named), and a group
# named outside the namespace's id map reads back as the overflow gid, which every unmapped supplementary group
# of the process also reads as (Docker's root, a user in `video`): ptraceable asks ptrace alone (Linux 5.8).
HIDEPID = "hidepid=ptraceable"
PROCESS_LINKS = ("self", "thread-self")


def _global_entries(proc: str) -> list[str]:
    """What /proc holds beside the processes' folders, its links to them excepted."""
    return sorted(name for name in os.listdir(proc)
                  if not name.isdigit() and name not in PROCESS_LINKS and not os.path.islink(os.path.join(proc, name)))


def mount_private(libc, target: str, what: str) -> str:
    """Mount the procfs of this process's PID namespace at target, hidepid=ptraceable, its global entries
    read-only. Returns "" when done, else why it is not hardened (the procfs is then mounted without: a
    kernel older than 5.8 refuses hidepid=ptraceable). Raises rootfs.Refused when no procfs could be mounted
    at all. Call it with CAP_SYS_ADMIN over the mount namespace, before capabilities go."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:
        libc.mount("proc", target, "proc", flags, what, HIDEPID)
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


def _mounts(mountinfo: str) -> dict[int, tuple[str, list[str], str, list[str], int]]:
    """id: (mount point, mount options, file system type, super options, parent id), per line of mountinfo."""
    out = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        point = fields[4].replace("\\040", " ")
        out[int(fields[0])] = (point, fields[5].split(","), tail[0], tail[2].split(","), int(fields[1]))
    return out


def _mount_id(path: str) -> int:
    """The id of the mount that path is on, as the kernel resolves it now (fdinfo's mnt_id): the topmost, exactly."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    try:
        with open(f"/proc/self/fdinfo/{fd}") as fh:
            return int(next(line.split()[1] for line in fh if line.startswith("mnt_id:")))
    finally:
        os.close(fd)


def hardened(proc: str = "/proc", mountinfo: str | None = None, mount_id=_mount_id) -> str:
    """"" when the /proc this process sees is one mount_private made, else why not: the mount /proc resolves to
    is a procfs with hidepid=ptraceable, each global entry resolves to a read-only mount, and so does every
    mount beneath /proc."""
    try:
        if mountinfo is None:
            with open(os.path.join(proc, "self", "mountinfo")) as fh:
                mountinfo = fh.read()
        mounts = _mounts(mountinfo)
        entries = _global_entries(proc)
        top_id = mount_id(proc)
        top = mounts.get(top_id)
        on = {name: mounts.get(mount_id(os.path.join(proc, name))) for name in entries}
    except (OSError, StopIteration, ValueError) as exc:
        return f"its /proc could not be read ({getattr(exc, 'strerror', None) or exc})"
    if top is None or top[2] != "proc":
        return f"{proc} is not a procfs of its own"
    if not {HIDEPID, "hidepid=4"} & set(top[3]):
        return f"{proc} shows every process (no {HIDEPID})"
    beneath, grew = {top_id}, True  # the mounts on the procfs, on those, ...: what a path under /proc can reach
    while grew:
        more = {i for i, m in mounts.items() if m[4] in beneath} - beneath
        beneath, grew = beneath | more, bool(more)
    writable = sorted({os.path.join(proc, name) for name, m in on.items() if m is None or "ro" not in m[1]}
                      | {mounts[i][0] for i in beneath - {top_id} if "ro" not in mounts[i][1]})
    if writable:
        return f"{len(writable)} global entries of {proc} are writable ({', '.join(writable[:4])}...)"
    return ""


def runs_as_root() -> bool:
    """Whether this process writes as root: uid 0 here owns the files of the network namespace it keeps under
    /proc/<pid>/net (an xt_recent list of the firewall), the host's where the harness runs as the host's root, a
    container's where a container's root runs it. A training rank keeps that network; root's writes there reach
    beyond the job, so it gets no /proc grant (grant_writes)."""
    return os.geteuid() == 0


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


def grant_writes(ll, write, own_network: bool) -> str:
    """The /proc rule: every process's own files where /proc is the job's own and hardened (CUDA then starts in
    what this process starts too, Inductor's compile workers) and the process either has a network namespace of
    its own or does not run as root (runs_as_root); else this process's own threads' names, and Inductor compiles
    in this process (compile_in_process). Returns what was granted, for the report."""
    why_not = hardened()
    if not why_not and not own_network and runs_as_root():
        why_not = ("it runs as root in a network namespace it shares, whose /proc/<pid>/net files root may write: "
                   "run the harness as an unprivileged user")
    if not why_not:
        ll.add_path_rule("/proc", access=write)
        return ("its processes' own files (a /proc of the job's own: hidepid=ptraceable, its global entries "
                "read-only)")
    own_tasks = _pin_own_tasks()
    if own_tasks:
        ll.add_path_rule(own_tasks, access=write)
    compile_in_process()
    return (f"its own threads' names only: a process it starts cannot start CUDA, so Inductor compiles in this "
            f"process ({why_not})" if own_tasks else f"nothing ({why_not})")


def compile_in_process() -> None:
    """Inductor compiles in the process itself, not in worker processes that could not start CUDA here: its
    variable for what imports Inductor later, its config where it is imported already (harness code or torch
    may have). A team that sets it back gets workers without a GPU: its own compile fails."""
    import sys

    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.compile_threads = 1
