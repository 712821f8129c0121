"""Rebuilding a track's derived outputs (leaderboard CSV, Markdown, HTML page, charts) from records.

Rebuilds are serialised by a lock file and every output is written atomically, so two
`harness run` finishing at once leave a consistent leaderboard, and a copied runs/ tree
gives the same files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.results.leaderboard import UNREADABLE, build_table, current_runs, load_rows, scored
from harness.results.locks import leaderboard_lock
from harness.results.records import utc_now, write_atomic


@dataclass
class Outputs:
    csv: Path
    markdown: Path
    html: Path
    charts: list[Path]
    teams: int
    ranked: int
    unreadable: list[str]  # reasons of the run.json files that could not be read (listed, never dropped)


def leaderboard_root(cli_value: str | None = None) -> Path:
    return Path(cli_value or os.environ.get("HARNESS_LEADERBOARD_DIR") or "leaderboard")


def plots_root(cli_value: str | None = None) -> Path:
    return Path(cli_value or os.environ.get("HARNESS_PLOTS_DIR") or "plots")


def track_ranking(rows: list[dict]) -> str:
    """The ranking rule saved in the track's newest record (records are self-contained)."""
    newest = max(rows, key=lambda r: r.get("started_at") or "", default=None)
    return (newest or {}).get("ranking") or "mean"


def rebuild(runs_root: Path, track: str, leaderboard_dir: Path, plots_dir: Path, include_unofficial: bool = False,
            ranking: str | None = None, charts: bool = True) -> Outputs:
    from harness.results.page import to_html, to_markdown

    rows = load_rows(runs_root, track)
    ranking = ranking or track_ranking(rows)
    table = build_table(rows, ranking, include_unofficial)
    suffix = "-all" if include_unofficial else ""
    out = leaderboard_dir / f"{track}{suffix}"
    chart_paths: list[Path] = []
    with leaderboard_lock(leaderboard_dir):
        if charts:
            from harness.results.plots import draw_track, load_scale_records

            eligible = [r for r in rows if r.get("official") or include_unofficial]
            counted = {team: [r for r in runs if scored(r)] for team, runs in current_runs(eligible).items()}
            chart_paths = draw_track(track, table, counted, load_scale_records(runs_root, track),
                                     plots_dir / f"{track}{suffix}")
        csv_path, md_path, html_path = (out.with_suffix(".csv"), out.with_suffix(".md"), out.with_suffix(".html"))
        write_atomic(csv_path, table.to_csv(index=False))
        write_atomic(md_path, to_markdown(table, track, ranking))
        write_atomic(html_path, to_html(table, track, ranking, chart_paths, html_path, utc_now()))
    return Outputs(csv_path, md_path, html_path, chart_paths, len(table), int((table["status"] == "ok").sum()),
                   [r["reason"] for r in rows if r["status"] == UNREADABLE])


def tracks_in(runs_root: Path) -> list[str]:
    return sorted({p.parent.parent.parent.name for p in Path(runs_root).glob("*/*/*/run.json")})
