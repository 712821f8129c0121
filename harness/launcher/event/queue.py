"""A queue of runs: several submissions x several seeds, run one after another, resumable.

`harness run A B C --repeat 3 --resume` runs every team x seed that is not already settled, and
`harness queue A B C --repeat 3` shows where the queue stands. Its state is never stored: it is
derived, like everything else, from the run records. A team x seed is

- done: a record with status ok;
- failed: a final record the team answers for (timeout, crashed, invalid, diverged): never re-run,
  the failure is the team's result;
- lost: the infrastructure's failure: an `aborted` record, or a record left `running` by a launcher
  that is gone (launcher/control/alive.py launcher_alive: its run lock is free, or, where the lock cannot
  tell, its pid on this host); re-run on resume, and the dead launcher's record is closed as
  `aborted` first (as `harness finalize` would), so that nothing stays `running` for ever;
- running: a record whose launcher may still be alive (or which cannot be told from here);
- queued: no record yet.

A record counts for a team x seed when it was made from the same submission files (their hash), on
the same track, with the same overrides: a team that changes its code starts a new queue entry.
The queue runs on one machine; on a SLURM allocation `harness slurm` writes the same queue as an
array of jobs (launcher/event/slurm.py).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.launcher.control.alive import launcher_alive
from harness.launcher.event.finalize import FinalizeRefused, finalize_run
from harness.results.records import RunRecord, read_record_json, upgrade_record
from harness.submission.printable import printable
from harness.submission.contract import find_submission, read_team, submission_sha256, team_slug

DONE, FAILED, LOST, RUNNING, QUEUED, STUCK = "done", "failed", "lost", "running", "queued", "stuck"
# A run lost this many times is not run again by a queue: a team could otherwise end its own unlucky runs
# (by starving its launcher) and draw again for ever; a broken node would eat the allocation.
MAX_LOST = 2
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
    records_folder: str  # where its runs are recorded in the track's folder (identity.py): its team name's, or
                         # a refused folder's


@dataclass
class EntryState:
    entry: Entry
    state: str
    run_dir: Path | None = None  # the record that settles it (or the lost one)
    reason: str = ""


def build_queue(submissions: list[str], seed: int, repeat: int, runs_root: Path | None = None) -> list[Entry]:
    """Every submission x seed, interleaved: every team's first seed, then every team's second (A B C A B C),
    so that a drift of the machines over the day touches every team alike. A folder whose submission.toml
    or files cannot be read is still an entry (its folder's name, no hash): its run is recorded `invalid`,
    as a single run's is, and the rest of the queue goes on. With `runs_root`, each entry's team is the name
    its runs are recorded under (launcher/run/identity.py: the roster's, or its folder's where the name is
    refused), so that its records settle it."""
    from harness.launcher.run.identity import resolve_identity

    teams, seen = [], {}
    for submission in submissions:
        folder = find_submission(submission)
        try:
            team, sha = read_team(folder).name, submission_sha256(folder)
        except Exception:  # noqa: BLE001  (any fault of one team's folder is that team's entry, never the queue's)
            team, sha = folder.name, ""
        records = team_slug(team)
        if runs_root is not None:
            identity = resolve_identity(runs_root, team, folder)
            team, records = identity.name, identity.records_folder
        # One records folder, one team: the same name, or names that would share its folder ("Team A", "Team-A":
        # whichever ran first would own it, and the other's entry would be refused at every --resume)
        key = team_slug(team).casefold()
        if key in seen:  # the leaderboard would keep one of them: a queue that runs both measures nothing
            other, name = seen[key]
            said = f"both team {team!r}" if name == team else f"teams {name!r} and {team!r}, one records folder"
            raise ValueError(f"{other} and {submission} are {said}: a queue runs each team once "
                             "(a team's [team] name in submission.toml names it)")
        seen[key] = (submission, team)
        teams.append((submission, folder, team, sha, records))
    return [Entry(submission, folder, team, sha, seed + i, records) for i in range(repeat)
            for submission, folder, team, sha, records in teams]


def _same_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> bool:
    """The record's overrides ({key: {"track": before, "run": value}}) are the queue's, value for value."""
    recorded = raw.get("overrides") or {}
    if not isinstance(recorded, dict):
        return False
    ran = {k: v.get("run") if isinstance(v, dict) else v for k, v in recorded.items()}
    return json.dumps(ran, sort_keys=True, default=str) == json.dumps(overrides, sort_keys=True, default=str)


def records_of(entry: Entry, track_dir: Path, overrides: dict[str, Any],
                budget_s: float | None = None) -> list[tuple[Path, dict]]:
    team_dir = track_dir / entry.records_folder
    found = []
    for path in sorted(team_dir.glob("*/run.json")) if team_dir.is_dir() else []:
        try:
            raw = upgrade_record(read_record_json(path))
        except (OSError, ValueError):
            continue  # an unreadable record settles nothing: the leaderboard shows it as such
        if raw.get("seed") == entry.seed and (raw.get("submission_sha256") or "") == entry.sha256 \
                and raw.get("team") == entry.team and _same_overrides(raw, overrides) \
                and (budget_s is None or raw.get("budget_s") == budget_s):  # a rehearsal's track file: not this one

            found.append((path.parent, raw))
    return found


ORGANISER_STOPS = ("stopped by SIGINT", "stopped by SIGTERM", "stopped by SIGHUP")  # launcher/control/watch.py


SIGNAL_SCOPE_ABI = 6  # Landlock's signal scope: below it a rank can signal its own launcher (its parent)


def stopped_by_organiser(raw: dict) -> bool:
    """A record the organiser ended with a signal to its launcher (Ctrl-C, scancel, SLURM's time limit), where no
    team code could have sent it: every process that ran team code had Landlock's signal scope (or none ran)."""
    if raw.get("status") != "aborted" or not str(raw.get("reason") or "").startswith(ORGANISER_STOPS):
        return False
    boxes = [box for box in (raw.get("sandbox") or {}).values() if isinstance(box, dict)]
    return all(box.get("active") is True and isinstance(box.get("abi"), int) and box["abi"] >= SIGNAL_SCOPE_ABI
               for box in boxes)


def state_of(entry: Entry, track_dir: Path, overrides: dict[str, Any], budget_s: float | None = None) -> EntryState:
    """Where one team x seed stands, from its records: a settled record first (the newest), then a live
    one, then a lost one. With budget_s, only records of that budget count (the same track name in a
    rehearsal's file with another budget is another queue)."""
    records = records_of(entry, track_dir, overrides, budget_s)
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
    lost = newest_first
    # An organiser's stop (Ctrl-C, scancel or SLURM's time limit: SIGINT, SIGTERM or SIGHUP to the launcher, which team
    # code cannot send it: Landlock scopes signals) is run again, and never counts towards stuck. A launcher that died
    # (its record closed by `harness finalize` or a queue) does: who ended it is not known.
    counted = [r for r in lost if not stopped_by_organiser(r[1])]
    if len(counted) >= MAX_LOST:  # lost again and again: a machine at fault, or a team that kills its own launcher
        return EntryState(entry, STUCK, lost[0][0], f"lost {len(counted)} times: the organiser decides (run it by "
                          "hand, or leave it)")
    for run_dir, raw in lost:
        why = raw.get("reason") if raw.get("status") == "aborted" else "its launcher died before the run finished"
        return EntryState(entry, LOST, run_dir, str(why or ""))
    return EntryState(entry, QUEUED)


@dataclass(frozen=True)
class Queue:
    """A queue as its command line gives it: the entries, and where their records are."""

    entries: list[Entry]
    track_dir: Path
    overrides: dict[str, Any]  # as a record says what it ran: {key: value}
    budget_s: float | None = None  # the resolved track's: a record of another budget is another queue's

    def states(self) -> list[EntryState]:
        return [self.state(e) for e in self.entries]

    def state(self, entry: Entry) -> EntryState:
        return state_of(entry, self.track_dir, self.overrides, self.budget_s)


def build(submissions: list[str], track: str, runs_root: Path, seed: int, repeat: int,
          overrides: dict[str, Any]) -> Queue:
    """The queue of `harness run SUBMISSION... --repeat N` (and its view, and its SLURM array)."""
    from harness.tracks.spec import apply_overrides, load_track

    resolved = apply_overrides(load_track(track), **overrides)
    effective = {key: change["run"] for key, change in resolved.overrides.items()}  # what a record says it ran
    return Queue(build_queue(list(submissions), seed, repeat, runs_root), runs_root / resolved.track.name, effective,
                 resolved.track.budget_s)


LOST_REASON = "its launcher died before the run finished: the infrastructure's failure, not the team's; run again"


@contextmanager
def claim(queue: Queue, entry: Entry):
    """Yields "" while this process alone runs `entry` among the queues over this runs tree, else why not.

    An exclusive flock on a claim file of the track's (runs/<track>/.claims/<team>-<seed>-<hash>: not among the
    team's run folders, which tools list),
    taken before the entry's records are read again and held until its run has ended: two queues started
    at once (two terminals, or a queue and a SLURM array task) never run one entry twice, however their
    reads interleave. The kernel drops it with the process, however that ends. Where the file system has
    no locks, the records' read again just before the run is the only guard (as before), and it is said."""
    import fcntl

    from harness.results.locks import no_locks_here, open_lock_file

    claims = queue.track_dir / ".claims"
    claims.mkdir(parents=True, exist_ok=True)
    fh = open_lock_file(claims / f"{entry.records_folder}-{entry.seed}-{entry.sha256[:16]}")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield "another queue is running it now"
            return
        except OSError as exc:
            if not no_locks_here(exc):
                raise
        yield ""
    finally:
        fh.close()  # the lock goes with the descriptor


def pending(queue: Queue, say=lambda text: None) -> list[Entry]:
    """What a resumed queue runs: each entry queued or lost, a dead launcher's record closed first (so that
    nothing stays `running` for ever); what is settled or live is said and left alone."""
    out = []
    for s in queue.states():
        if s.state == LOST and s.run_dir is not None and close_lost_record(s.run_dir, LOST_REASON):
            say(f"closed {s.run_dir}: left running by a launcher that is gone; aborted")
            s = queue.state(s.entry)  # read again: closed here, or by another queue in the meantime
        if s.state in PENDING:
            out.append(s.entry)
        else:
            say(f"skipped {s.entry.team} seed {s.entry.seed}: {s.state} ({s.run_dir})")
    return out


def close_lost_record(run_dir: Path, reason: str) -> bool:
    """A record left `running` by a launcher that is gone becomes `aborted` (the infrastructure's failure,
    never the team's), as `harness finalize` ends one (launcher/event/finalize.py: the same test that the launcher
    is gone). False when it is not such a record (any more): final, or its launcher may be alive."""
    try:
        finalize_run(run_dir.parent.parent.parent, str(run_dir), reason, by="the queue (`harness run --resume`)")
    except FinalizeRefused:
        return False
    return True


def table(states: list[EntryState]) -> list[str]:
    """The queue per team: counts by state, then one line per entry that is not done."""
    kinds = (QUEUED, RUNNING, DONE, FAILED, LOST, STUCK)
    by_team: dict[str, dict[str, int]] = {}
    for s in states:
        counts = by_team.setdefault(printable(s.entry.team, 80), {k: 0 for k in kinds})
        counts[s.state] += 1
    width = max([len(t) for t in by_team] + [4])
    lines = [f"{'team':<{width}}  " + "  ".join(f"{k:>7}" for k in kinds)]
    for team, counts in by_team.items():
        lines.append(f"{team:<{width}}  " + "  ".join(f"{counts[k]:>7}" for k in kinds))
    for s in states:  # names and reasons are the teams' text: shown on one line each, never obeyed
        if s.state in (FAILED, LOST, RUNNING, STUCK):
            where = f" {s.run_dir}" if s.run_dir else ""
            lines.append(printable(f"  {s.entry.team} seed {s.entry.seed}: {s.state}{where}"
                                   + (f" ({s.reason})" if s.reason else "")))
    return lines
