"""Which team a run is: the organiser says, never only a file the team writes.

A submission's folder is the organiser's handle on a team (submissions/team_x): its name is the folder's, and
`[team] name` in submission.toml (the team's own file) is what the leaderboard shows. Without a check, a second
folder could claim a team's name in its submission.toml, and the board, which groups runs by name and ranks a
team's latest submission, would show the victim as the impostor's crash.

- **A roster** (`roster.toml` in the runs root, the organiser's file: `[teams]` with `"Team name" = "folder"`)
  decides: a folder's runs rank under the roster's name for it; a folder not on the roster is refused.
- **Without one**, a team name belongs to the folder whose runs first used it in this runs tree (by the folder's
  name, the same on every node and machine); a run from another folder claiming it is refused, and so is one
  whose name differs but would share its records folder ("Team-A" after "Team A": both are `Team-A/`).

A refused run is recorded `invalid` under its own folder's name, naming the folder that owns the name, in a records
folder of refused runs (`<folder>~refused`, a name no team's records folder can have): it never lands among the
owner's runs, nor in the records folder of a team whose name its folder's name spells ("Team-A" refused the name
"Team A" would otherwise have been filed in Team A's `Team-A/`).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from harness.results.records import read_record_json, record_folder
from harness.submission.contract import team_name_is_plain, team_slug

ROSTER = "roster.toml"
REFUSED = "~refused"  # a refused run's records folder ends so: team_slug never keeps a "~"
ROSTER_MAX_BYTES = 1 << 20


class RosterError(ValueError):
    """The organiser's roster cannot be read: named, with the fix."""


@dataclass(frozen=True)
class Identity:
    name: str  # what ranks the run (and the folder its record goes in)
    refused: str = ""  # why the run is invalid: a name another folder owns, a folder not on the roster
    note: str = ""  # said in the record: the roster's name where the team's file says another

    @property
    def records_folder(self) -> str:
        """The folder of the track's records its runs go in: its name's, or, refused, one no team's can be."""
        return team_slug(self.name) + (REFUSED if self.refused else "")


def read_roster(runs_root: Path) -> dict[str, str] | None:
    """{folder name: team name} from the runs root's roster.toml; None when there is none."""
    path = Path(runs_root) / ROSTER
    try:
        raw_bytes = path.read_bytes()[:ROSTER_MAX_BYTES + 1]
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RosterError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(raw_bytes) > ROSTER_MAX_BYTES:
        raise RosterError(f"{path}: larger than {ROSTER_MAX_BYTES >> 20} MiB; a roster is one line a team")
    try:
        raw = tomllib.loads(raw_bytes.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RosterError(f"{path}: not valid TOML ({exc}); write [teams] with \"Team name\" = \"folder\" lines") from None
    teams = raw.get("teams")
    if not isinstance(teams, dict) or set(raw) - {"teams"}:
        raise RosterError(f"{path}: needs one table, [teams], of \"Team name\" = \"folder name\" lines")
    by_folder: dict[str, str] = {}
    for name, folder in teams.items():
        if not isinstance(folder, str) or not folder or "/" in folder or not team_name_is_plain(name) or not name.strip():
            raise RosterError(f"{path}: [teams] {name!r} = {folder!r}: a plain team name, and its submission "
                              "folder's name (no path)")
        if folder in by_folder:
            raise RosterError(f"{path}: folder {folder!r} is given to two teams ({by_folder[folder]!r}, {name!r})")
        twin = next((n for n in by_folder.values() if same_folder(n, name)), None)
        if twin is not None:  # one records folder for two teams' runs
            raise RosterError(f"{path}: [teams] {twin!r} and {name!r} would share one records folder "
                              f"({team_slug(name)!r}): give one of them a name that differs in a letter or digit")
        by_folder[folder] = name.strip()
    return by_folder


def same_folder(a: str, b: str) -> bool:
    """Whether two team names' records would share a folder: the same slug, or one that differs in case only
    (one folder on a file system that ignores case, macOS's and some shared mounts')."""
    return team_slug(a).casefold() == team_slug(b).casefold()


def name_owner(runs_root: Path, team: str, run_id: str = "") -> tuple[str, str, str] | None:
    """(the folder name whose runs first used `team`'s records folder in this runs tree, where its first run is,
    the team name that run used); None if none. Two names with one records folder ("Team A", "Team-A") are one
    name here: the second would share the first's folder and its run ids. A record is bounded, a regular file and
    an object (read_record_json): any record may have been planted."""
    first: tuple[str, str, str, str] | None = None
    slug = team_slug(team)
    for path in Path(runs_root).glob(f"*/{slug}/*/run.json"):
        try:
            raw = read_record_json(path)
        except (OSError, ValueError):
            continue
        folder, started, used = record_folder(raw), raw.get("started_at"), raw.get("team")
        if not isinstance(used, str) or not same_folder(used, team) or not folder or raw.get("run_id") == run_id:
            continue
        key = (str(started or ""), folder, str(path.parent), used)
        first = key if first is None or key < first else first
    return (first[1], first[2], first[3]) if first else None


def resolve_identity(runs_root: Path, claimed: str, folder: Path, run_id: str = "") -> Identity:
    """The name a run from `folder` ranks under, given the name its submission.toml claims (or its folder's)."""
    folder_name = Path(folder).resolve().name
    roster = read_roster(runs_root)
    if roster is not None:
        if folder_name not in roster:
            return Identity(folder_name, refused=f"folder {folder_name!r} is not on the organiser's roster "
                            f"({Path(runs_root) / ROSTER}). Fix: the organisers add it to {ROSTER}; on your own "
                            "machine, run it with another runs folder (--runs-dir)")
        name = roster[folder_name]
        note = "" if claimed == name else (f"ranked as {name!r}, the organiser's roster name for folder "
                                          f"{folder_name!r} (submission.toml says {claimed!r})")
        return Identity(name, note=note)
    owner = name_owner(runs_root, claimed, run_id)
    if owner is not None and owner[0] != folder_name:
        same = owner[2] == claimed
        taken = (f"team name {claimed!r} belongs to folder {owner[0]!r}, whose runs first used it" if same else
                 f"team name {claimed!r} would share its records folder {team_slug(claimed)!r} with team {owner[2]!r} "
                 f"of folder {owner[0]!r}, whose runs first used it")
        return Identity(folder_name, refused=f"{taken} ({owner[1]}); this run is recorded under folder "
                        f"{folder_name!r}. Fix: a copied "
                        "submission keeps its submission.toml: set [team] name to your own team's; a team that "
                        f"moved to a new folder asks the organisers for a line in {ROSTER} (the runs folder's)")
    return Identity(claimed)
