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

A small process of harness code (harness/launcher/control/namespace_holder.py, run as its own process)
makes the namespaces before the ranks exist and hands them out: each rank connects to its Unix
socket as its very first act (single-threaded, before the sandbox), receives the namespace descriptors
(SCM_RIGHTS: user, mount, IPC, and PID where there is one) and enters them (harness/ranks/confine/namespaces.py `join_job`). The holder
accepts only processes that descend from its launcher (the kernel's SO_PEERCRED pid), as the control
channel does. Where the host forbids user namespaces, the job runs without one, the record says so,
and the launcher removes what the job left in /dev/shm afterwards (`ShmSweep`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from harness.launcher.control.namespace_holder import (LOST, NO_PID_NAMESPACE, PID_OFF_ENV, READY, READY_WITHIN_S,
                                                       SCRATCH_REFUSED)
from harness.launcher.control.process_tree import first_line, reap_adopted_from_deeper_namespaces
from harness.ranks import interpreter
from harness.ranks.confine.rootfs import Libc

END_WITHIN_S = 10.0  # the holder's kill of PID 1, and the kernel's end of every process in the namespace


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
        self.unended = ""  # what of the job's PID namespace was still dying when end_job gave up waiting for it
        self.proc: subprocess.Popen | None = None
        try:
            pids = "off" if os.environ.get(PID_OFF_ENV, "").lower() == "off" else "on"
            self.proc = subprocess.Popen(interpreter.python_argv("harness.launcher.control.namespace_holder"),
                                         env=interpreter.child_environment(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            # On its stdin, not its command line: PID 1 of the job is a fork of the holder, and every rank reads
            # /proc/1/cmdline (the socket's path, the launcher's pid, the private folder's).
            try:
                self.proc.stdin.write(json.dumps({"socket_path": self.socket_path, "launcher": os.getpid(),
                                                  "shm_bytes": int(shm_bytes), "writable": os.fspath(writable),
                                                  "scratch_bytes": int(scratch_bytes), "pids": pids}).encode() + b"\n")
                self.proc.stdin.flush()
            except BrokenPipeError:  # it ended at once: what it printed (first_line) says why
                pass
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
        past END_WITHIN_S (a process the kernel cannot end at once, stuck in a file system): PID 1, already dying,
        becomes the launcher's to reap, and is waited for once more within the same bound; `unended` says what was
        still dying after that. Sets `lost` where the holder said PID 1 had ended before it was told to end it."""
        if self.proc is None or self.proc.stdout is None or self.proc.stdout.closed:  # never started, or ended already
            return
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if not self.active and self.proc.poll() is None:  # it never served (refused, or not ready): no job to end
            self.proc.kill()
        # While PID 1 dies, the launcher (a subreaper) may hold a process of the namespace whose parent, outside it,
        # ended first (a rank's outer process, ended by the teardown before the child it forked into the namespace):
        # PID 1 cannot finish dying until that child is reaped, so it is reaped here as the holder's wait goes on.
        # Unreaped, the wait ran out at END_WITHIN_S every time, and PID 1 was left half-dead behind the launcher.
        deadline = time.monotonic() + END_WITHIN_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            reap_adopted_from_deeper_namespaces()
            time.sleep(0.02)
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=END_WITHIN_S)
            except subprocess.TimeoutExpired:  # the holder itself stuck in the kernel: said below, and not waited for
                pass
        # Past the bound (a process the kernel cannot end at once: stuck in a file system, a large GPU context being
        # freed), PID 1 is the launcher's now, still dying: it and what it waits for are reaped as they end, within a
        # second bound; what is left after it is said (`unended`) and reaped by whoever adopts it next.
        deadline = time.monotonic() + END_WITHIN_S
        while (left := reap_adopted_from_deeper_namespaces()) and time.monotonic() < deadline:
            time.sleep(0.02)
        if left:
            self.unended = (f"{left} process(es) of the job's PID namespace still dying {2 * END_WITHIN_S:.0f} s after "
                            "the job ended")
        if self.proc.poll() is None:  # its pipe is not read either: the read would wait for it
            self.unended = "; ".join(filter(None, [self.unended, f"the job's namespace holder (pid {self.proc.pid}) had "
                                                   f"not ended {END_WITHIN_S:.0f} s after SIGKILL"]))
            self.proc.stdout.close()
        elif self.proc.stdout is not None:
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
