"""What the launcher takes back from the training ranks while they still run, and what it holds them to.

- `CheckpointTaker`: rank 0's checkpoint, taken into the record the moment rank 0 says it is saved
  (its `checkpoint_saved` report, after "training ended"), while the ranks still run: the
  communication probe and the teardown that follow run team code, and nothing they leave in staging/
  is what is scored. Taken once, then: a report with no file behind it is a failed run, never a
  reason to look again later (a report sent early, to stop the checkpoint allowance while training
  went on, took the file 14 s of training later); the runner then checks the file is the one rank 0
  hashed. The copy runs on a thread of its own (gigabytes at 1B parameters), so the watchdog's
  deadlines are never late for it; a file past the track's checkpoint cap is not copied. The only
  later take is of a report that arrived in the job's last moments, before a tick saw it.
- `ScratchCaps`: what the ranks write, capped by the track (log_cap_mib, scratch_cap_gib, and a
  number of entries): their private folder is measured on a thread of its own about once a second
  (a walk of millions of files takes seconds); past a cap, the watchdog ends the job, invalid. A run
  that printed without pause left a 598 MB record; one that fills /tmp fills it for everyone. Where the
  folder is a file system of the job's own (harness/launcher/control/job_namespace.py), the kernel holds
  scratch_cap_gib as its size, and the walk stays for the logs and the number of entries.

Both only read the ranks' private folder through harness/launcher/control/workarea.py, which follows no link.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

from harness.launcher.control.team_files import Unmeasurable
from harness.launcher.control.workarea import MAX_ENTRIES, WorkArea


# What the launcher's own writes can meet because of what a team's processes did: the disk they write filled (an
# anonymous O_TMPFILE file the caps cannot see; files up to the scratch cap), a quota used up, the system's file
# table or memory exhausted. Such a failure is never `aborted` (a free re-run the team could choose). A full disk
# the team cannot write (the records on another file system than its private folder), the launcher's own file
# table (EMFILE), a failing disk or a permission are the machine's. What the team's folder refuses to its reader
# (its rights taken away) is the team's: WorkArea.take_staged returns False for it, never an error.
TEAM_CAUSABLE_ERRNOS = {errno.ENFILE, errno.ENOMEM}
TEAM_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def io_failure_outcome(what: str, error: str, code: int | None, team_disk: bool) -> tuple[str, str]:
    """(status, reason) for a write of the launcher's own that failed; `team_disk`: the write was to the file
    system the ranks' private folder is on."""
    if code in TEAM_CAUSABLE_ERRNOS or (code in TEAM_DISK_ERRNOS and team_disk):
        return "crashed", (f"harness error: {what}: {error}: the team's processes could cause this (a full disk "
                           "they write, a used-up quota, the system's file table or memory), so it is not a free "
                           "re-run; an organiser who finds the machine at fault runs it again by hand")
    return "aborted", f"harness error: {what}: {error}"


class CheckpointTaker:
    def __init__(self, area: WorkArea, dest: Path, max_bytes: int | None = None):
        self.area, self.dest, self.max_bytes = area, dest, max_bytes
        self.taken = False
        self.attempted = False  # a take was made on a report: whatever it found is final
        self.error: str | None = None  # the copy itself failed (a full disk, a permission)
        self.errno: int | None = None
        self.too_large: int | None = None  # the size of a checkpoint past the cap (not taken)
        self._thread: threading.Thread | None = None

    def _take(self) -> bool:
        if self.too_large is not None:
            return False
        result = self.area.take_staged("checkpoint.pt", self.dest, self.max_bytes)
        if isinstance(result, int) and not isinstance(result, bool):
            self.too_large = result
            return False
        return result is True

    def _take_now(self) -> None:
        try:
            self.taken = self._take()
        except OSError as exc:  # the launcher's own write: whose fault it is, io_failure_outcome() says
            self.error, self.errno = f"{type(exc).__name__}: {exc}", exc.errno
        self.attempted = True

    def wait(self) -> None:
        """Until a copy started on a report has ended (before the runner reads or removes what it made)."""
        if self._thread is not None:
            self._thread.join()

    def poll(self, watch) -> None:
        """A tick of the watchdog: start the copy once rank 0 has said its checkpoint is saved, after training
        ended (a report before the end is no saved checkpoint: it is ignored)."""
        if self._thread is None and _announced(watch):
            self._thread = threading.Thread(target=self._take_now, name="harness-checkpoint", daemon=True)
            self._thread.start()
        if self.too_large is not None:
            watch.violation = watch.violation or self.cap_reason()

    def cap_reason(self) -> str:
        return (f"the checkpoint is {self.too_large / 2**30:.2f} GiB, past the track's cap of "
                f"{self.max_bytes / 2**30:.2f} GiB (checkpoint_cap_gib)")

    def take_after_the_job(self, watch) -> bool:
        """After the job: the take made on the report (joined), or, for a report no tick saw before the job
        ended, one now (every training process is gone: nothing can change the file any more). Without a
        report there is no checkpoint."""
        if self._thread is not None:
            self._thread.join()
        elif _announced(watch):
            self._take_now()
        return self.taken


def _announced(watch) -> bool:
    return watch.checkpoint_saved_s is not None and watch.train_end_s is not None \
        and watch.checkpoint_saved_s >= watch.train_end_s


