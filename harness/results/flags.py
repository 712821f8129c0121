"""`harness flag RUN --reason ...` / `harness unflag RUN`: hide a run from the ranking without deleting it.

The mark and its history (when, by whom, why) are kept in the record. Changing a finished
record takes the track's lock exclusively, so it waits for runs that are training on the
track (their guard would otherwise take the change for tampering and undo it).
"""

from __future__ import annotations

import getpass
from pathlib import Path

from harness.results.locks import TrackLock
from harness.results.records import RunRecord, find_run, load_record, save_record, utc_now


def set_flag(runs_root: Path, key: str, *, flagged: bool, reason: str = "",
             wait_s: float | None = 10.0) -> tuple[RunRecord, Path]:
    run_dir = find_run(runs_root, key)
    if flagged and not reason.strip():
        raise ValueError("say why: --reason is required to flag a run")
    with TrackLock(run_dir.parent.parent, exclusive=True, timeout_s=wait_s):
        record = load_record(run_dir)
        record.flagged = flagged
        record.flag_reason = reason.strip() if flagged else ""
        history = record.extra.setdefault("flag_history", [])
        history.append({"at": utc_now(), "flagged": flagged, "reason": reason.strip(), "by": getpass.getuser()})
        save_record(run_dir, record)
    return record, run_dir
