"""The namespace a node's training ranks share: a /dev/shm and System V IPC of the job's own.

Landlock (harness/ranks/confine/sandbox.py) does not govern System V shared memory, semaphores or message
queues, and training ranks must write /dev/shm (NCCL's shared-memory transport, Python's
multiprocessing): whatever one run left there, the next could read (weights left by a first run
were loaded by the team's second). Each training job therefore gets, for its ranks on this node:

- a user namespace (the launcher's uid mapped to itself: files keep their owner);
- a mount namespace, a copy of the host's where /dev/shm is a fresh tmpfs, the ranks' private folder is
  another (sized by the track's scratch_cap_gib, below), and everything but those two and /proc is
  read-only (device files and sockets stay usable on a read-only mount), made in a first user namespace and
  entered through a second one, so the kernel locks it: a rank cannot unmount the tmpfs to find the
  host's /dev/shm beneath, nor make a mount writable again. Read-only mounts refuse what Landlock does
  not govern: extended attributes, modes and times of files the user owns (a run kept its weights in
  the extended attributes of the harness's own files and loaded them in the next);
- an IPC namespace: System V objects and POSIX message queues of the job's own.

The network is the host's (NCCL, InfiniBand). Everything goes away with the last process of the job.

The private folder as a file system of the job's own: a tmpfs of scratch_cap_gib mounted over the launcher's
folder, into which the holder copies what the launcher put there (the submission's copy, the empty logs/ and
staging/ folders, the open division's data links) before any rank exists. The kernel counts every page of
it, named or not (a file opened with O_TMPFILE, a deleted file held open, a sparse file filled later): the
cap is its size, held by the kernel (a write past it fails, ENOSPC: the team's own error), not a figure a walk
of the folder's names estimates, and nothing a team writes there reaches the disk that holds the records. Its
pages are memory, charged to the job's memory cap (job_limits.py). The launcher reaches it through the
holder's root (`/proc/<holder>/root/<folder>`), opened once, before any rank exists (`folder_fd`): the
descriptor keeps the file system alive after the namespace ends, so the logs and the checkpoint are taken
after the job as before, and it goes away when the launcher closes it.

A small process of harness code (this module, run as `python -m harness.launcher.control.job_namespace`)
makes the namespaces before the ranks exist and hands them out: each rank connects to its Unix
socket as its very first act (single-threaded, before the sandbox), receives the three namespace
descriptors (SCM_RIGHTS) and enters them (harness/ranks/confine/namespaces.py `join_job`). The holder
accepts only processes that descend from its launcher (the kernel's SO_PEERCRED pid), as the control
channel does. Where the host forbids user namespaces, the job runs without one, the record says so,
and the launcher removes what the job left in /dev/shm afterwards (`ShmSweep`).
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.launcher.control.channel import peer_pid
from harness.launcher.control.process_tree import descends_from, first_line
from harness.launcher.control.workarea import MAX_ENTRIES
from harness.ranks import interpreter
from harness.ranks.confine.namespaces import CLONE_NEWIPC, CLONE_NEWNS, CLONE_NEWUSER, map_identity, refused
from harness.ranks.confine.rootfs import MOUNT_ATTR_RDONLY, MS_BIND, MS_NODEV, MS_NOSUID, MS_REC, MS_SLAVE, Libc, Refused

PR_SET_PDEATHSIG = 1
READY_WITHIN_S = 20.0


class JobNamespace:
    """The launcher's handle on the holder process. `socket_path` goes into the job file; `active` and
    `why` into the record."""

    def __init__(self, shm_bytes: int = 0, writable: str = "", scratch_bytes: int = 0) -> None:
        """scratch_bytes > 0 (with `writable`): the ranks' private folder becomes a tmpfs of that size (module
        docstring); `folder_fd` then opens it in this process and `live_dir` is where this process reaches it by
        name while the holder lives. Otherwise the folder is the launcher's own, bound onto itself."""
        self.dir = Path(tempfile.mkdtemp(prefix="harness-ns-"))  # 0700: the launcher's user only
        self.socket_path = str(self.dir / "ns.sock")
        self.active, self.why = False, ""
        self.folder_fd: int | None = None
        self.live_dir: Path | None = None
        self.scratch_refused = ""  # why the private folder could not be a tmpfs (the caller tries again without)
        self.proc: subprocess.Popen | None = None
        try:
            self.proc = subprocess.Popen(interpreter.python_argv("harness.launcher.control.job_namespace", self.socket_path, os.getpid(),
                                                                  int(shm_bytes), writable, int(scratch_bytes)),
                                         env=interpreter.child_environment(), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            line = first_line(self.proc, READY_WITHIN_S)
            if line is None:
                line = f"not ready within {READY_WITHIN_S:.0f} s"
        except OSError as exc:
            line = f"could not start: {exc}"
        if line == "ready" and writable and scratch_bytes > 0:
            line = self._open_folder(writable)
            self.scratch_refused = "" if line == "ready" else line
        elif line.startswith(SCRATCH_REFUSED):
            self.scratch_refused = line = line[len(SCRATCH_REFUSED):]
        if line == "ready":
            folder = (f"the private folder a tmpfs of {scratch_bytes / 2**30:.4g} GiB" if self.folder_fd is not None
                      else "the private folder the launcher's, on its disk")
            self.active, self.why = True, (f"user, mount (a private /dev/shm; {folder}; read-only but those and "
                                           "/proc; locked) and IPC namespaces of the job's own")
        else:
            self.why = f"no namespace of the job's own: {line or 'the holder said nothing'}"
            self.close()

    def _open_folder(self, writable: str) -> str:
        """The tmpfs, opened through the holder's root before any rank exists: nothing of the job can have moved
        a mount or left a link yet, and the holder's namespaces are locked. "ready", else why it cannot be reached."""
        live = Path(f"/proc/{self.proc.pid}/root") / os.path.abspath(writable).lstrip("/")
        try:
            fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            return f"the job's private folder could not be reached through its holder: {exc.strerror}"
        try:
            same = os.fstat(fd).st_dev == os.stat(writable).st_dev  # the launcher's own folder: no tmpfs over it
        except OSError as exc:
            same = exc
        if same is not False:
            os.close(fd)
            return f"the job's private folder is not the tmpfs its holder mounted{'' if same is True else f' ({same})'}"
        self.folder_fd, self.live_dir = fd, live
        return "ready"

    def report(self) -> dict:
        return {"active": self.active, "why": self.why, "scratch": "tmpfs" if self.live_dir is not None else "disk"}

    def close(self) -> None:
        """Ends the holder. `folder_fd` stays open (the taker's): the caller closes it (WorkArea.cleanup)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        self.proc = None
        try:
            os.unlink(self.socket_path)
        except OSError:
            pass
        try:
            self.dir.rmdir()
        except OSError:
            pass


class ShmSweep:
    """Without a namespace of the job's own: the /dev/shm entries and the System V objects (shared memory,
    message queues, semaphores) of this user that appeared while the job ran are removed when it ends; one
    that was there before is never touched. (Another job of the same user running beside it on the same
    machine would lose what it made meanwhile: at an event, a node runs one job.)"""

    SYSV = ("shm", "msg", "sem")  # listed in /proc/sysvipc/<kind> (the id in its second column), removed by <kind>ctl

    def __init__(self, root: str = "/dev/shm") -> None:
        self.root = root
        self.before = self._mine()
        self.sysv_before = self._sysv()

    def _mine(self) -> set[str]:
        try:
            return {e.name for e in os.scandir(self.root) if e.stat(follow_symlinks=False).st_uid == os.getuid()}
        except OSError:
            return set()

    def _sysv(self) -> set[tuple[str, int]]:
        found = set()
        for kind in self.SYSV:
            try:
                with open(f"/proc/sysvipc/{kind}") as fh:
                    header = fh.readline().split()
                    uid_col = header.index("uid")
                    for line in fh:
                        cols = line.split()
                        if int(cols[uid_col]) == os.getuid():
                            found.add((kind, int(cols[1])))
            except (OSError, ValueError, IndexError):
                continue
        return found

    def _remove_sysv(self) -> list[str]:
        libc, removed = Libc().c, []
        for kind, ident in sorted(self._sysv() - self.sysv_before):
            call = getattr(libc, f"{kind}ctl")
            args = (ident, 0, 0) if kind == "sem" else (ident, 0, None)  # IPC_RMID = 0
            if call(*args) == 0:
                removed.append(f"System V {kind} {ident}")
        return removed

    def sweep(self) -> list[str]:
        removed = self._remove_sysv()
        for name in sorted(self._mine() - self.before):
            try:
                os.unlink(os.path.join(self.root, name))
                removed.append(name)
            except IsADirectoryError:
                import shutil

                shutil.rmtree(os.path.join(self.root, name), ignore_errors=True)
                removed.append(name)
            except OSError:
                pass
        return removed


# --------------------------------------------------------------------------- the holder process


SHM_INODES = 1_000_000  # files the job's /dev/shm may hold (NCCL's segments and semaphores: a few per rank)


class ScratchRefused(OSError):
    """The private folder could not be made a tmpfs: the holder says so apart (SCRATCH_REFUSED), and the launcher
    starts another without it."""


SCRATCH_REFUSED = "private folder refused: "


SCRATCH_INODES = MAX_ENTRIES + 1  # the private folder's files and folders, and its root


def copy_launcher_tree(src_fd: int, dest: str) -> None:
    """What the launcher put in the private folder (open as src_fd, beneath the tmpfs now mounted on dest), copied
    into the tmpfs: folders, regular files and links (the open division's data links), modes kept, times not. Before
    any rank exists: everything here is the harness's (the submission's copy holds regular files only, at most
    files.MAX_SUBMISSION_ENTRIES). One folder open at a time, however wide or deep the tree."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    pending = [""]
    while pending:
        rel = pending.pop()
        fd = os.open(rel or ".", flags, dir_fd=src_fd)
        try:
            with os.scandir(fd) as it:
                found = [(e.name, e.stat(follow_symlinks=False)) for e in it]
            for name, st in found:
                inner, target = os.path.join(rel, name), os.path.join(dest, rel, name)
                if stat.S_ISDIR(st.st_mode):
                    os.mkdir(target)
                    os.chmod(target, stat.S_IMODE(st.st_mode))  # as it was, whatever the umask
                    pending.append(inner)
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(name, dir_fd=fd), target)
                elif stat.S_ISREG(st.st_mode):
                    with os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd), "rb") as inp, \
                            open(target, "xb") as out:
                        shutil.copyfileobj(inp, out, 1 << 20)
                    os.chmod(target, stat.S_IMODE(st.st_mode))
                else:  # the launcher makes folders, files and links only: anything else is no copy of its folder
                    raise ScratchRefused(errno.EINVAL, f"{inner} is neither a folder, a file nor a link")
        finally:
            os.close(fd)