class StagedWatch:
    """The open division's checkpoint, watched while its job runs. A script's window ends at the last change of
    the file (its ctime, open_run.py open_window); a script that maps the file (shared mmap) can write weights into
    it after that without moving the ctime. So whenever a version of the file (WorkArea.staged_key, in the staging/
    held since before the ranks started) has stood still for STILL_S, its bytes are hashed on a thread of their own
    (one at a time, at the lowest priority); after the job, the file is hashed again where it is the version hashed
    (`changed_unseen`): the window cannot end before the job did where its bytes changed after they were hashed, or
    where the launcher was refused the file or its folder while the job ran (its rights taken away; leases are
    refused in every sandboxed process). An honest torch.save writes through write(), which moves the ctime or the
    size every time, and leaves its file readable. STILL_S is past a second: where the folder is on a disk whose
    ctime counts whole seconds (ext4 with small inodes, Lustre), two honest saves of one size in one second share a
    version, and only one that stood still past the second is hashed."""

    STILL_S = 1.1

    def __init__(self, area: WorkArea, max_bytes: int):
        self.area, self.max_bytes = area, max_bytes
        self.seen: tuple | None = None  # the version seen at the last tick, and since when (monotonic)
        self.seen_since = 0.0
        self.hashed: tuple[tuple, str] | None = None  # (version, sha256) of the last version hashed whole
        self.refused = ""  # why the launcher could not read the file or its folder during the job, once it could not
        self._thread: threading.Thread | None = None

    def poll(self, watch=None) -> None:
        try:
            key = self.area.staged_key("checkpoint.pt")
        except PermissionError as exc:
            self.refused = self.refused or f"staging/: {exc.strerror}"
            return
        if key is None or key != self.seen:
            self.seen, self.seen_since = key, time.monotonic()
            return
        if (self.hashed is not None and self.hashed[0] == key) or (self._thread is not None and self._thread.is_alive()) \
                or time.monotonic() - self.seen_since < self.STILL_S:
            return
        self._thread = threading.Thread(target=self._hash, args=(key,), name="harness-staged", daemon=True)
        self._thread.start()

    def _hash(self, key: tuple) -> None:
        try:  # beside the ranks: the launcher's own work waits, theirs does not
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        try:
            found = self.area.staged_digest("checkpoint.pt", self.max_bytes)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM, errno.EAGAIN):  # kept from this reader (never an honest file)
                self.refused = self.refused or f"checkpoint.pt: {exc.strerror}"
            return
        if found is not None and found[0] == key:  # the same version when opened; its bytes as read
            self.hashed = found

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def changed_unseen(self) -> bool:
        """After the job (nothing of it runs): whether the file's bytes may have changed after its last recorded
        change, unseen by the launcher."""
        self.wait()
        if self.refused:
            return True
        try:
            key = self.area.staged_key("checkpoint.pt")
            if self.hashed is None or key != self.hashed[0]:  # another version, or none: its ctime says when
                return False
            now = self.area.staged_digest("checkpoint.pt", self.max_bytes)
        except OSError:  # unreadable now: the take fails, and says so
            return False
        return now is not None and now[0] == self.hashed[0] and now[1] != self.hashed[1]


MAX_FAILED_MEASURES = 5  # in a row, a second apart


class ScratchCaps:
    def __init__(self, area: WorkArea, track, every_s: float = 1.0):
        self.area, self.every_s = area, every_s
        self.log_cap, self.scratch_cap = int(track.log_cap_mib * 2**20), int(track.scratch_cap_gib * 2**30)
        self.violation: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="harness-caps", daemon=True)

    def __enter__(self) -> "ScratchCaps":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30.0)
        if self.violation is None:  # once more after the job: what was written after the last look counts too
            try:
                self.violation = self.measure()
            except Exception as exc:  # noqa: BLE001 (every process of the job is gone: nothing changes it now)
                self.violation = (f"the ranks' private folder could not be measured after the job ({type(exc).__name__}: "
                                  f"{exc}): its caps cannot hold")

    def _watch(self) -> None:
        failures = 0
        while not self._stop.wait(self.every_s) and self.violation is None:
            try:
                self.violation = self.measure()
                failures = 0
            except Exception as exc:  # noqa: BLE001 (a folder changing under the walk: measured again next time)
                failures += 1  # ...but a cap that cannot be checked, again and again, is no cap: the run ends
                if failures >= MAX_FAILED_MEASURES:
                    self.violation = (f"the ranks' private folder could not be measured {failures} times in a row "
                                      f"({type(exc).__name__}: {exc}): its caps cannot hold")

    def measure(self) -> str | None:
        try:
            logs, disk, entries = self.area.usage(MAX_ENTRIES)
        except Unmeasurable as exc:
            return (f"the ranks' private folder holds a folder the harness cannot list ({exc}): what it holds is "
                    "not under the track's caps (leave every folder readable)")
        if logs > self.log_cap:
            return (f"the ranks wrote more than {self.log_cap >> 20} MiB to their logs (the track's log_cap_mib): "
                    "print less")
        if disk > self.scratch_cap:
            return (f"the ranks' private folder holds more than {self.scratch_cap / 2**30:g} GiB (the track's "
                    "scratch_cap_gib)")
        if entries > MAX_ENTRIES:
            return f"the ranks' private folder holds more than {MAX_ENTRIES:,} files and folders"
        return None
