"""A root filesystem of only what the process may read: what Landlock does not govern, by path.

Landlock (harness/ranks/confine/sandbox.py) decides which files a process may open. It does not govern
changing a file's metadata by path (chmod, utime, setxattr: a team's code could make another team's
record or the validation shards unreadable, if its user owns them), nor connect() to a Unix socket
by path (a daemon that runs commands: a terminal multiplexer, a message bus). An evaluation model
process, once in its own user, PID and network namespaces (harness/ranks/confine/namespaces.py), therefore
also moves into its own mount namespace and a new root that holds exactly the policy's paths:

- every path it may read (the Python installation, the system's folders, the submission, the
  checkpoint) and every device file, bound read-only, recursively: chmod, utime and setxattr fail
  with EROFS whatever the files' owner; the policy's hidden folders (the Python test suites) under
  an empty read-only tmpfs each;
- its private folder, bound read-write, and a /dev/shm of its own (a fresh tmpfs of at most
  SHM_BYTES, never the host's, where other processes could leave or find what it writes:
  multiprocessing's locks and pools, so Inductor's compile pool, need one, sem_open makes its
  semaphores there): the only places it can change anything;
- a /proc of its own PID namespace (its own processes only; no /proc/<pid>/root into another
  process's files; harness/ranks/confine/private_proc.py: hidepid=ptraceable, every global entry
  read-only), or, where the kernel refuses a new one, the old /proc read-only;
- nothing else: /tmp, /run, /var and the home folders, with the sockets daemons listen on there, the
  runs tree, the leaderboard and the validation shards are not in this root at all.

The new root is a tmpfs (read-only once built) made inside the private folder, entered with
pivot_root; the old root is detached. Where any step fails (an older kernel, a restricted host),
`confine` says why and the process keeps the old root; its sandbox report and the run record say
so. Call it single-threaded, in the child that isolate() returns in.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from harness.ranks.confine import private_proc
from harness.ranks.confine.namespaces import CLONE_NEWNS

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE, MS_SLAVE = 1, 2, 4, 8, 4096, 0x4000, 1 << 18, 1 << 19
MNT_DETACH = 2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY = 0x1
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_MOUNT_SETATTR = 442  # the same number on x86_64 and aarch64 (a syscall newer than the unified table)


SHM = "/dev/shm"
# Its /dev/shm: semaphores take a page each, a DataLoader's shared batches what they hold; every file
# it writes is capped anyway (logs.FILE_CAP_BYTES). Pages are charged to the process's memory.
SHM_BYTES, SHM_INODES = 1 << 30, 10_000


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


class Refused(Exception):
    pass


class Libc:
    """The mount calls of the sandbox's root (here) and of the training job's namespace holder
    (harness/launcher/control/job_namespace.py); each raises Refused saying what the kernel refused."""

    def __init__(self) -> None:
        self.c = ctypes.CDLL(None, use_errno=True)
        self.c.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
        self.c.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        self.c.syscall.restype = ctypes.c_long

    def _check(self, result: int, what: str) -> None:
        if result != 0:
            raise Refused(f"{what}: {os.strerror(ctypes.get_errno())}")

    def unshare(self, flags: int, what: str) -> None:
        self._check(self.c.unshare(flags), what)

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, what: str,
              data: str | None = None) -> None:
        enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
        self._check(self.c.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), what)

    def set_attr(self, target: str, attr_set: int, attr_clr: int, recursive: bool, what: str) -> None:
        """mount_setattr(2) on the mount at target (and every mount beneath it, if recursive)."""
        attr = _MountAttr(attr_set, attr_clr, 0, 0)
        self._check(self.c.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, os.fsencode(target),
                                   AT_RECURSIVE if recursive else 0, ctypes.byref(attr), ctypes.sizeof(attr)), what)

    def read_only(self, target: str, recursive: bool) -> None:
        self.set_attr(target, MOUNT_ATTR_RDONLY, 0, recursive, f"read-only {target}")

    def pivot_root(self, new_root: str, put_old: str) -> None:
        number = SYS_PIVOT_ROOT.get(os.uname().machine)
        if number is None:
            raise Refused(f"pivot_root: unknown syscall number on {os.uname().machine}")
        self._check(self.c.syscall(number, os.fsencode(new_root), os.fsencode(put_old)), "pivot_root")


def _depth(path: str) -> int:
    return len(Path(path).parts)


def _bind_list(policy) -> list[tuple[str, bool]]:
    """(path, writable) for every path the new root holds, parents before children."""
    wanted = [(p, False) for p in (*policy.read_dirs, *policy.read_files, *policy.device_files) if p != "/proc"]
    wanted += [(p, True) for p in policy.write_dirs]
    out, seen = [], set()
    queue = [(os.path.abspath(p), w) for p, w in wanted]
    while queue:
        path, writable = queue.pop()
        if (path, writable) in seen or not os.path.lexists(path):
            continue
        seen.add((path, writable))
        out.append((path, writable))
        if os.path.islink(path):  # kept as a link; what it points to is bound too (each hop of a chain)
            hop = os.path.normpath(os.path.join(os.path.realpath(os.path.dirname(path)), os.readlink(path)))
            queue.append((hop, writable))
    return sorted(out, key=lambda pw: (_depth(pw[0]), pw[1], pw[0]))


def confine(policy, cwd: str | None = None) -> tuple[str, str]:
    """Enter a new mount namespace and a root of the policy's paths only. Returns ("", what /proc is)
    on success, else (why not, ""). The caller then calls drop_capabilities, whatever happened: in
    its user namespace the process has them all, and with them it could clear the read-only flags it
    set itself (mount_setattr has no Landlock hook), unmount a bind or mount over one."""
    if not sys.platform.startswith("linux"):
        return f"mount namespaces are Linux-only; this is {sys.platform}", ""
    if not policy.write_dirs:
        return "the policy names no private folder to build the new root in", ""
    libc = Libc()
    cwd = cwd or os.getcwd()
    root = os.path.join(policy.write_dirs[0], ".root")
    try:
        proc_note, why = _build_and_enter(libc, policy, root), ""
    except (Refused, OSError) as exc:
        proc_note, why = "", f"no root of its own ({exc})"
        # A half-built root must not stay: a bind not yet read-only would be writable through the
        # private folder, where Landlock allows writing. Detaching the tmpfs takes every bind with it.
        libc.c.umount2(os.fsencode(root), MNT_DETACH)
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir(policy.write_dirs[0] if os.path.isdir(policy.write_dirs[0]) else "/")
    return why, proc_note


def _build_and_enter(libc: Libc, policy, root: str) -> str:
    libc.unshare(CLONE_NEWNS, "unshare of the mount namespace")
    libc.mount(None, "/", None, MS_REC | MS_PRIVATE, "making the mounts private")  # nothing propagates out
    os.makedirs(root, exist_ok=True)
    libc.mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "a tmpfs for the new root")
    bound: list[tuple[str, bool]] = []
    for path, writable in _bind_list(policy):
        target = root + path
        covered = any(path == b or path.startswith(b.rstrip("/") + "/") for b, w in bound if w == writable)
        if os.path.islink(path):
            if not os.path.lexists(target):
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.symlink(os.readlink(path), target)
            continue
        if covered:
            continue  # already there through a bound parent, with the same rights
        if os.path.isdir(path):
            os.makedirs(target, exist_ok=True)
        elif not os.path.exists(target):
            os.makedirs(os.path.dirname(target), exist_ok=True)
            open(target, "a").close()  # a file to bind a file on
        if writable:  # without what is mounted beneath (the new root itself is, in the private folder)
            libc.mount(path, target, None, MS_BIND, f"binding {path}")
        else:  # with what is mounted beneath (/sys), all read-only, before anything writable is bound inside
            libc.mount(path, target, None, MS_BIND | MS_REC, f"binding {path}")
            libc.read_only(target, recursive=True)
        bound.append((path, writable))
    for hidden in getattr(policy, "hidden", ()):  # an empty, read-only folder over each (the Python test suites)
        if os.path.isdir(root + hidden):
            libc.mount("tmpfs", root + hidden, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                       f"hiding {hidden}")
    shm = root + SHM  # over whatever was bound there: the host's is never this process's
    os.makedirs(shm, exist_ok=True)
    libc.mount("tmpfs", shm, "tmpfs", MS_NOSUID | MS_NODEV, f"a {SHM} of its own",
               f"mode=1777,size={SHM_BYTES},nr_inodes={SHM_INODES}")
    proc = root + "/proc"
    os.makedirs(proc, exist_ok=True)
    try:
        unhardened = private_proc.mount_private(libc, proc, "a /proc of its own")
        proc_note = "a /proc of its own PID namespace" + (f" ({unhardened})" if unhardened else
                                                          f", {private_proc.HIDEPID}, its global entries read-only")
    except Refused as exc:  # hosts that mask parts of /proc refuse a new one to a user namespace
        libc.mount("/proc", proc, None, MS_BIND | MS_REC, "binding /proc")
        libc.read_only(proc, recursive=True)
        proc_note = f"the host's /proc, read-only: a new one was refused ({exc})"
    old = os.path.join(root, ".old-root")
    os.makedirs(old, exist_ok=True)
    libc.pivot_root(root, old)
    os.chdir("/")
    libc._check(libc.c.umount2(b"/.old-root", MNT_DETACH), "detaching the old root")
    os.rmdir("/.old-root")
    libc.read_only("/", recursive=False)  # the tmpfs itself: no new files beside the bound paths
    return proc_note


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


PR_CAPBSET_DROP, LINUX_CAPABILITY_VERSION_3 = 24, 0x20080522
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}


def drop_capabilities(libc: Libc | None = None, verify: bool = True) -> str:
    """No capability, now or after an exec (no new privileges, the bounding set emptied, then effective,
    permitted and inheritable set to nothing); "" when done, else why not. A new user namespace made
    later gets capabilities again, but only over copies of these mounts, which the kernel then locks:
    read-only stays read-only."""
    if not sys.platform.startswith("linux"):
        return f"capabilities are Linux's; this is {sys.platform}"
    try:
        _drop(libc or Libc(), verify)
    except Refused as exc:
        return str(exc)
    return ""


PR_SET_NO_NEW_PRIVS = 38


def _drop(libc: Libc, verify: bool = True) -> None:
    libc._check(libc.c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for cap in range(64):  # past the kernel's last capability the call fails with EINVAL: nothing to drop
        libc.c.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    number = SYS_CAPSET.get(os.uname().machine)
    if number is None:
        raise Refused(f"capset: unknown syscall number on {os.uname().machine}")
    data = (_CapData * 2)()
    libc._check(libc.c.syscall(number, ctypes.byref(_CapHeader(LINUX_CAPABILITY_VERSION_3, 0)), data), "capset")
    # Checked, not assumed (verify=False: a process without a /proc/self, in a PID namespace it is not in). The
    # bounding set may stay full where the process could not empty it (no CAP_SETPCAP: then it had nothing to
    # lose), and no_new_privs means no exec can raise it again.
    if not verify:
        return
    with open("/proc/self/status") as fh:
        left = [line.split()[0] for line in fh if line.startswith(("CapEff", "CapPrm"))
                and int(line.split()[1], 16) != 0]
    if left:
        raise Refused(f"capabilities left after dropping them: {', '.join(left)}")


def describe(proc_note: str) -> str:
    return (f"a root of the policy's paths only, read-only but the private folder and a {SHM} of its own; "
            f"{proc_note}; no capabilities")
