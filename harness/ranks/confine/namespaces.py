"""Namespaces for evaluation's model processes: what Landlock does not govern.

Landlock (harness/ranks/confine/sandbox.py) confines files, TCP and signals. It leaves three ways for the
scoring model process to hand its answers to the check process that runs after it: kernel IPC that
outlives a process (System V shared memory and queues, the user's keyring), loopback UDP, and a
process that forks faster than the scorer can look, surviving the scoring process's death. A model
process therefore moves into new user, PID, IPC and network namespaces before anything else runs:

- IPC and keyrings: a new IPC namespace and a new user namespace per model process, so a segment
  or key the scoring process made is not there for the check process;
- network: a new network namespace holds only a loopback that is down: no UDP, no TCP, anywhere;
- processes: the process forks once after unshare; its child is PID 1 of the new PID namespace and
  runs the model, and when it dies (killed by the scorer, or its parent gone) the kernel kills
  every process in the namespace at once, however fast they fork.

Unprivileged user namespaces are allowed on most Linux hosts; where they are not (some distributions
restrict them: Ubuntu 24.04's AppArmor default), the model process runs without them, its sandbox
report says so, and `userns_restriction` names the host's setting that refused them and its fix.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
from pathlib import Path
from typing import Callable, NoReturn

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (0x00020000, 0x08000000, 0x10000000,
                                                                     0x20000000, 0x40000000)
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
FORWARD_POLL_S = 1.0  # the waiting parent's second look at its child where no SIGCHLD came (none is lost: a guard)


def isolate() -> str:
    """Move into new user, PID, IPC and network namespaces; returns "" on success, else why not. On
    success this process has forked: the caller continues in the child (PID 1 of the namespace); the
    parent waits for it and leaves with its exit status, or dies of the signal that ended it, never
    returning. Call single-threaded."""
    if not sys.platform.startswith("linux"):
        return f"namespaces are Linux-only; this is {sys.platform}"
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET) != 0:
        return refused(f"unshare failed: {os.strerror(ctypes.get_errno())}")
    try:
        map_identity(uid, gid)
    except OSError as exc:  # AppArmor's restriction lets unshare succeed, then refuses the map (EPERM)
        return refused(f"could not map the user into its namespace: {exc}")
    held = _hold_for_fork()
    try:
        child = os.fork()
    except OSError:
        _release(held)
        raise
    if child == 0:
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # the parent gone: the namespace goes too
        _release(held)
        return ""
    _wait_and_end_as(child, libc)


PROC_SYS = "/proc/sys"
# The host settings known to refuse (or cripple) unprivileged user namespaces, as (file under /proc/sys, the
# value that restricts, the sysctl's name, what it is, the value that allows them).
USERNS_SYSCTLS = (
    ("kernel/apparmor_restrict_unprivileged_userns", "1", "kernel.apparmor_restrict_unprivileged_userns",
     "AppArmor restricts unprivileged user namespaces (Ubuntu 24.04's default)", "0"),
    ("kernel/unprivileged_userns_clone", "0", "kernel.unprivileged_userns_clone",
     "unprivileged user namespaces are switched off (Debian's switch)", "1"),
    ("user/max_user_namespaces", "0", "user.max_user_namespaces", "user namespaces are switched off", "15000"),
)
USERNS_OTHER_CAUSES = ("no sysctl of this host restricts them: a container's seccomp profile (Docker's default "
                       "refuses unshare) or a security module's policy may; check with `unshare -U -r true` as the "
                       "harness's user")


def userns_restriction_parts(proc_sys: str = PROC_SYS) -> tuple[str, str]:
    """(what on this host refuses or cripples unprivileged user namespaces, its fix); ("", "") when none of
    USERNS_SYSCTLS does. `proc_sys`: where /proc/sys is (tests give a folder of their own). With AppArmor's
    restriction unshare(CLONE_NEWUSER) succeeds and the namespace then has no rights (writing the uid map
    fails with EPERM): only the setting tells the cause."""
    for rel, restricting, name, what, allowing in USERNS_SYSCTLS:
        try:
            value = Path(proc_sys, rel).read_text().strip()
        except (OSError, ValueError):
            continue
        if value != restricting:
            continue
        fix = (f"as root on every node, `sysctl -w {name}={allowing}` (and the line `{name} = {allowing}` in a file "
               "of /etc/sysctl.d/ to keep it after a reboot)")
        if rel.startswith("kernel/apparmor"):
            fix += (f", or an AppArmor profile that grants `userns,` to the harness's Python "
                    f"({os.path.realpath(sys.executable)}), loaded with `apparmor_parser -r`")
        return f"{what}: sysctl {name} = {value}", fix
    return "", ""


def userns_restriction(proc_sys: str = PROC_SYS) -> str:
    """userns_restriction_parts in one sentence: what, then "Fix: ..."; "" when no known setting restricts."""
    what, fix = userns_restriction_parts(proc_sys)
    return f"{what}. Fix: {fix}" if what else ""


def refused(why: str, proc_sys: str = PROC_SYS) -> str:
    """A refused namespace's reason, with the host's restriction and its fix when one is known."""
    cause = userns_restriction(proc_sys)
    return f"{why}; {cause}" if cause else f"{why} (unprivileged user namespaces restricted here? {USERNS_OTHER_CAUSES})"


def map_identity(uid: int, gid: int) -> None:
    """In a new user namespace: the same uid and gid inside as outside (files keep their owner, nothing gains a
    right it did not have), supplementary groups frozen (required to write gid_map unprivileged)."""
    with open("/proc/self/setgroups", "w") as fh:
        fh.write("deny")
    with open("/proc/self/uid_map", "w") as fh:
        fh.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as fh:
        fh.write(f"{gid} {gid} 1")


def _hold_for_fork() -> tuple[set, object]:
    """Before the fork, in the process that will wait: the signals it forwards blocked (one that reached the parent
    before it waits would otherwise end it by default action, and the child with it, PDEATHSIG), and SIGCHLD at its
    default and blocked (inherited as ignored, the kernel would reap a child that ends early and its status would be
    lost). Returns what `_release` restores in the child."""
    old_chld = signal.getsignal(signal.SIGCHLD)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    return signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD}), old_chld


def _release(held: tuple[set, object]) -> None:
    """In the child (or where the fork failed): the mask and SIGCHLD's disposition as they were before."""
    mask, old_chld = held
    if old_chld is not None:  # None: set outside Python, left at the default
        signal.signal(signal.SIGCHLD, old_chld)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _wait_and_end_as(child: int, libc) -> NoReturn:
    """The parent's life after the fork: forward signals to the child, wait for it, and end as it ended
    (its exit status, or killed by the same signal, so that whoever waits for "the model process" or
    "the check process" reads how it ended). Never returns: nothing of the caller runs here.

    The signals to forward stay blocked from before the fork to the end and are taken with sigtimedwait, never by a
    handler: a Python handler runs between two bytecodes, so a signal that landed just before the parent entered
    waitpid waited there, unforwarded, until the child ended by itself (4 SIGTERMs of 1,500 with two busy loops
    beside it; none since: tests/test_namespaces.py). Only an end (an exit or a signal) is copied: a traced child's stop is
    reported too, and is said on stderr, the parent then ending with 1."""
    code = 1
    try:
        # Not dumpable: the child, same user and same user namespace, could otherwise reach this
        # process's files (/proc/<pid>/root: the host's root) where it sees the host's /proc.
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        try:  # a pid, once reaped, may name another process: signals go through a pidfd where there is one
            pidfd = os.pidfd_open(child)
        except (AttributeError, OSError):  # Linux before 5.3
            pidfd = None

        def forward(signum: int) -> None:  # a signal meant for "the model process" reaches the process that runs it
            try:
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, signum)
                else:
                    os.kill(child, signum)
            except OSError:  # it is gone already
                pass

        # The child's end is taken the same way: SIGCHLD at its default and blocked since before the fork
        # (_hold_for_fork), so one that comes after a look at the child is pending.
        taken = {*FORWARDED, signal.SIGCHLD}
        while True:  # nothing but waiting, so the scorer's kill of the session reaches both
            ended, status = os.waitpid(child, os.WNOHANG)  # first: it may have ended already (its SIGCHLD is left)
            if ended == child:
                break
            info = signal.sigtimedwait(taken, FORWARD_POLL_S)  # what arrived since the fork first (term-early)
            if info is not None and info.si_signo != signal.SIGCHLD:
                forward(info.si_signo)
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)  # an int: real-time signals have no name in signal.Signals
            if sig != signal.SIGKILL:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)  # single-threaded: delivered before kill returns (core: not dumpable)
        elif os.WIFEXITED(status):
            code = os.waitstatus_to_exitcode(status) & 0xFF
        else:  # stopped while traced (PTRACE_TRACEME makes this process the tracer): not an end it can copy
            os.write(2, f"harness: the process in the namespace stopped while traced (wait status {status:#x}); "
                        "ended\n".encode())
    except BaseException as exc:  # said where its waiter's log is, before the plain exit 1
        os.write(2, f"harness: the parent of the process in the namespace failed: {type(exc).__name__}: "
                    f"{exc}\n".encode(errors="replace"))
    finally:
        os._exit(code)


