"""Rebuilding a track's derived outputs (leaderboard CSV, Markdown, HTML page, charts) from records.

Rebuilds are serialised by a lock file and every output is written atomically, so two
`harness run` finishing at once leave a consistent leaderboard, and a copied runs/ tree
gives the same files. While `harness leaderboard --watch` runs, every page rebuilt from its
records reloads itself; once it stops, none does.
"""

from __future__ import annotations

import difflib
import gc
import json
import math
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from harness.results import stats
from harness.results.charts.colors import team_colors
from harness.results.charts.empty import empty_state
from harness.results.leaderboard import UNREADABLE, build_table, counted_runs, load_rows, record_paths, subfolders
from harness.results.locks import leaderboard_lock
from harness.results.records import utc_now, write_atomic
from harness.results.row_index import index_path
from harness.results.scale_records import load_scale_records
from harness.tracks.resolve import recorded_track_option, resolve_track_arg, track_option
from harness.tracks.spec import Track


class UnknownTrack(LookupError):
    """A track with no run records under the runs folder; the message suggests the near name."""


@dataclass
class Outputs:
    csv: Path
    markdown: Path
    html: Path
    charts: list[Path]
    teams: int
    ranked: int
    unreadable: list[str]  # reasons of the run.json files that could not be read (listed, never dropped)
    chart_error: str = ""  # why the charts could not be drawn: the tables are written all the same


def _newest(rows: list[dict], key: str):
    newest = max(rows, key=lambda r: r.get("started_at") or "", default=None)
    return (newest or {}).get(key)


def track_ranking(rows: list[dict]) -> str:
    """The ranking rule saved in the track's newest record (records are self-contained)."""
    return _newest(rows, "ranking") or "mean"


def track_divisions(rows: list[dict]) -> str:
    """Whether the track ranks the divisions together or apart, from its newest record."""
    return _newest(rows, "divisions") or "together"


def command_track(rows: list[dict], track: str, spec: Track | None = None) -> str:
    """The `--track` value of the commands the charts suggest: an organiser's track by its file's absolute path
    (the given file, or the one the newest record was loaded from), since its name loads nothing."""
    return track_option(spec) if spec else recorded_track_option(track, _newest(rows, "track_source"))


def choose_tracks(runs_root: Path, values: list[str]) -> dict[str, Track | None]:
    """The tracks `harness leaderboard --track ...` rebuilds: each value's name (a TOML file's `name`), with the
    file when one was given (its rules rank the view); none given: every track with records. Raises TrackError
    for a file that cannot be loaded, UnknownTrack for a track without records."""
    chosen: dict[str, Track | None] = {}
    for value in values:
        name, spec = resolve_track_arg(value)
        chosen[name] = spec or chosen.get(name)  # the same track named and given as a file: the file's rules
    check_tracks(runs_root, list(chosen))
    return chosen or dict.fromkeys(tracks_in(runs_root))


def check_tracks(runs_root: Path, tracks: list[str]) -> None:
    """Every track asked for has records: a typo must not write empty files and empty charts."""
    known = tracks_in(runs_root)
    for track in tracks:
        if track not in known:
            hint = difflib.get_close_matches(track, known, n=1)
            raise UnknownTrack(f"no run records for track {track!r} under {runs_root}."
                               + (f" Did you mean: {hint[0]}?" if hint else "")
                               + (f" Tracks with records: {', '.join(known)}." if known else ""))


def rebuild(runs_root: Path, track: str, leaderboard_dir: Path, plots_dir: Path, include_unofficial: bool = False,
            ranking: str | None = None, charts: bool = True, refresh_s: float | None = None,
            spec: Track | None = None) -> Outputs:
    """Every output of the track. `spec`: the track's TOML when a command was given one (`--track x.toml`): its
    `ranking` and `divisions` are the rules, as the organiser's file states them now; without it, the newest
    record's. The page reloads itself only while a watcher runs on these records (its period, or `refresh_s`
    where shorter: the watcher passes its own): a page written with a reload after the watcher stopped would
    reload forever, and one written without it by a `harness run` during a watch would stop the screen."""
    with paused_gc():
        return _rebuild(runs_root, track, leaderboard_dir, plots_dir, include_unofficial, ranking, charts, refresh_s,
                        spec)


_GC_LOCK = threading.Lock()
_gc_pauses, _gc_was_on = 0, True  # how many rebuilds run now; whether the collector ran before the first


@contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic garbage collector off while a board is rebuilt: its rows and tables are hundreds of thousands
    of small objects without cycles, whose making starts collections that walk the whole heap (torch's too, in a
    launcher): a fifth to a third of a cold rebuild of 10,000 records (docs/performance.md). On again after, as it
    was before the first of the rebuilds running at once (a count under a lock: two threads reading and setting
    it in turn could leave it off for good); what the charts left in cycles is collected then."""
    global _gc_pauses, _gc_was_on
    with _GC_LOCK:
        if _gc_pauses == 0:
            _gc_was_on = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_on:
                gc.enable()


def _rebuild(runs_root: Path, track: str, leaderboard_dir: Path, plots_dir: Path, include_unofficial: bool,
             ranking: str | None, charts: bool, refresh_s: float | None, spec: Track | None) -> Outputs:
    from harness.results.page import to_html
    from harness.results.tables import to_csv, to_markdown

    # Parses only records new to the index; the table's statistics are imported while a fork parses half of them
    rows = load_rows(runs_root, track, index_path(leaderboard_dir, track), meanwhile=stats.prepare)
    scale_records = load_scale_records(runs_root, track)
    ranking = ranking or (spec.ranking if spec else track_ranking(rows))
    table = build_table(rows, ranking, include_unofficial, spec.divisions if spec else track_divisions(rows))
    colors = team_colors(rows, scale_records)  # all runs, official or not: the `--all` view's colours are the same
    empty = empty_state(rows, table, track, include_unofficial)
    reload_s = watching_period(runs_root)
    if reload_s is not None and refresh_s:
        reload_s = min(reload_s, refresh_s)
    suffix = "-all" if include_unofficial else ""
    out = leaderboard_dir / f"{track}{suffix}"
    chart_paths: list[Path] = []
    chart_error = ""
    with leaderboard_lock(leaderboard_dir):
        if charts:
            from harness.results.charts.plots import draw_track

            eligible = [r for r in rows if r.get("official") or include_unofficial]
            counted = counted_runs(eligible)  # the runs the table's figures are of, and no others
            try:
                chart_paths = draw_track(track, table, counted, scale_records, plots_dir / f"{track}{suffix}", ranking,
                                         command_track(rows, track, spec), colors=colors, empty=empty)
            except Exception as exc:  # noqa: BLE001  (the charts are a view of the view: never the board's end)
                chart_error = f"{type(exc).__name__}: {str(exc)[:300]}"
        csv_path, md_path, html_path = (out.with_suffix(".csv"), out.with_suffix(".md"), out.with_suffix(".html"))
        write_atomic(csv_path, to_csv(table))
        write_atomic(md_path, to_markdown(table, track, ranking, empty=empty))
        write_atomic(html_path, to_html(table, track, ranking, chart_paths, utc_now(), rows, refresh_s=reload_s,
                                          scale_records=scale_records, colors=colors, empty=empty))
    return Outputs(csv_path, md_path, html_path, chart_paths, len(table), int((table["status"] == "ok").sum()),
                   [r["reason"] for r in rows if r["status"] == UNREADABLE], chart_error)


def tracks_in(runs_root: Path) -> list[str]:
    """The tracks with a run record: a folder <track>/<team>/<run>/run.json that exists (as pathlib's glob of
    "*/*/*/run.json" finds them, hidden names and links to folders included), looked for until the first is
    found: that glob of every record took a third of a second at 10,000, twice per `harness leaderboard`."""
    root = str(runs_root)
    return sorted(track for track in subfolders(root)
                  if any(os.path.exists(os.path.join(root, rel)) for rel in record_paths(Path(root), track)))


def records_signature(runs_root: Path, tracks: list[str]) -> tuple:
    """What changes when a run record or a scale record is written: their paths and modification times."""
    found = []
    for track in tracks:
        for pattern in (f"{track}/*/*/run.json", f"{track}/*/scale-*/scale.json"):
            for path in Path(runs_root).glob(pattern):
                try:
                    found.append((str(path), path.stat().st_mtime_ns))
                except OSError:
                    continue
    return tuple(sorted(found))


# --------------------------------------------------------------------------- watching

# A watcher's mark in the runs root, one per process ("<host>-<pid>" after it), holding its period: a `harness run`
# in another process rebuilding the page meanwhile keeps the reload in it.
WATCH_MARK = ".leaderboard-watch-"
STALE_S = 120.0  # a mark untouched for two periods and this long: its watcher was killed before it could remove it
MARK_MAX_BYTES = 4096


def watching_period(runs_root: Path) -> float | None:
    """The reload period of the watchers running on these records (the shortest), or None when none runs."""
    from harness.submission.files import read_regular

    periods = []
    for path in Path(runs_root).glob(WATCH_MARK + "*"):
        try:
            every_s = float(json.loads(read_regular(path, MARK_MAX_BYTES))["every_s"])  # never a FIFO, a link
            age_s = time.time() - path.stat().st_mtime
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if math.isfinite(every_s) and every_s > 0 and age_s <= 2 * every_s + STALE_S:
            periods.append(every_s)
    return min(periods, default=None)


def watch(runs_root: Path, tracks: list[str], rebuild_all: Callable[[], None], every_s: float = 10.0,
          keep_going: Callable[[], bool] = lambda: True, sleep: Callable[[float], None] = time.sleep) -> int:
    """Rebuild whenever the records change, checking every `every_s` seconds, while keep_going() (or until Ctrl-C,
    re-raised); returns the number of rebuilds the changes caused. While it runs, its mark in the runs root makes every page rebuilt
    reload itself on the same period; when it stops, the mark goes and the pages are rebuilt once more, without
    the reload, so a screen left on the page stops reloading with it."""
    mark = Path(runs_root) / f"{WATCH_MARK}{socket.gethostname()}-{os.getpid()}"
    seen, rebuilds, interrupted, started = None, 0, None, False
    try:
        while keep_going():
            write_atomic(mark, json.dumps({"every_s": every_s}))  # also the heartbeat that shows it is alive
            current = records_signature(runs_root, tracks)
            if current != seen:
                # From here a page may be written with the reload: a Ctrl-C in the middle of this first rebuild
                # (the page written, its line not yet printed) must still be followed by the last one.
                started = True
                try:
                    rebuild_all()
                except Exception as exc:  # noqa: BLE001  (a board that cannot be built now may be at the next change)
                    print(f"harness leaderboard --watch: rebuild failed ({type(exc).__name__}: {exc}); watching on",
                          file=sys.stderr, flush=True)
                seen, rebuilds = current, rebuilds + 1
            sleep(every_s)
    except KeyboardInterrupt as stop:  # Ctrl-C is how a watch ends: the last rebuild still happens
        interrupted = stop
    finally:
        mark.unlink(missing_ok=True)
    if started:
        rebuild_all()
    if interrupted is not None:
        raise interrupted
    return rebuilds
