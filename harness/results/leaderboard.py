"""The ranking: derived from run records alone, rebuildable at any time.

Rules (docs/leaderboard.md):
- A team's entry is its latest submission (the submission_sha256 of its newest run that the team
  answers for: a final status other than `aborted`); runs of earlier versions do not count. A run in
  progress (or left so by a killed launcher) or aborted never chooses it: it is said in the entry's reason.
- Ranked: teams with at least one official, unflagged `ok` run of that submission, by
  validation loss: the mean over those runs (track `ranking = "mean"`, with std, n and an interval
  that claims nothing below the loss floor: stats.loss_interval) or the best run (`ranking = "best"`). Only runs of one setup (budget or step bound, world
  size) are counted: those made as the newest of them was; the others are named in the reason.
- Each ranked team is tested against the next with a test that matches the rule (Welch's t-test
  for `mean`, a permutation test on the best runs for `best`): `vs_next` is ahead, tied (p >= 0.05)
  or undetermined (fewer than 2 runs on a side); tied and undetermined pairs are marked, never
  silently ordered.
- Teams without an `ok` run are listed below, with their best status and its reason.
- A run.json that cannot be read is never dropped: its run is listed as `unreadable` with the file
  in the reason (on its team's entry, or as the team's only status).
- Unofficial runs (command-line overrides) are left out unless `include_unofficial`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import pandas as pd

from harness import __version__
from harness.results.records import SCHEMA_VERSION, field_kinds, read_record_fields, record_folder, upgrade_record
from harness.results.stats import ALPHA, best_permutation, finite_first, is_finite, loss_interval, summarize, welch

# Every column, in the CSV's order and the page's details': what a team is ranked by first, then whether the order
# is evidence, then throughput, then identity; reasons last (they are long). The Markdown shows a few
# (tables.MARKDOWN_COLUMNS).
COLUMNS = [
    "rank", "team", "division", "val_loss", "interval_low", "interval_high", "interval_kind", "n_runs", "vs_next",
    "tied_with", "p_vs_next", "status",
    "tokens_per_s", "mfu", "comm_overlap_efficiency", "params", "tokens", "steps", "train_time_s", "startup_s",
    "precision", "val_loss_std", "run_id", "submission_sha256", "reason",
]
INT_COLUMNS = ["rank", "n_runs", "params", "tokens", "steps"]  # counts: written as integers, never 425984.0
COUNT_FIELDS = ("params", "tokens", "steps")  # a record's counts: beyond int64, or infinite, the table cannot hold them
MAX_COUNT = 2**62
# Which failure says the team got furthest: shown for teams without an ok run.
UNREADABLE = "unreadable"  # a run.json that cannot be parsed: not a record status, a finding about the file
STATUS_ORDER = ["ok", "timeout", "diverged", "crashed", "invalid", "aborted", "flagged", "evaluating", "running",
                UNREADABLE]
METRIC_COLUMNS = ["tokens_per_s", "mfu", "comm_overlap_efficiency", "params", "tokens", "steps", "train_time_s",
                  "startup_s"]
# The record fields the views read: a choice among the schema's (records.RunRecord), whose types are declared
# there alone and checked here from that declaration (field_problem).
FIELDS = ["run_id", "team", "track_name", "status", "reason", "official", "flagged", "flag_reason", "val_loss",
          "submission_sha256", "started_at", *METRIC_COLUMNS, "loss_floor", "seed", "world_size", "precision",
          "device_name", "nproc_per_node", "nnodes", "machine", "versions", "torch_version", "division",
          "throughput_source", "budget_s"]
# What a row holds (record_row) and the harness that derived it: a row index written by another harness is not read
# (how a row is derived from a record may change without the schema's version).
ROW_FIELDS = f"{__version__}:{SCHEMA_VERSION}:" + ",".join([*FIELDS, "ranking", "divisions", "max_steps", "track_source",
                                                           "folder", "refused"])
# What parse_row reads of a record of this schema: the fields, and what record_row and record_folder derive from.
READ_KEYS = (*FIELDS, "track", "identity", "submission_dir", "schema_version")
KINDS = field_kinds()
NUMBER_FIELDS = tuple(k for k in FIELDS if KINDS[k] == "number")
TEXT_FIELDS = tuple(k for k in FIELDS if KINDS[k] == "text")
FLAG_FIELDS = tuple(k for k in FIELDS if KINDS[k] == "flag")
OBJECT_FIELDS = tuple(k for k in (*FIELDS, "track") if KINDS[k] == "object")  # the track: its ranking rule, bound
# Final statuses a team answers for: its code got there. `aborted` is the launcher stopped (a person, a signal, a
# node without the sandbox the track requires); `running` and `evaluating` are in progress, or a launcher killed
# before it could finish (SIGKILL, a lost node). Neither may choose a team's submission: the infrastructure's
# accidents must never take a team off the ranking.
ANSWERABLE = ("ok", "timeout", "crashed", "invalid", "diverged")


def load_rows(root: Path, track: str | None, index: Path | None = None,
              meanwhile: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
    """The fields the views need from every run.json under root; one that cannot be read becomes a
    row with status `unreadable` (a cut-off write may hide a team's best run: never silently dropped).
    `index`: a row index (row_index.py) of this track's records, read first and written back when it changed.
    The records the index does not hold are parsed by two processes where there are many (forked.map_in_two);
    `meanwhile`: what this process does while its copy parses (the caller's next import)."""
    from harness.results import row_index
    from harness.results.forked import map_in_two

    root = Path(root)
    base = str(root)

    def at(rel: str) -> str:  # str(root / rel), joined as text: 30,000 Path objects were a quarter of a cold rebuild
        return rel if base == "." else os.path.join(base, rel)

    kept = row_index.read_index(index, root, ROW_FIELDS) if index is not None else {}
    found: list[tuple[str, row_index.Key, dict[str, Any] | None]] = []
    for rel in record_paths(root, track):
        key = row_index.identity(at(rel))
        if key is None:  # a run folder without a run.json (or one gone since the listing): not a record
            continue
        known = kept.get(rel)
        cached = known is not None and known[0] == key and not row_problem(known[1])
        found.append((rel, key, known[1] if cached else None))
    new = [at(rel) for rel, _, row in found if row is None]
    parsed = iter(map_in_two(new, parse_row, meanwhile=meanwhile))
    fresh: dict[str, tuple[row_index.Key, dict[str, Any]]] = {}
    rows = []
    for rel, key, row in found:
        if row is None:
            readable, row = next(parsed)
            if not readable:
                rows.append(row)
                continue
        fresh[rel] = (key, dict(row))
        row["run_dir"] = at(os.path.dirname(rel))  # where the records are now, never where the index saw them
        rows.append(row)
    if index is not None and (fresh.keys() != kept.keys() or any(fresh[k][0] != kept[k][0] for k in fresh)):
        row_index.write_index(index, root, ROW_FIELDS, fresh)
    return rows


def parse_row(path: str) -> list[bool | dict[str, Any]]:
    """[True, the row] of a run.json, or [False, its unreadable row]: a JSON value (forked.map_in_two)."""
    try:
        raw = upgrade_record(read_record_fields(path, READ_KEYS))
    except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return [False, unreadable_row(Path(path), exc)]
    problem = field_problem(raw)
    if problem:  # a record whose fields have the wrong types cannot be ranked, and must not crash anything
        return [False, unreadable_row(Path(path), ValueError(problem))]
    return [True, record_row(raw)]


def subfolders(path: str) -> list[str]:
    """The names of the folders in path (links to folders followed, as a glob does); none where it cannot be read."""
    try:
        with os.scandir(path) as entries:
            return [e.name for e in entries if e.is_dir()]
    except OSError:
        return []


def record_paths(root: Path, track: str | None) -> Iterator[str]:
    """<track>/<team>/<run_id>/run.json of every run folder under root, relative to it, one at a time (links to
    folders followed, as a glob does; the file itself is the reader's to refuse when it is a link)."""
    base = str(root)
    for t in ([track] if track else subfolders(base)):
        for team in subfolders(os.path.join(base, t)):
            for run in subfolders(os.path.join(base, t, team)):
                yield f"{t}/{team}/{run}/run.json"


def record_row(raw: dict[str, Any]) -> dict[str, Any]:
    """The row of a record whose fields were checked (field_problem): what the views read of it."""
    row = {k: raw.get(k) for k in FIELDS}
    track = raw.get("track") or {}
    row["ranking"] = track.get("ranking")
    row["divisions"] = track.get("divisions")
    bound = track.get("max_steps")  # absent from records made before --max-steps: 0, the budget
    row["max_steps"] = bound if isinstance(bound, int) and not isinstance(bound, bool) and bound > 0 else 0
    row["track_source"] = track.get("source")  # an organiser's file: commands name its path
    row["division"] = row.get("division") or "fixed"  # records from before the open division
    row["folder"] = record_folder(raw) or None
    identity = raw.get("identity")  # refused for its name (harness/launcher/run/identity.py): it owns no name
    row["refused"] = bool(isinstance(identity, dict) and identity.get("refused"))
    return row


def row_problem(row: dict[str, Any]) -> str:
    """"" when a row read from the index has the types record_row gives (the record's fields as field_problem
    checks them, and the fields it derives), else what is wrong."""
    problem = field_problem(row)
    if problem:
        return problem
    bound = row.get("max_steps")
    if type(bound) is not int or bound < 0:
        return "max_steps is not a count"
    if not isinstance(row.get("division"), str) or not isinstance(row.get("folder"), (str, type(None))):
        return "division or folder is not a string"
    if type(row.get("refused")) is not bool:
        return "refused is not a boolean"
    return ""


def separate_folders(rows: list[dict]) -> None:
    """Two submission folders never share a team's entry: a name's runs belong to the folder whose run used it
    first (harness/launcher/run/identity.py refuses the others' runs); runs of any other folder under that name
    (made before that rule, or planted) are shown apart, as "name [folder]". A refused run owns no name, as in
    identity.py: its folder's name may be another folder's team name."""
    first: dict[str, dict] = {}
    for row in rows:
        if row.get("folder") and row.get("status") != UNREADABLE and not row.get("refused"):
            seen = first.get(row["team"])
            if seen is None or (str(row.get("started_at") or ""), row["run_id"]) < (str(seen.get("started_at") or ""), seen["run_id"]):
                first[row["team"]] = row
    for row in rows:
        owner = first.get(row["team"])
        if owner is not None and row.get("folder") and row["folder"] != owner["folder"]:
            row["team"] = f"{row['team']} [{row['folder']}]"


def field_problem(raw: dict[str, Any]) -> str:
    """"" when every field the views read has its type (numbers are numbers, the status is a status),
    else the first that does not: a record is written by the launcher, but a figure in it may have come
    from a rank, and a file can be edited by hand."""
    from harness.results.records import STATUSES

    if raw.get("status") not in STATUSES:
        return f"status {str(raw.get('status'))[:40]!r} is not a run status"
    if not isinstance(raw.get("team"), str) or not isinstance(raw.get("run_id"), str):
        return "team and run_id must be strings"
    for key in NUMBER_FIELDS:
        v = raw.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"field {key} is {str(v)[:40]!r}, not a number"
        if key in COUNT_FIELDS and v is not None and not (0 <= v <= MAX_COUNT):  # a table column of int64
            return f"field {key} is {str(v)[:40]!r}, not a count from 0 to 2**62"
    for key in TEXT_FIELDS:
        v = raw.get(key)
        if v is not None and not isinstance(v, str):
            return f"field {key} is a {type(v).__name__}, not a string"
    for key in FLAG_FIELDS:
        if not isinstance(raw.get(key, False), bool):
            return f"field {key} is not true or false"
    for key in OBJECT_FIELDS:
        if raw.get(key) is not None and not isinstance(raw.get(key), dict):
            return f"field {key} is not an object"
    return ""


def unreadable_row(path: Path, exc: Exception) -> dict[str, Any]:
    """What the path says of an unreadable record: runs/<track>/<team>/<run_id>/run.json."""
    row: dict[str, Any] = {k: None for k in FIELDS}
    row.update(run_id=path.parent.name, team=path.parent.parent.name, track_name=path.parent.parent.parent.name,
               status=UNREADABLE, official=True, flagged=False, run_dir=str(path.parent), ranking=None,
               reason=f"{path}: unreadable run record ({type(exc).__name__}: {exc})")
    return row


def _effective_status(row: dict) -> str:
    return "flagged" if row.get("flagged") else (row.get("status") or "running")


def scored(row: dict) -> bool:
    """A run whose val_loss counts: ok, evaluated to a finite figure, not flagged (official-ness is the
    caller's filter)."""
    return _effective_status(row) == "ok" and is_finite(row.get("val_loss"))


def _newest(row: dict) -> tuple[str, str]:
    return row.get("started_at") or "", row["run_id"]


def team_runs(rows: Iterable[dict]) -> dict[str, tuple[list[dict], list[dict]]]:
    """Per team: the runs of its latest submission (the submission_sha256 of its newest run with an ANSWERABLE
    status; of its newest run when it has none), and its runs newer than that one that could not choose it (in
    progress, or aborted), oldest first: shown on the entry, never counted."""
    rows = list(rows)
    separate_folders(rows)
    by_team: dict[str, list[dict]] = {}
    for row in rows:
        by_team.setdefault(row["team"], []).append(row)
    out = {}
    for team, runs in by_team.items():
        unreadable = [r for r in runs if r.get("status") == UNREADABLE]  # of no known submission: always kept
        readable = [r for r in runs if r.get("status") != UNREADABLE]
        if not readable:
            out[team] = (unreadable, [])
            continue
        latest = max([r for r in readable if r.get("status") in ANSWERABLE] or readable, key=_newest)
        later = sorted((r for r in readable if r.get("status") not in ANSWERABLE and _newest(r) > _newest(latest)),
                       key=_newest)
        sha = latest.get("submission_sha256")
        shown_apart = {id(r) for r in later}
        chosen = ([r for r in readable if r.get("submission_sha256") == sha and id(r) not in shown_apart] if sha
                  else [latest])
        out[team] = (chosen + unreadable, later)
    return out


def current_runs(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """Per team, the runs of its latest submission (team_runs)."""
    return {team: runs for team, (runs, _later) in team_runs(rows).items()}


def setup_of(row: dict) -> tuple:
    """What makes two runs' figures of one kind: the bound (steps, or else the time budget) and the world size
    (the tokens a step sees). A mean over runs of other lengths or batches is the figure of no run."""
    return row.get("max_steps") or 0, None if row.get("max_steps") else row.get("budget_s"), row.get("world_size")


def one_setup(ok: list[dict]) -> tuple[list[dict], list[dict]]:
    """The runs made as the newest of them was, and the others (left out, never averaged in)."""
    if not ok:
        return [], []
    newest = setup_of(max(ok, key=_newest))
    return [r for r in ok if setup_of(r) == newest], [r for r in ok if setup_of(r) != newest]


def counted_runs(rows: Iterable[dict]) -> dict[str, list[dict]]:
    """Per team, the runs its entry is computed from: scored runs of its latest submission, of one setup."""
    return {team: one_setup([r for r in runs if scored(r)])[0] for team, runs in current_runs(rows).items()}


def _setup_phrase(setup: tuple) -> str:
    steps, budget_s, world_size = setup
    bound = f"--max-steps {steps}" if steps else ("a budget of ?" if budget_s is None else f"a {budget_s:g}s budget")
    return f"{bound} at world size {'?' if world_size is None else world_size}"


def _left_out_note(kept: list[dict], left: list[dict]) -> str:
    counts: dict[tuple, int] = {}
    for r in left:
        counts[setup_of(r)] = counts.get(setup_of(r), 0) + 1
    others = "; ".join(f"{n} with {_setup_phrase(setup)}" for setup, n in counts.items())
    return (f"counted: {len(kept)} ok run(s) with {_setup_phrase(setup_of(kept[0]))} (its newest run's setup); "
            f"left out: {others}")


def _pending_note(row: dict) -> str:
    """A run that could not choose the submission, as the entry says it."""
    if row.get("status") == "aborted":
        return f"run {row['run_id']} aborted ({row.get('reason') or 'no reason given'}): not counted"
    return f"run {row['run_id']} {row.get('status')} since {row.get('started_at') or '?'}: not counted until it ends"


def build_table(rows: list[dict], ranking: str = "mean", include_unofficial: bool = False,
                divisions: str = "together") -> pd.DataFrame:
    """The leaderboard as a DataFrame with COLUMNS, ranked teams first, in order. With divisions
    "separate", each division (fixed loop, open) is ranked on its own: ranks and ties within it."""
    if ranking not in ("mean", "best"):
        raise ValueError(f"ranking must be 'mean' or 'best', got {ranking!r}")
    if divisions not in ("together", "separate"):
        raise ValueError(f"divisions must be 'together' or 'separate', got {divisions!r}")
    eligible = [r for r in rows if r.get("official") or include_unofficial]
    ranked, unranked = [], []
    for team, (runs, later) in team_runs(eligible).items():
        ok, left = one_setup([r for r in runs if scored(r)])
        entry = _ranked_entry(team, ok, ranking) if ok else _unranked_entry(team, runs)
        (ranked if ok else unranked).append(entry)
        notes = [_left_out_note(ok, left)] if left else []
        notes += [_pending_note(r) for r in later]
        if entry["status"] != UNREADABLE:  # said on the entry the run may have belonged to
            notes += [r["reason"] for r in runs if r.get("status") == UNREADABLE]
        if notes:
            entry["reason"] = "; ".join([entry["reason"], *notes] if entry["reason"] else notes)
    groups: dict[str, list[dict]] = {}
    for entry in ranked:
        groups.setdefault(entry["division"] if divisions == "separate" else "", []).append(entry)
    ranked = []
    for _, group in sorted(groups.items()):  # "fixed" before "open": the harness's loop first
        group.sort(key=lambda e: (finite_first(e["val_loss"]), e["team"]))
        for i, entry in enumerate(group):
            entry["rank"] = i + 1
        _mark_ties(group, ranking)
        ranked += group
    unranked.sort(key=lambda e: (STATUS_ORDER.index(e["status"]) if e["status"] in STATUS_ORDER else 99, e["team"]))
    frame = pd.DataFrame(ranked + unranked, columns=COLUMNS)
    for col in INT_COLUMNS:  # a mean of counts is rounded: a count of 291.67 steps means nothing to anyone
        frame[col] = pd.to_numeric(frame[col], errors="coerce").round().astype("Int64")
    return frame


def _ranked_entry(team: str, ok: list[dict], ranking: str) -> dict:
    losses = [float(r["val_loss"]) for r in ok]
    best = min(ok, key=lambda r: finite_first(r["val_loss"]))
    s = summarize(losses)
    entry = {"team": team, "division": _division(ok), "n_runs": len(ok), "status": "ok", "run_id": best["run_id"],
             "reason": "",
             "precision": "/".join(sorted({r.get("precision") or "?" for r in ok})),
             "submission_sha256": (best.get("submission_sha256") or "")[:12], "_losses": losses}
    if ranking == "mean":
        interval = loss_interval(losses, floor_of(ok))
        entry.update(val_loss=s.mean, val_loss_std=s.std)
        if interval is not None:
            entry.update(interval_low=interval.low, interval_high=interval.high, interval_kind=interval.kind)
        for col in METRIC_COLUMNS:  # means over the same runs the loss is averaged over
            values = [r[col] for r in ok if r.get(col) is not None]
            entry[col] = sum(values) / len(values) if values else None
    else:
        entry.update(val_loss=best["val_loss"], val_loss_std=s.std)  # the best run's figure: no interval
        entry.update({col: best.get(col) for col in METRIC_COLUMNS})
    return entry


def floor_of(runs: list[dict]) -> float | None:
    """The loss floor of a mean of these runs: the mean of their floors (one data set: one floor; the synthetic local
    tracks' draws differ by about 0.01 between machines). None where no record holds one."""
    floors = [float(r["loss_floor"]) for r in runs if is_finite(r.get("loss_floor"))]
    return sum(floors) / len(floors) if floors else None


def _division(runs: list[dict]) -> str:
    return "/".join(sorted({r.get("division") or "fixed" for r in runs if r.get("status") != UNREADABLE})) or "fixed"


def _unranked_entry(team: str, runs: list[dict]) -> dict:
    best = min(runs, key=lambda r: STATUS_ORDER.index(_effective_status(r)) if _effective_status(r) in STATUS_ORDER else 99)
    status = _effective_status(best)
    reason = best.get("flag_reason") if status == "flagged" else best.get("reason")
    if status in ("running", "evaluating") and not reason:  # how a record its launcher never finished is seen
        reason = f"since {best.get('started_at') or '?'}"
    return {"team": team, "division": _division(runs), "n_runs": len(runs), "status": status, "reason": reason or "",
            "run_id": best["run_id"],
            "submission_sha256": (best.get("submission_sha256") or "")[:12],
            **{col: best.get(col) for col in ("params", "steps", "tokens", "train_time_s", "precision")}}


def _mark_ties(ranked: list[dict], ranking: str) -> None:
    """Each ranked team against the next, with a test that matches the ranking rule.

    mean: Welch's t-test on the runs; best: an exact permutation test on the best runs (how often
    relabelling the pooled runs gives a gap between the two bests at least as large). `vs_next`
    says `ahead` (p < 0.05), `tied` (not significant: the order is not evidence), or
    `undetermined` (fewer than 2 runs on a side: no test can be made, and the order is not evidence
    either). Tied and undetermined pairs are both marked, never silently ordered.
    """
    for a, b in zip(ranked, ranked[1:]):
        cmp = welch(a["_losses"], b["_losses"]) if ranking == "mean" else best_permutation(a["_losses"], b["_losses"])
        a["p_vs_next"] = cmp.p_value
        if cmp.p_value is None:
            a["vs_next"] = "undetermined"
        elif cmp.p_value >= ALPHA:
            a["vs_next"] = "tied"
            a.setdefault("_tied", []).append(b["rank"])
            b.setdefault("_tied", []).append(a["rank"])
        else:
            a["vs_next"] = "ahead"
    for entry in ranked:
        tied = sorted(entry.pop("_tied", []))
        entry["tied_with"] = ", ".join(f"#{r}" for r in tied)
        entry.pop("_losses", None)
