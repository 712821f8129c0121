"""A `--track` value as every command takes it, and the `--track` value a suggested command carries.

A value is a track's name (a built-in one, or any name with run records) or the path of an
organiser's TOML file (spec.is_track_file). Records live under runs/<name>/, so the commands that
read records (leaderboard, compare) need the file's `name`; the file also states the rules they
rank by (`ranking`, `divisions`). The commands that run something (run, check, scale, slurm) load
the file itself (spec.load_track).

A command the harness suggests (`harness check`'s, the sbatch script's, a chart's, a verdict's) must
work where it will be typed: another directory, another node. A built-in track is named; an
organiser's file is given by its absolute path, never by its name, which no command can load.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from harness.tracks.spec import BUILTIN_DIR, Track, builtin_track_names, is_track_file, load_track


def resolve_track_arg(value: str) -> tuple[str, Track | None]:
    """(the track's name, its Track when `value` is a TOML file). A name is not loaded: the records of a track
    whose file is elsewhere are still found by its name (raises TrackError for a file that is missing or wrong)."""
    if is_track_file(value):
        track = load_track(value)
        return track.name, track
    return value, None


def track_option(track: Track) -> str:
    """The `--track` value for a suggested command on a loaded track: its name when it is this harness's own
    file, else the absolute path of its TOML (which every node of a cluster must reach at that path)."""
    if not track.source or Path(track.source).resolve() == (BUILTIN_DIR / f"{track.name}.toml").resolve():
        return track.name
    return str(Path(track.source).resolve())


def recorded_track_option(name: str, source: str | None) -> str:
    """The same for a track a run record holds (its name and `track.source`). A record copied from another
    machine names that machine's copy of a built-in file (…/harness/tracks/<name>.toml): this harness's file of
    the same name is meant. A record without a source (older ones) can only be named."""
    if not isinstance(source, str) or not source:  # a record is a file: its fields are checked, never trusted
        return name
    path = Path(source)
    if name in builtin_track_names() and path.name == f"{name}.toml" and path.parent.parts[-2:] == ("harness", "tracks"):
        return name
    return str(path.expanduser().resolve())


def track_flag(records: list[dict]) -> str:
    """` --track T` for a suggested `harness run` that adds runs like these records (`harness compare`'s advice):
    none for `harness run`'s default track (`local`), or for records of several tracks (which the verdict says
    are not comparable); otherwise more seeds without it would run on another track."""
    tracks = {recorded_track_option(str(r.get("track_name") or ""),
                                    r["track"].get("source") if isinstance(r.get("track"), dict) else None)
              for r in records}
    if len(tracks) != 1 or tracks <= {"local", ""}:
        return ""
    return f" --track {shlex.quote(tracks.pop())}"
