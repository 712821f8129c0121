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
- an IPC namespace: System V objects and POSIX message queues of the job's own;
- a PID namespace, whose first process (`job_init`, PID 1 in it) mounts a /proc of the namespace in a mount
  namespace of its own, a copy of the above with its mounts still locked, which is the one the ranks enter. Each rank
  enters it and forks once (harness/ranks/confine/namespaces.py `join_job`): the rank's code runs in the child,
  and everything it starts, however fast it forks or whatever session it leaves for, stays in the namespace.
  When the job ends the holder kills PID 1, and the kernel ends every process in the namespace before the
  holder's wait for it returns: the job's processes cannot outlive it, with or without a cgroup of the job's own
  (job_cgroup.py, which caps them and ends them first where it can be made). Where the kernel refuses the PID
  namespace or its /proc, the job runs without it and the record says why (`pid_why`).

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
socket as its very first act (single-threaded, before the sandbox), receives the namespace descriptors
(SCM_RIGHTS: user, mount, IPC, and PID where there is one) and enters them (harness/ranks/confine/namespaces.py `join_job`). The holder
accepts only processes that descend from its launcher (the kernel's SO_PEERCRED pid), as the control
channel does. Where the host forbids user namespaces, the job runs without one, the record says so,
and the launcher removes what the job left in /dev/shm afterwards (`ShmSweep`).
"""

from __future__ import annotations

import errno
import os
import select
import selectors
import shutil
import signal
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
from harness.ranks.confine.namespaces import CLONE_NEWIPC, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, map_identity, refused
from harness.ranks.confine.rootfs import (MOUNT_ATTR_RDONLY, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_REC, MS_SLAVE, Libc,
                                          Refused)

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
READY_WITHIN_S = 20.0
READY = "ready"
# "off": no PID namespace for the job (a cluster where it misbehaves; the tests of the host that refuses one)
PID_OFF_ENV = "HARNESS_PID_NAMESPACE"
NO_PID_NAMESPACE = "ready without a PID namespace: "  # the holder's line where the kernel refused one
END_WITHIN_S = 10.0  # the holder's kill of PID 1, and the kernel's end of every process in the namespace
INIT_READY_WITHIN_S = 12.0  # PID 1's mounts (a loaded machine): within the launcher's READY_WITHIN_S, so that its reason is the one read
LOST = "lost: "  # the holder's line where PID 1 ended before the launcher ended the job


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
        self.pid_why = ""  # why the job has no PID namespace of its own ("" where it has one)
        self.lost = ""  # why the job's PID namespace ended before the launcher ended it ("" where it did not)
        self.proc: subprocess.Popen | None = None
        try:
            pids = "off" if os.environ.get(PID_OFF_ENV, "").lower() == "off" else "on"
            self.proc = subprocess.Popen(interpreter.python_argv("harness.launcher.control.job_namespace", self.socket_path, os.getpid(),
                                                                  int(shm_bytes), writable, int(scratch_bytes), pids),
                                         env=interpreter.child_environment(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            line = first_line(self.proc, READY_WITHIN_S)
            if line is None:
                line = f"not ready within {READY_WITHIN_S:.0f} s"
        except OSError as exc:
            line = f"could not start: {exc}"
        if line.startswith(NO_PID_NAMESPACE):
            self.pid_why, line = line[len(NO_PID_NAMESPACE):] or "refused", READY
        if line == "ready" and writable and scratch_bytes > 0:
            line = self._open_folder(writable)
            self.scratch_refused = "" if line == "ready" else line
        elif line.startswith(SCRATCH_REFUSED):
            self.scratch_refused = line = line[len(SCRATCH_REFUSED):]
        if line == "ready":
            folder = (f"the private folder a tmpfs of {scratch_bytes / 2**30:.4g} GiB" if self.folder_fd is not None
                      else "the private folder the launcher's, on its disk")
            pids = "no PID namespace" if self.pid_why else "PID (a /proc of its own)"
            self.active, self.why = True, (f"user, mount (a private /dev/shm; {folder}; read-only but those and "
                                           f"/proc; locked), IPC and {pids} namespaces of the job's own")
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
        out = {"active": self.active, "why": self.why, "scratch": "tmpfs" if self.live_dir is not None else "disk",
               "pid_namespace": self.active and not self.pid_why}
        if self.active and self.pid_why:
            out["pid_why"] = self.pid_why
        return out

    def end_job(self) -> None:
        """Ends the holder, and with it every process of the job's PID namespace: told by the end of its stdin (which
        only this process holds: a SIGTERM sent to every process of the launcher's cgroup, systemd's or a scheduler's,
        is ignored, so that the launcher's own graceful teardown runs first), it kills the namespace's PID 1 and
        waits for it, which the kernel lets return only once every process in the namespace is gone. Killed outright
        past END_WITHIN_S (a process the kernel cannot end at once, stuck in a file system): PID 1 then dies with it
        (PDEATHSIG), and the kernel ends the namespace all the same, unwaited. Sets `lost` where the holder said PID 1
        had ended before it was told to end it."""
        if self.proc is None or self.proc.stdout is None or self.proc.stdout.closed:  # never started, or ended already
            return
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if not self.active and self.proc.poll() is None:  # it never served (refused, or not ready): no job to end
            self.proc.kill()
        try:
            self.proc.wait(END_WITHIN_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            said = self.proc.stdout.read(4000).decode(errors="replace")  # it has exited: what is left, then EOF
            self.proc.stdout.close()
            lost = [line[len(LOST):] for line in said.splitlines() if line.startswith(LOST)]
            self.lost = self.lost or (lost[0] if lost else "")

    def close(self) -> None:
        """end_job, then the holder's socket and folder. `folder_fd` stays open (the taker's): the caller closes it
        (WorkArea.cleanup)."""
        self.end_job()
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


def make_namespaces(shm_bytes: int = 0, writable: str = "", scratch_bytes: int = 0, pids: bool = True) -> str:
    """In this (single-threaded) process: the job's namespaces, entered; see the module docstring. The
    job's /dev/shm holds at most shm_bytes (0: the kernel's default, half the memory) and SHM_INODES files;
    with scratch_bytes, `writable` becomes a tmpfs of that size holding a copy of what it held (module docstring).
    Mounts are slaves of the host's, not private: what the host mounts later (autofs, a late NFS) still
    reaches the ranks (writable: a mount made after the job started is not in its read-only set);
    nothing they mount goes back. Everything is then read-only but three mounts, each cleared alone
    (not recursively: a host whose /proc/sys or /sys/fs/cgroup is read-only keeps them so, as the
    kernel requires): the new /dev/shm, `writable` (the ranks' private folder, bound onto itself) and
    /proc (the second user namespace's id maps are written there). Returns "" when the ranks' namespaces include a
    PID namespace (its first process: JobInit), else why the kernel refused one."""
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
    # A second user namespace, with new mount, IPC and PID namespaces: the mounts copied into it are locked
    # (they came from a more privileged namespace), so a rank with every capability in it still cannot
    # unmount the tmpfs. Ranks join these (the mount namespace: PID 1's copy of it, JobInit).
    pid_why = "" if pids else f"turned off ({PID_OFF_ENV}=off)"
    try:
        if pid_why:
            raise Refused(pid_why)
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWPID, "unshare of the ranks' namespaces")
    except Refused as exc:  # a kernel or a container's profile that refuses PID namespaces: the others alone
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC, "unshare of the ranks' namespaces")
        pid_why = str(exc)
    map_identity(uid, gid)
    return pid_why


class JobInit:
    """PID 1 of the job's PID namespace, forked by the holder once its namespaces are made. In a mount namespace
    of its own (a copy of the holder's, so its mounts stay locked) it mounts a /proc of the PID namespace over the
    host's, which the ranks then see: only the job's processes, and the numbers os.getpid() gives them (a library
    that reads /proc/<its pid> reads its own). It then reaps the processes the namespace's orphans leave, until
    the holder kills it; the kernel then ends every process in the namespace."""

    def __init__(self, libc: Libc) -> None:
        self.pid, self.why, self.mnt_fd = 0, "", -1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # PID 1 -> holder: "ok" and its mount
        alive_r, self._alive_w = os.pipe()  # held by the holder for its life: PID 1 reads its end (EOF) if it dies
        try:
            pid = os.fork()
        except OSError as exc:  # the job runs without the PID namespace, and the record says why
            for end in (ours, theirs):
                end.close()
            os.close(alive_r)
            os.close(self._alive_w)
            self.why = f"the namespace's first process could not be started ({exc.strerror})"
            return
        if pid == 0:
            ours.close()
            os.close(self._alive_w)
            self._run(libc, theirs.detach(), alive_r)
        theirs.close()
        os.close(alive_r)
        try:
            with ours:
                ours.settimeout(INIT_READY_WITHIN_S)
                msg, fds, _flags, _addr = socket.recv_fds(ours, 600, 1)
            answer = msg.decode(errors="replace")
        except OSError as exc:
            answer, fds = f"the namespace's first process did not answer ({exc})", []
        self.pid = pid
        if answer == "ok" and len(fds) == 1:
            self.mnt_fd = fds[0]
        else:
            for fd in fds:
                os.close(fd)
            self.why = answer if answer and answer != "ok" else "the namespace's first process ended before it said it was ready"
            self.end()

    @staticmethod
    def _run(libc: Libc, told_w: int, alive_r: int) -> None:
        from harness.ranks.confine.rootfs import drop_capabilities

        try:
            libc.c.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # the holder gone: PID 1, so the namespace
            if select.select([alive_r], [], [], 0)[0]:  # it went before the line above took effect
                os._exit(1)
            # Seen by the ranks as their PID 1: nothing of it may be read or written through /proc/1 (its memory would
            # give a rank this process's capabilities in the job's user namespace), none of the holder's descriptors
            # stays open, and a signal from the namespace has no handler to reach (the kernel drops it for PID 1).
            libc.c.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):  # the holder's: its stdin and stdout are the launcher's pipes
                os.dup2(null, fd)
            os.close(null)
            low, high = sorted((told_w, alive_r))
            os.closerange(3, low)
            os.closerange(low + 1, high)
            os.closerange(high + 1, max(os.sysconf("SC_OPEN_MAX"), high + 1, 1 << 16))
            libc.unshare(CLONE_NEWNS, "unshare of the ranks' mount namespace")
            libc.mount(None, "/", None, MS_REC | MS_SLAVE, "making the mounts slaves")  # nothing goes back
            libc.mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "a /proc of the job's PID namespace")
            dropped = drop_capabilities()
            if dropped:
                raise OSError(errno.EPERM, f"its capabilities could not be dropped ({dropped})")
            told = socket.socket(fileno=told_w)
            mnt = os.open("/proc/self/ns/mnt", os.O_RDONLY)  # the holder cannot open it: this process is not dumpable
            socket.send_fds(told, [b"ok"], [mnt])
            os.close(mnt)
            told.close()
        except BaseException as exc:  # noqa: BLE001  (said to the holder, which runs the job without it)
            os.write(told_w, " ".join(str(getattr(exc, "strerror", None) or exc).split())[:600].encode())
            os._exit(1)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
        while True:  # the namespace's reaper: an orphan's exit status, taken as soon as it is there
            try:
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            except ChildProcessError:
                pass
            signal.sigtimedwait({signal.SIGCHLD}, 1.0)

    def end(self) -> None:
        """Kill PID 1 and wait for it: the kernel returns the wait once every process of the namespace is gone."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.pid = 0


def serve(server: socket.socket, launcher: int, pid_why: str) -> None:
    """Hand the namespaces to the job's ranks. With a PID namespace: PID 1 started first (JobInit), the ranks given
    its mount namespace (with the namespace's /proc) and the PID namespace. The end of stdin (the launcher's end_job)
    ends PID 1, so the namespace, then the holder; PID 1 ending first is said (LOST) and ends the holder."""
    libc = Libc()
    init = None
    if not pid_why:
        init = JobInit(libc)
        pid_why = init.why
    if init is not None and not init.why:
        # the holder's /proc is the host's (PID 1 mounted the job's in its own mount namespace only)
        fds = [os.open("/proc/self/ns/user", os.O_RDONLY), init.mnt_fd]
        fds += [os.open(f"/proc/self/ns/{name}", os.O_RDONLY) for name in ("ipc", "pid_for_children")]
        print(READY, flush=True)
    else:
        fds = [os.open(f"/proc/self/ns/{name}", os.O_RDONLY) for name in ("user", "mnt", "ipc")]
        print(NO_PID_NAMESPACE + " ".join(pid_why.split()), flush=True)
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    sel.register(0, selectors.EVENT_READ)  # the launcher's pipe: its end (EOF) says the job is over
    while True:
        ready = {key.fileobj for key, _ in sel.select(0.5)}
        if init is not None and init.pid and os.waitpid(init.pid, os.WNOHANG)[0] == init.pid:
            init.pid = 0  # nothing may enter a namespace whose processes the kernel has ended
            print(LOST + "PID 1 of the job's PID namespace ended while the job ran (killed from outside the job): the "
                  "kernel ended every process in the namespace", flush=True)
            os._exit(3)
        if 0 in ready:
            if init is not None:
                init.end()
            os._exit(0)
        if server not in ready:
            continue
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
    pids = argv[6] != "off" if len(argv) > 6 else True
    Libc().c.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the launcher gone: so is the holder
    # Ended by the launcher only (end_job): a SIGTERM to every process of the launcher's cgroup must not end the job's
    # processes before the launcher's own teardown has given them shutdown_timeout_s.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.getppid() != launcher:
        sys.exit(1)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_path)  # before the namespaces: in them, the launcher's folder is read-only
    server.listen(64)
    try:
        pid_why = make_namespaces(shm_bytes, writable, scratch_bytes, pids)
    except ScratchRefused as exc:
        print(SCRATCH_REFUSED + " ".join(str(exc.strerror).split()), flush=True)
        sys.exit(1)
    except (OSError, Refused) as exc:
        print(refused(str(getattr(exc, "strerror", None) or exc)), flush=True)  # one line: the record's why
        sys.exit(1)
    serve(server, launcher, pid_why)


if __name__ == "__main__":
    main(sys.argv)
