"""Keeping training processes away from results.

Training processes run in a private working folder (their submission copy, logs and the
checkpoint they stage), are not told where records, leaderboards or validation data live, and
nothing they write is read as a result: the record is composed by the launcher from reports it
stamped itself, and the checkpoint is taken over only once every training process is gone.

With the sandbox (harness/ranks/confine/sandbox.py) a training rank cannot read or write the runs tree at
all; this guard is the second line, for machines without it, where a submission could find the
runs/ tree on its own. While the ranks run, the launcher holds a snapshot of every finished
record of the track (one whose status is final: a record that says `running` or `evaluating` is
still being written by its own launcher), taken at the start and refreshed twice a second as
other runs finish, and of the track's leaderboard files. When the ranks are gone it compares: a
finished record that changed or vanished is restored byte for byte and the run is flagged,
naming the paths. A changed leaderboard is rebuilt from the records (it is derived, and a
concurrent `harness run` legitimately rewrites it, so that alone flags nothing). Records that
appeared meanwhile are listed in the run's notes (a concurrent `harness run` creates them too).
Not covered without the sandbox: other runs' checkpoints and submission copies while they are in
progress (a changed checkpoint fails that run's hash check rather than being scored).

`harness flag` / `harness unflag` take the track's lock exclusively; a guard holds it shared
while ranks run, so an organiser's flag is never mistaken for tampering.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.results.row_index import drop_index, identity, index_path
from harness.results.locks import TrackLock
from harness.results.records import FINAL_STATUSES, RECORD_MAX_BYTES, read_record_json, write_atomic
from harness.submission.files import read_regular

BOARD_MAX_BYTES = 64 << 20  # a leaderboard page of every run of an event: a few megabytes


@dataclass
class GuardReport:
    restored: list[str] = field(default_factory=list)
    unrestored: list[str] = field(default_factory=list)  # could not be put back (path: why)
    leaderboard_changed: list[str] = field(default_factory=list)
    appeared: list[str] = field(default_factory=list)


def _finished_records(track_dir: Path, own: Path) -> dict[Path, bytes]:
    out = {}
    for path in track_dir.glob("*/*/run.json"):
        if path.parent == own:
            continue
        try:
            data = read_regular(path, RECORD_MAX_BYTES)  # bounded, never a FIFO or a link: the ranks may have planted it
            if read_record_json(path, data).get("status") in FINAL_STATUSES:  # in progress (running, evaluating): not yet a result
                out[path] = data
        except (OSError, ValueError):
            continue
    return out


def _leaderboard_files(leaderboard_dir: Path, track: str) -> dict[Path, bytes]:
    out = {}
    for path in list(leaderboard_dir.glob(f"{track}.*")) + list(leaderboard_dir.glob(f"{track}-all.*")):
        try:
            out[path] = read_regular(path, BOARD_MAX_BYTES)
        except (OSError, ValueError):
            continue
    return out


def _restore(track_dir: Path, path: Path, data: bytes) -> None:
    """Put a record back byte for byte, whatever now stands in its place or in its folders' below the track's
    (a link, a file where a folder was, a folder where the file was: removed, never followed)."""
    folders = [track_dir / p for p in [Path(*path.relative_to(track_dir).parts[:i]) for i in (1, 2)]]
    for spot, want_dir in [*((f, True) for f in folders), (path, False)]:
        if spot.is_symlink() or (want_dir and spot.exists() and not spot.is_dir()):
            spot.unlink()
        elif not want_dir and spot.is_dir():
            shutil.rmtree(spot)
        if want_dir:
            spot.mkdir(exist_ok=True)
    write_atomic(path, data.decode())


class RecordGuard:
    """Snapshot before the ranks start; `check_and_restore` after every training process is gone."""

    def __init__(self, runs_root: Path, track: str, own_run_dir: Path, leaderboard_dir: Path):
        self.track_dir = Path(runs_root) / track
        self.track, self.own, self.leaderboard_dir = track, own_run_dir, leaderboard_dir
        self.lock = TrackLock(self.track_dir, exclusive=False)
        self.records: dict[Path, bytes] = {}
        self.board: dict[Path, bytes] = {}
        self.known: set[Path] = set()
        self.index = index_path(leaderboard_dir, track)  # the board's row index (harness/results/row_index.py)
        self.index_seen: tuple | None = None

    def __enter__(self) -> "RecordGuard":
        self.lock.__enter__()
        self.records = _finished_records(self.track_dir, self.own)
        self.board = _leaderboard_files(self.leaderboard_dir, self.track)
        self.index_seen = identity(self.index)
        self.known = set(self.track_dir.glob("*/*/run.json"))
        self._last_refresh = time.monotonic()
        return self

    def refresh(self, every_s: float = 0.5) -> None:
        """While the ranks run: a record that became final since (another run finished) is protected
        from now on, as it is (its own launcher wrote it; the window for a change is one refresh)."""
        if time.monotonic() - self._last_refresh < every_s:
            return
        self._last_refresh = time.monotonic()
        for path, data in _finished_records(self.track_dir, self.own).items():
            self.records.setdefault(path, data)

    def check_and_restore(self) -> GuardReport:
        report = GuardReport()
        for path, data in self.records.items():
            try:
                now = read_regular(path, RECORD_MAX_BYTES)
            except (OSError, ValueError):
                now = None
            if now != data:
                try:
                    _restore(self.track_dir, path, data)
                    report.restored.append(str(path.resolve()))
                except OSError as exc:  # one that cannot be put back is named; the others still are
                    report.unrestored.append(f"{path}: {exc}")
        for path, data in self.board.items():
            try:
                changed = read_regular(path, BOARD_MAX_BYTES) != data
            except (OSError, ValueError):
                changed = True
            if changed:
                report.leaderboard_changed.append(str(path.resolve()))
        if identity(self.index) != self.index_seen:  # rows of the right types cannot be told from true ones:
            drop_index(self.leaderboard_dir, self.track)  # the board is rebuilt from the records alone
            report.leaderboard_changed.append(str(self.index))
        report.appeared = sorted(str(p) for p in set(self.track_dir.glob("*/*/run.json")) - self.known
                                 if p.parent != self.own)
        return report

    def __exit__(self, *exc) -> None:
        self.lock.__exit__(*exc)
