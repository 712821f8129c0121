"""A queue of runs: several submissions x several seeds, run one after another, resumable.

`harness run A B C --repeat 3 --resume` runs every team x seed that is not already settled, and
`harness queue A B C --repeat 3` shows where the queue stands. Its state is never stored: it is
derived, like everything else, from the run records. A team x seed is

- done: a record with status ok;
- failed: a final record the team answers for (timeout, crashed, invalid, diverged): never re-run,
  the failure is the team's result;
- lost: the infrastructure's failure: an `aborted` record, or a record left `running` by a launcher
  that is gone (results/finalize.launcher_alive: its run lock is free, or, where the lock cannot
  tell, its pid on this host); re-run on resume, and the dead launcher's record is closed as
  `aborted` first (as `harness finalize` would), so that nothing stays `running` for ever;
- running: a record whose launcher may still be alive (or which cannot be told from here);
- queued: no record yet.

A record counts for a team x seed when it was made from the same submission files (their hash), on
the same track, with the same overrides: a team that changes its code starts a new queue entry.
The queue runs on one machine; on a SLURM allocation `harness slurm` writes the same queue as an
array of jobs (launcher/slurm.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.results.finalize import FinalizeRefused, finalize_run, launcher_alive
from harness.results.records import RunRecord, read_record_json, upgrade_record
from harness.submission.contract import find_submission, read_team, submission_sha256, team_slug

DONE, FAILED, LOST, RUNNING, QUEUED = "done", "failed", "lost", "running", "queued"
TEAM_FAILURES = ("timeout", "crashed", "invalid", "diverged")  # final, and the team's own result
PENDING = (QUEUED, LOST)  # what a resumed queue runs


@dataclass(frozen=True)
class Entry:
    """One team x seed of the queue."""

    submission: str  # as given on the command line
    folder: Path
    team: str
    sha256: str
    seed: int


@dataclass
class EntryState:
    entry: Entry
    state: str
    run_dir: Path | None = None  # the record that settles it (or the lost one)
    reason: str = ""


def build_queue(submissions: list[str], seed: int, repeat: int) -> list[Entry]:
    """Every submission x seed, interleaved: every team's first seed, then every team's second (A B C A B C),
    so that a drift of the machines over the day touches every team alike."""
    teams = []
    for submission in submissions:
        folder = find_submission(submission)
        teams.append((submission, folder, read_team(folder).name, submission_sha256(folder)))
    return [Entry(submission, folder, team, sha, seed + i) for i in range(repeat)
            for submission, folder, team, sha in teams]


def _same_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> bool:
    """The record's overrides ({key: {"track": before, "run": value}}) are the queue's, value for value."""
    recorded = raw.get("overrides") or {}
    if not isinstance(recorded, dict):
        return False
    ran = {k: v.get("run") if isinstance(v, dict) else v for k, v in recorded.items()}
    return json.dumps(ran, sort_keys=True, default=str) == json.dumps(overrides, sort_keys=True, default=str)


def _records_of(entry: Entry, track_dir: Path, overrides: dict[str, Any]) -> list[tuple[Path, dict]]:
    team_dir = track_dir / team_slug(entry.team)
    found = []
    for path in sorted(team_dir.glob("*/run.json")) if team_dir.is_dir() else []:
        try:
            raw = upgrade_record(read_record_json(path))
        except (OSError, ValueError):
            continue  # an unreadable record settles nothing: the leaderboard shows it as such
        if raw.get("seed") == entry.seed and raw.get("submission_sha256") == entry.sha256 \
                and raw.get("team") == entry.team and _same_overrides(raw, overrides):
            found.append((path.parent, raw))
    return found


def state_of(entry: Entry, track_dir: Path, overrides: dict[str, Any]) -> EntryState:
    """Where one team x seed stands, from its records: a settled record first (the newest), then a live
    one, then a lost one."""
    records = _records_of(entry, track_dir, overrides)
    newest_first = sorted(records, key=lambda r: (str(r[1].get("started_at") or ""), r[0].name), reverse=True)
    for run_dir, raw in newest_first:
        if raw.get("status") == "ok":
            return EntryState(entry, DONE, run_dir)
        if raw.get("status") in TEAM_FAILURES:
            return EntryState(entry, FAILED, run_dir, str(raw.get("reason") or ""))
    for run_dir, raw in newest_first:
        if raw.get("status") in ("running", "evaluating"):
            alive = launcher_alive(RunRecord.from_dict(raw), run_dir=run_dir)
            if alive:  # or cannot be told from here (another host, no lock): never re-run over a live run
                return EntryState(entry, RUNNING, run_dir, alive)
    for run_dir, raw in newest_first:
        why = raw.get("reason") if raw.get("status") == "aborted" else "its launcher died before the run finished"
        return EntryState(entry, LOST, run_dir, str(why or ""))
    return EntryState(entry, QUEUED)


def queue_states(entries: list[Entry], runs_root: Path, track_name: str,
                 overrides: dict[str, Any]) -> list[EntryState]:
    return [state_of(e, runs_root / track_name, overrides) for e in entries]


def close_lost_record(run_dir: Path, reason: str) -> bool:
    """A record left `running` by a launcher that is gone becomes `aborted` (the infrastructure's failure,
    never the team's), as `harness finalize` ends one (results/finalize.py: the same test that the launcher
    is gone). False when it is not such a record (any more): final, or its launcher may be alive."""
    try:
        finalize_run(run_dir.parent.parent.parent, str(run_dir), reason, by="the queue (`harness run --resume`)")
    except FinalizeRefused:
        return False
    return True


def table(states: list[EntryState]) -> list[str]:
    """The queue per team: counts by state, then one line per entry that is not done."""
    by_team: dict[str, dict[str, int]] = {}
    for s in states:
        counts = by_team.setdefault(s.entry.team, {k: 0 for k in (QUEUED, RUNNING, DONE, FAILED, LOST)})
        counts[s.state] += 1
    width = max([len(t) for t in by_team] + [4])
    lines = [f"{'team':<{width}}  " + "  ".join(f"{k:>7}" for k in (QUEUED, RUNNING, DONE, FAILED, LOST))]
    for team, counts in by_team.items():
        lines.append(f"{team:<{width}}  " + "  ".join(f"{counts[k]:>7}" for k in (QUEUED, RUNNING, DONE, FAILED, LOST)))
    for s in states:
        if s.state in (FAILED, LOST, RUNNING):
            where = f" {s.run_dir}" if s.run_dir else ""
            lines.append(f"  {s.entry.team} seed {s.entry.seed}: {s.state}{where}" + (f" ({s.reason})" if s.reason else ""))
    return lines