def join_job(socket_path: str, work_dir: str | None = None,
             before_waiting: Callable[[], object] | None = None) -> tuple[str, bool]:
    """A training rank enters its job's namespaces (harness/launcher/control/job_namespace.py): a private /dev/shm
    and System V IPC shared with the node's other ranks only, and, where the holder made one, the job's PID
    namespace. Returns ("", whether in the PID namespace) on success, else (why not, False). Call first,
    single-threaded (entering a user namespace requires it). The order matters: the user namespace first (it
    gives the capabilities the others need), then the mount, IPC and PID ones; the working directory is then
    set again (entering a mount namespace resets it).

    Entering a PID namespace moves only the children a process makes next, so this process then forks once, as
    isolate() does: the caller goes on in the child, in the namespace (its /proc the namespace's: os.getpid() and
    /proc/self agree), with every process it starts; the parent, outside, forwards signals, waits for it and
    ends as it ended, so torch elastic's agent, which watches the parent, reads how the rank ended. The parent calls
    `before_waiting` first (the caller's capability drop: it needs none to wait)."""
    import socket

    if not sys.platform.startswith("linux"):
        return f"namespaces are Linux-only; this is {sys.platform}", False
    cwd = work_dir or os.getcwd()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10.0)
            conn.connect(socket_path)
            _msg, fds, _flags, _addr = socket.recv_fds(conn, 16, 4)
    except OSError as exc:
        return f"the job's namespaces could not be reached ({exc})", False
    if len(fds) not in (3, 4):
        for fd in fds:
            os.close(fd)
        return "the job's namespace holder refused this process", False
    libc = ctypes.CDLL(None, use_errno=True)
    kinds = ((CLONE_NEWUSER, "user"), (CLONE_NEWNS, "mount"), (CLONE_NEWIPC, "IPC"), (CLONE_NEWPID, "PID"))
    why = ""
    try:
        for fd, (kind, what) in zip(fds, kinds):
            if libc.setns(fd, kind) != 0:
                why = f"entering the job's {what} namespace failed: {os.strerror(ctypes.get_errno())}"
                break
    finally:
        for fd in fds:
            os.close(fd)
    if why and len(fds) == 4 and kind != CLONE_NEWUSER and kind != CLONE_NEWNS:
        _cannot_go_on(why)  # in PID 1's mount namespace, where this process has no /proc/self: nothing more works
    if why:
        return why, False
    try:
        os.chdir(cwd)
    except OSError as exc:
        if len(fds) == 4:
            _cannot_go_on(f"its working folder could not be entered ({exc.strerror})")
        return f"its working folder could not be entered in the job's namespaces ({exc.strerror})", False
    if len(fds) == 3:
        return "", False
    # The parent's end of a pipe: EOF in the child once the parent is gone (its exit status cannot be asked for from
    # inside the namespace: an orphan goes to the launcher, a subreaper outside it, and getppid() stays 0).
    alive_r, alive_w = os.pipe()
    held = _hold_for_fork()  # as in isolate(): nothing ends the parent unforwarded, no end of the child is lost
    try:
        child = os.fork()
    except OSError as exc:  # PID 1 gone (ENOMEM), the job's task cap (EAGAIN)
        _cannot_go_on(f"no process could be started in the job's PID namespace ({exc.strerror})")
    if child == 0:
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)  # the parent gone (the agent's kill): so is the rank
        os.close(alive_w)
        if select.select([alive_r], [], [], 0)[0]:  # EOF: it died before the line above took effect
            os._exit(1)
        os.close(alive_r)
        # A group of its own: a signal torch elastic's agent sends the parent's group reaches the rank once, forwarded,
        # and a rank's kill(0, ...) reaches its own processes, never the parent.
        os.setpgid(0, 0)
        _release(held)
        return "", True
    os.close(alive_r)  # alive_w stays open for the parent's life
    try:
        if before_waiting is not None:
            before_waiting()
    except Exception:  # noqa: BLE001  (the parent only waits: nothing of it may return to the caller beside its child)
        pass
    _wait_and_end_as(child, libc)


def _cannot_go_on(why: str) -> NoReturn:
    """A rank that entered PID 1's mount namespace and then could not enter the PID namespace or fork into it: it
    cannot start a thread or read /proc/self there, so it says why on its stderr (the agent's log of it, and the
    last line of the crash's reason) and ends."""
    os.write(2, f"harness: this rank could not enter its job's namespaces: {why}\n".encode(errors="replace"))
    os._exit(1)
