"""`harness finalize RUN`: a record its launcher can no longer finish, finished as `aborted` by an organiser.

A launcher killed with SIGKILL, or on a node that was lost, leaves its record at `running` (or `evaluating`)
for ever. The leaderboard never lets such a record choose a team's submission (leaderboard.team_runs), but the
record says a run is in progress that is not: an organiser finishes it, with a reason, once the harness can
tell that its launcher is gone.

How it tells: first the run's lock (results/locks.py), which node 0's launcher holds from its run folder to its
final record and the kernel drops however the launcher dies: held, alive; free, gone. Where the lock cannot
tell (a record from before it, a shared file system without locks), the record names the host and the pid
of the launcher that writes it (`hostname`, `launcher_pid`). On that host, a live process with that pid that already existed when the run started (a pid is
reused only once its process is gone), or that runs the harness, may be the launcher: refused. On another host
nothing can be seen from here, and a record without a pid (written before the harness recorded it) names no
process to look at: refused unless `force` (the organiser has checked the job: squeue, the node).

No track lock is taken: a record in progress is no run's guard's to protect (launcher/control/guard.py protects final
records only, and takes this one as it is once it is final), and waiting for the runs training on the track
would hold an organiser for the length of another team's run.
"""

from __future__ import annotations

import getpass
from pathlib import Path

from harness.launcher.control.alive import launcher_alive
from harness.results.records import (
    FINAL_STATUSES,
    RunRecord,
    find_run,
    load_record,
    save_record,
    utc_now,
)


class FinalizeRefused(Exception):
    """The record is already final, or its launcher may still be alive: nothing was changed."""



def finalize_run(runs_root: Path, key: str, reason: str = "", force: bool = False,
                 by: str = "the organiser") -> tuple[RunRecord, Path]:
    """Finish the run `key` (a run id, a prefix of one, or a run directory) as `aborted`, with the reason
    "finalized by the organiser: ...", written atomically. Raises FinalizeRefused (nothing changed) when it is
    already final, or when its launcher may be alive and not `force`; FileNotFoundError, ValueError when there
    is no such record or it cannot be read."""
    run_dir = find_run(runs_root, key)
    record = load_record(run_dir)
    if record.status in FINAL_STATUSES:
        raise FinalizeRefused(f"{run_dir}: the record is already final (status {record.status}"
                              + (f": {record.reason}" if record.reason else "") + "); nothing to finalize")
    alive = launcher_alive(record, run_dir=run_dir)
    if alive and not force:
        raise FinalizeRefused(f"{run_dir}: the run may still be going: {alive}. Check the job (on its node, squeue); "
                              "once its launcher is gone, pass --force")
    was = record.status
    why = reason.strip() or f"its launcher was gone and the record was left {was}"
    record.status, record.reason = "aborted", f"finalized by {by}: {why}"
    record.extra["finalized"] = {"at": utc_now(), "by": f"{by} ({getpass.getuser()})", "from_status": was,
                                 "launcher": alive or "gone", "forced": bool(alive)}
    save_record(run_dir, record)
    return record, run_dir
