"""Is this team name already someone else's? A copied submission keeps its submission.toml's name.

Run records say which folder each run came from (`submission_dir`) and on which machine
(`hostname`). A team name whose runs on this machine came from a different folder is a warning
for `harness check` and `harness run`: the leaderboard would rank both folders as one team.
"""

from __future__ import annotations

import socket
from pathlib import Path

from harness.results.records import read_record_json
from harness.submission.contract import team_slug


def name_clash(runs_root: Path, team: str, folder: Path) -> str | None:
    """A warning when runs of another submission folder on this machine already use `team`, else None."""
    here, mine = socket.gethostname(), str(Path(folder).resolve())
    others: dict[str, int] = {}
    for path in Path(runs_root).glob(f"*/{team_slug(team)}/*/run.json"):
        try:
            raw = read_record_json(path)  # bounded, a regular file, an object: any run's record may be planted
        except (OSError, ValueError):
            continue
        source = raw.get("submission_dir")
        if not isinstance(source, str) or not isinstance(raw.get("hostname"), str):
            continue
        if raw.get("team") != team or not source or raw.get("hostname") != here or source == mine:
            continue  # another team's slug, an older record, another machine, or this very folder
        others[source] = others.get(source, 0) + 1
    if not others:
        return None
    where = ", ".join(f"{src} ({n} run{'s' if n > 1 else ''})" for src, n in sorted(others.items()))
    return (f"team name {team!r} is already used by another submission folder under {runs_root}: {where}. "
            "A copied submission keeps its submission.toml: set [team] name to your own team's, or the "
            "leaderboard ranks both folders as one team")