def make_namespaces(shm_bytes: int = 0, writable: str = "", scratch_bytes: int = 0) -> None:
    """In this (single-threaded) process: the job's namespaces, entered; see the module docstring. The
    job's /dev/shm holds at most shm_bytes (0: the kernel's default, half the memory) and SHM_INODES files;
    with scratch_bytes, `writable` becomes a tmpfs of that size holding a copy of what it held (module docstring).
    Mounts are slaves of the host's, not private: what the host mounts later (autofs, a late NFS) still
    reaches the ranks (writable: a mount made after the job started is not in its read-only set);
    nothing they mount goes back. Everything is then read-only but three mounts, each cleared alone
    (not recursively: a host whose /proc/sys or /sys/fs/cgroup is read-only keeps them so, as the
    kernel requires): the new /dev/shm, `writable` (the ranks' private folder, bound onto itself) and
    /proc (the second user namespace's id maps are written there)."""
    libc = Libc()
    uid, gid = os.getuid(), os.getgid()
    if writable and os.path.realpath(writable).startswith("/dev/shm/"):
        raise OSError(errno.EINVAL, "the ranks' private folder is under /dev/shm, which the job's own tmpfs hides "
                                    "(set HARNESS_SCRATCH_DIR elsewhere)")
    libc.unshare(CLONE_NEWUSER | CLONE_NEWNS, "unshare of the first user and mount namespaces")
    map_identity(uid, gid)
    libc.mount(None, "/", None, MS_REC | MS_SLAVE, "making the mounts slaves of the host's")
    options = f"mode=1777,nr_inodes={SHM_INODES}" + (f",size={shm_bytes}" if shm_bytes > 0 else "")
    libc.mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "a tmpfs on /dev/shm", options)
    if writable and scratch_bytes > 0:  # a file system of the job's own: every page counted, named or not
        try:
            below = os.open(writable, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # before the tmpfs hides it
            # huge=never: 4 KiB pages, as WorkArea.page_bytes counts the copy before any rank starts
            libc.mount("tmpfs", writable, "tmpfs", MS_NOSUID | MS_NODEV, f"a tmpfs on {writable}",
                       f"mode=0700,size={scratch_bytes},nr_inodes={SCRATCH_INODES},huge=never")
            try:
                copy_launcher_tree(below, writable)
            finally:
                os.close(below)
        except (OSError, Refused) as exc:
            raise ScratchRefused(errno.EPERM, str(getattr(exc, "strerror", None) or exc)) from exc
    elif writable:  # its own mount, so that it can stay writable under a read-only root
        libc.mount(writable, writable, None, MS_BIND, f"binding {writable}")
    libc.set_attr("/", MOUNT_ATTR_RDONLY, 0, True, "mount_setattr on /")
    for path in ("/dev/shm", writable, "/proc"):
        if path:
            libc.set_attr(path, 0, MOUNT_ATTR_RDONLY, False, f"mount_setattr on {path}")
    # A second user namespace, with new mount and IPC namespaces: the mounts copied into it are locked
    # (they came from a more privileged namespace), so a rank with every capability in it still cannot
    # unmount the tmpfs. Ranks join these.
    libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC, "unshare of the ranks' namespaces")
    map_identity(uid, gid)


