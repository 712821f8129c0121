"""The job's namespace holder: a small process of harness code, run as
`python -m harness.launcher.control.namespace_holder` by the launcher's JobNamespace (job_namespace.py, whose docstring
has the design), before any rank exists. It makes the job's user, mount, IPC and PID namespaces and the ranks'
private tmpfs, forks PID 1 of the PID namespace (JobInit), hands the namespaces to the job's ranks over its Unix
socket, and ends PID 1, so every process of the namespace, when the launcher closes its stdin. No team code runs
here; what it reads from a rank is only the kernel's word for who connected (SO_PEERCRED).
"""

from __future__ import annotations

import errno
import json
import os
import select
import selectors
import shutil
import signal
import socket
import stat
import sys

from harness.launcher.control.channel import peer_pid
from harness.launcher.control.process_tree import descends_from
from harness.launcher.control.workarea import MAX_ENTRIES
from harness.ranks.confine.namespaces import CLONE_NEWIPC, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER, map_identity, refused
from harness.ranks.confine.private_proc import mount_private
from harness.ranks.confine.rootfs import (MOUNT_ATTR_RDONLY, MS_BIND, MS_NODEV, MS_NOSUID, MS_REC, MS_SLAVE, Libc,
                                          Refused)

PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
# The lines it says to the launcher on its stdout (JobNamespace reads them)
READY = "ready"
NO_PID_NAMESPACE = "ready without a PID namespace: "  # where the kernel refused one (or PID_OFF_ENV turned it off)
SCRATCH_REFUSED = "private folder refused: "
LOST = "lost: "  # PID 1 ended before the launcher ended the job
PID_OFF_ENV = "HARNESS_PID_NAMESPACE"  # "off": no PID namespace for the job (a cluster where it misbehaves)
READY_WITHIN_S = 20.0  # the launcher's wait for READY
INIT_READY_WITHIN_S = 12.0  # PID 1's mounts (a loaded machine): within READY_WITHIN_S, so that its reason is the one read



SHM_INODES = 1_000_000  # files the job's /dev/shm may hold (NCCL's segments and semaphores: a few per rank)


class ScratchRefused(OSError):
    """The private folder could not be made a tmpfs: the holder says so apart (SCRATCH_REFUSED), and the launcher
    starts another without it."""



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
            # its global entries read-only and hidepid=ptraceable (private_proc.py), so that the ranks and whatever
            # they start may write their own processes' files (CUDA names its threads there) and nothing else. Where it
            # cannot be hardened, each rank's sandbox finds so (private_proc.hardened) and grants its own threads only.
            mount_private(libc, "/proc", "a /proc of the job's PID namespace")
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


def read_settings() -> dict:
    """The launcher's one line on stdin (JobNamespace), read unbuffered: after it the launcher writes nothing, and
    stdin's end (readable, in serve) is the end of the job. Anything past the line breaks that protocol."""
    data = b""
    while b"\n" not in data:
        chunk = os.read(0, 4096)
        if not chunk:
            sys.exit(1)  # the launcher went before saying anything
        data += chunk
    line, _, rest = data.partition(b"\n")
    if rest:
        sys.exit(1)
    return json.loads(line)


def main() -> None:
    Libc().c.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)  # the launcher gone: so is the holder
    settings = read_settings()
    socket_path, launcher = str(settings["socket_path"]), int(settings["launcher"])
    shm_bytes, writable = int(settings.get("shm_bytes", 0)), str(settings.get("writable", ""))
    scratch_bytes, pids = int(settings.get("scratch_bytes", 0)), settings.get("pids", "on") != "off"
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
    main()
