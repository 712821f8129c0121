"""Keeping training processes away from results.

Training processes run in a private working folder (their submission copy, logs and the
checkpoint they stage), are not told where records, leaderboards or validation data live, and
nothing they write is read as a result: the record is composed by the launcher from reports it
stamped itself, and the checkpoint is taken over only once every training process is gone.

A submission can still find the runs/ tree on its own. So, while the ranks run, the launcher
holds a snapshot of every finished record of the track (one whose status is final: a record
that says `running` or `evaluating` is still being written by its own launcher) and of the
track's leaderboard files;
when the ranks are gone it compares: a finished record that changed or vanished is restored
byte for byte and the run is flagged, naming the paths. A changed leaderboard is rebuilt from
the records (it is derived, and a concurrent `harness run` legitimately rewrites it, so that
alone flags nothing). Records that appeared meanwhile are listed in the run's notes (a
concurrent `harness run` creates them too).

`harness flag` / `harness unflag` take the track's lock exclusively; a guard holds it shared
while ranks run, so an organiser's flag is never mistaken for tampering.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.results.locks import TrackLock
from harness.results.records import FINAL_STATUSES, write_atomic


@dataclass
class GuardReport:
    restored: list[str] = field(default_factory=list)
    leaderboard_changed: list[str] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)

    @property
    def tampered(self) -> bool:
        return bool(self.restored)


def _finished_records(track_dir: Path, own: Path) -> dict[Path, bytes]:
    out = {}
    for path in track_dir.glob("*/*/run.json"):
        if path.parent == own:
            continue
        try:
            data = path.read_bytes()
            if json.loads(data).get("status") in FINAL_STATUSES:  # in progress (running, evaluating): not yet a result
                out[path] = data
        except (OSError, ValueError):
            continue
    return out


def _leaderboard_files(leaderboard_dir: Path, track: str) -> dict[Path, bytes]:
    out = {}
    for path in list(leaderboard_dir.glob(f"{track}.*")) + list(leaderboard_dir.glob(f"{track}-all.*")):
        try:
            out[path] = path.read_bytes()
        except OSError:
            continue
    return out


class RecordGuard:
    """Snapshot before the ranks start; `check_and_restore` after every training process is gone."""

    def __init__(self, runs_root: Path, track: str, own_run_dir: Path, leaderboard_dir: Path):
        self.track_dir = Path(runs_root) / track
        self.track, self.own, self.leaderboard_dir = track, own_run_dir, leaderboard_dir
        self.lock = TrackLock(self.track_dir, exclusive=False)
        self.records: dict[Path, bytes] = {}
        self.board: dict[Path, bytes] = {}
        self.known: set[Path] = set()

    def __enter__(self) -> "RecordGuard":
        self.lock.__enter__()
        self.records = _finished_records(self.track_dir, self.own)
        self.board = _leaderboard_files(self.leaderboard_dir, self.track)
        self.known = set(self.track_dir.glob("*/*/run.json"))
        return self

    def check_and_restore(self) -> GuardReport:
        report = GuardReport()
        for path, data in self.records.items():
            try:
                now = path.read_bytes()
            except OSError:
                now = None
            if now != data:
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, data.decode())
                report.restored.append(str(path.resolve()))
        for path, data in self.board.items():
            try:
                changed = path.read_bytes() != data
            except OSError:
                changed = True
            if changed:
                report.leaderboard_changed.append(str(path.resolve()))
        report.appeared = sorted(str(p) for p in set(self.track_dir.glob("*/*/run.json")) - self.known
                                 if p.parent != self.own)
        return report

    def __exit__(self, *exc) -> None:
        self.lock.__exit__(*exc)
