"""The leaderboard as Markdown and as a static HTML page (the table and the charts).

The page needs no server and no script: open leaderboard/<track>.html in any browser, or put
it on a projector. Large type, high contrast, tied teams and non-finishers marked.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

import pandas as pd

# Ranking first (what a room reads from the back), then throughput, then identity and reasons.
SHOWN = ["rank", "team", "val_loss", "ci95", "n_runs", "status", "vs_next", "tied_with", "p_vs_next", "tokens_per_s", "mfu",
         "comm_overlap_efficiency", "params", "tokens", "steps", "train_time_s", "startup_s", "precision", "run_id", "submission_sha256", "reason"]


def fmt(col: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if col == "val_loss":
        return f"{value:.4f}"
    if col == "ci95":
        return f"±{value:.4f}"
    if col in ("mfu", "comm_overlap_efficiency"):
        return f"{100 * value:.1f}%"
    if col == "tokens_per_s":
        return f"{value:,.0f}"
    if col in ("train_time_s", "startup_s"):
        return f"{value:.1f}"
    if col == "p_vs_next":
        return "<0.001" if value < 0.001 else f"{value:.3f}"
    if col in ("params", "tokens", "steps", "n_runs", "rank"):
        return f"{round(value):,}"
    return str(value)


def to_markdown(table: pd.DataFrame, track: str, ranking: str) -> str:
    lines = [f"# Leaderboard: {track}", "",
             f"Ranked by validation loss ({ranking} over each team's official ok runs of its latest submission).", ""]
    lines.append("| " + " | ".join(SHOWN) + " |")
    lines.append("|" + "---|" * len(SHOWN))
    for _, row in table.iterrows():
        cells = [fmt(c, row[c]).replace("|", "\\|") for c in SHOWN]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


CSS = """
body { font-family: system-ui, sans-serif; font-size: 20px; margin: 2em; background: #fff; color: #111; }
h1 { font-size: 2.2em; margin-bottom: 0.2em; }
p.meta { color: #444; }
table { border-collapse: collapse; margin: 1em 0; }
th, td { padding: 0.35em 0.7em; border-bottom: 1px solid #ccc; text-align: right; white-space: nowrap; }
th { background: #222; color: #fff; position: sticky; top: 0; }
td.team, td.status, td.reason, td.run_id { text-align: left; }
td.reason { white-space: normal; min-width: 20em; max-width: 40em; font-size: 0.75em; }
td.run_id, td.submission_sha256 { font-family: monospace; font-size: 0.75em; }
tr.tied td.tied_with { font-weight: bold; color: #a40; }
tr.undetermined td.vs_next, tr.tied td.vs_next { font-weight: bold; color: #a40; }
tr.unranked td { color: #777; }
tr.rank-1 td { background: #fff6cc; }
.charts img { max-width: 48%; margin: 0.5em 1%; border: 1px solid #ddd; }
"""


def to_html(table: pd.DataFrame, track: str, ranking: str, chart_paths: list[Path], page_path: Path,
            generated_at: str) -> str:
    rows = []
    for _, row in table.iterrows():
        classes = ["ranked" if row["status"] == "ok" else "unranked"]
        if pd.notna(row["rank"]) and int(row["rank"]) == 1:
            classes.append("rank-1")
        if row["tied_with"]:
            classes.append("tied")
        if row["vs_next"] == "undetermined":
            classes.append("undetermined")
        cells = "".join(f'<td class="{c}">{html.escape(fmt(c, row[c]))}</td>' for c in SHOWN)
        rows.append(f'<tr class="{" ".join(classes)}" data-team="{html.escape(str(row["team"]))}">{cells}</tr>')
    head = "".join(f"<th>{html.escape(c)}</th>" for c in SHOWN)
    charts = "".join(
        f'<img src="{html.escape(os.path.relpath(p, page_path.parent))}" alt="{html.escape(p.stem)}">'
        for p in chart_paths)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Leaderboard: {html.escape(track)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style></head>
<body>
<h1>Leaderboard: {html.escape(track)}</h1>
<p class="meta">Ranked by validation loss ({html.escape(ranking)} over each team's official ok runs of its latest
submission). <b>vs_next</b> compares each team with the next one down: <i>ahead</i> (significant,
p &lt; 0.05), <i>tied</i> (not significantly different) or <i>undetermined</i> (one run on a side:
nothing can be tested); only <i>ahead</i> is evidence of the order. Generated {html.escape(generated_at)} from the run records.</p>
<table id="leaderboard"><thead><tr>{head}</tr></thead><tbody>
{chr(10).join(rows)}
</tbody></table>
<div class="charts">{charts}</div>
</body></html>
"""
