"""Team colours: one per team on a track, the same in every chart, in `harness compare` and on the page.

Without matplotlib, so that the page (and `--no-charts`) can show a team's colour beside its name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

# 20 colours a room can tell apart on white, in an order where every prefix is as spread as it can be: the first
# teams of a track get the most different colours. Chosen from the Tableau, Okabe-Ito, Tol and Trubetskoy
# palettes by farthest-point selection in CIELAB (no two closer than 28 in CIE76 Delta E; a just-noticeable
# difference is about 2), leaving out colours too pale for a line on white (L* above 75), black and near-black
# (the legend's keys and the loss floor) and those near the grey of teams that did not finish.
PALETTE = ["#1f78b4", "#e69f00", "#ff00ff", "#3cb44b", "#e6194b", "#e377c2", "#8c564b", "#17becf", "#911eb4",
           "#4363d8", "#808000", "#c5b0d5", "#800000", "#ff1493", "#ff9896", "#882255", "#d55e00", "#009e73",
           "#006400", "#9a6324"]
NOT_FINISHED = "#9a9a9a"


class TeamColors:
    """Each team's colour on a track, the same in every chart and on the page: teams take the palette's colours
    in the order they first appeared on the track (their first record), so a team keeps its colour as others
    arrive, the first 20 teams all differ, and the colour never depends on which teams a chart shows or in which
    order. Past 20 teams colours repeat (every chart labels its teams); a team the records do not hold (a
    scale record alone) gets a colour from a hash of its name."""

    def __init__(self, teams_in_order: list[str]):
        self.order = {team: i for i, team in enumerate(dict.fromkeys(teams_in_order))}

    def __call__(self, team: str) -> str:
        index = self.order.get(team)
        if index is None:
            index = int.from_bytes(hashlib.sha256(team.encode()).digest()[:8], "big")
        return PALETTE[index % len(PALETTE)]


def team_colors(rows: list[dict], scale_records: list[dict] = ()) -> TeamColors:
    """The track's colours from its run rows (leaderboard.load_rows, every run whether official or not: the `--all`
    view and the official one agree) and its scale records: teams by their first record's time, then name."""
    last = "\uffff"  # a record without a time (an unreadable run.json) places its team after those with one
    first: dict[str, str] = {}
    for team, when in [(r.get("team"), r.get("started_at")) for r in rows] + \
                      [(r.get("team"), r.get("created_at")) for r in scale_records]:
        if isinstance(team, str):
            first[team] = min(first.get(team, last), when if isinstance(when, str) and when else last)
    return TeamColors(sorted(first, key=lambda t: (first[t], t)))


def track_colors(runs_root: Path, track: str) -> TeamColors:
    """The colours of a track from its records on disk: for a chart drawn outside a leaderboard rebuild
    (`harness compare`'s overlay, `harness scale`'s own chart)."""
    from harness.results.leaderboard import load_rows
    from harness.results.scale_records import load_scale_records

    return team_colors(load_rows(runs_root, track), load_scale_records(runs_root, track))