def serve(server: socket.socket, launcher: int) -> None:
    fds = [os.open(f"/proc/self/ns/{name}", os.O_RDONLY) for name in ("user", "mnt", "ipc")]
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        try:
            pid = peer_pid(conn)
            if pid is not None and descends_from(pid, launcher):  # a live rank of this job, nobody else
                socket.send_fds(conn, [b"ns"], fds)
        except OSError:
            pass
        finally:
            conn.close()


def main(argv: list[str]) -> None:
    socket_path, launcher = argv[1], int(argv[2])
    shm_bytes, writable = (int(argv[3]) if len(argv) > 3 else 0), (argv[4] if len(argv) > 4 else "")
    scratch_bytes = int(argv[5]) if len(argv) > 5 else 0
    Libc().c.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the launcher gone: so is the holder
    if os.getppid() != launcher:
        sys.exit(1)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)  # before the namespaces: in them, the launcher's folder is read-only
    server.listen(64)
    try:
        make_namespaces(shm_bytes, writable, scratch_bytes)
    except ScratchRefused as exc:
        print(SCRATCH_REFUSED + " ".join(str(exc.strerror).split()), flush=True)
        sys.exit(1)
    except (OSError, Refused) as exc:
        print(refused(str(getattr(exc, "strerror", None) or exc)), flush=True)  # one line: the record's why
        sys.exit(1)
    serve(server, launcher)


if __name__ == "__main__":
    main(sys.argv)
