"""The leaderboard as one self-contained HTML page: the table and the charts, for an event screen and a laptop.

- Self-contained: the charts are embedded (data URIs), so the file can be mailed, copied or served
  from any folder. No script and no server; while `--watch` runs, a reload every few seconds.
- The columns a room ranks by come first and fit a 1400 px screen (and an 800 px laptop window,
  where the throughput columns give way); everything else is one click away in each team's details,
  which open in a row of their own under the team's (a box laid over the table hid the next teams).
- Each team's name has its colour in the charts beside it.
- Ties, undetermined orders, and the status and reason of teams that did not finish are on the page; a
  ranking with nobody in it says why and what to type.
- The charts stand in two columns, each chart under the shorter column (chart_columns), so a short chart
  beside a tall one leaves no blank under it; on a narrow screen, one column in the charts' order.
"""

from __future__ import annotations

import base64
import html
import re
import struct
from pathlib import Path

from typing import Callable

import pandas as pd

from harness.results.cells import NOT_MEASURED, cell, fmt, missing
from harness.results.charts.colors import NOT_FINISHED
from harness.results.charts.empty import EmptyState
from harness.results.leaderboard import COLUMNS
from harness.results.scale_records import measured, newest_per_team

# The main table: (column, header, header tooltip). Everything in COLUMNS is in each team's details.
MAIN = [
    ("rank", "#", "rank by validation loss"),
    ("team", "team", "click a team for its details"),
    ("val_loss", "val loss", "validation loss, nats per token (lower is better)"),
    ("interval", "interval", "the 95% t interval of the mean; from 2 runs their range (min–max); never below the "
                             "loss floor (cut at floor); none from a single run"),
    ("n_runs", "runs", "official ok runs of the team's latest submission"),
    ("vs_next", "vs next", "is the gap to the next team evidence? ahead = significant (p < 0.05)"),
    ("tokens_per_s", "tokens/s", "training throughput, all devices"),
    ("mfu", "MFU", "model FLOPs utilisation (n/a without a known peak, as on a CPU)"),
    ("comm_overlap_efficiency", "comm overlap", "communication probe at the run's world size: compute-only / "
                                                "synchronised step time (not weak scaling)"),
]
WIDE_ONLY = {"tokens_per_s", "mfu", "comm_overlap_efficiency"}  # give way on a narrow screen
CHART_TITLES = {"loss_vs_time": "Loss against training time", "loss_vs_tokens": "Loss against tokens seen",
                "val_loss": "Validation loss per team", "scaling": "Weak scaling (harness scale)",
                "throughput": "Throughput, MFU and the communication probe"}

CSS = """
:root { --ink: #111; --muted: #555; --line: #d8d8d8; --warn: #a64200; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; font-size: 20px; line-height: 1.35;
       margin: 0 auto; padding: 1.2rem 1.6rem 3rem; max-width: 1600px; color: var(--ink); background: #fff; }
h1 { font-size: 2.3em; margin: 0.1em 0 0.15em; }
p.meta { color: var(--muted); margin: 0.2em 0; font-size: 0.9em; }
p.key { font-size: 0.85em; color: var(--muted); }
.badge { display: inline-block; padding: 0.05em 0.45em; border-radius: 0.35em; font-size: 0.85em; font-weight: 600; }
.badge.ahead { background: #e3f3e3; color: #1d5e1d; }
.badge.tied, .badge.undetermined { background: #fde8d7; color: var(--warn); }
.badge.division { background: #e4ecf7; color: #1f3f6e; font-size: 0.7em; vertical-align: middle; }
.reported { color: var(--muted); font-size: 0.75em; }
table { border-collapse: collapse; width: 100%; margin: 0.8em 0; }
th, td { padding: 0.38em 0.55em; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { background: #222; color: #fff; font-weight: 600; position: sticky; top: 0; z-index: 1; }
th.team, td.team, td.notice { text-align: left; }
td.rank { font-weight: 700; font-size: 1.15em; }
td.val_loss { font-weight: 700; font-size: 1.2em; font-variant-numeric: tabular-nums; }
td { font-variant-numeric: tabular-nums; }
tr.rank-1 td { background: #fff6cc; }
tr.unranked td { color: #666; }
td.notice { white-space: normal; font-size: 0.85em; }
td.notice .status { font-weight: 700; color: var(--warn); margin-right: 0.4em; }
td.notice .reason { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 0.9em; }
details > summary { cursor: pointer; font-weight: 600; list-style: none; }
details > summary::before { content: "▸ "; color: #888; font-size: 0.8em; }
details[open] > summary::before { content: "▾ "; }
.swatch { display: inline-block; width: 0.75em; height: 0.75em; border-radius: 0.2em; margin-right: 0.35em;
          border: 1px solid #0005; vertical-align: -0.05em; }
tr.details { display: none; }
tr:has(details[open]) + tr.details { display: table-row; }  /* the team's details, pushing the next team down */
tr.details > td { text-align: left; white-space: normal; padding: 0 0.55em 0.7em; }
.panel { padding: 0.8em 1em; background: #fbfbfb; border: 1px solid #bbb; border-radius: 0.4em;
         font-weight: 400; font-size: 0.8em; }
p.empty { font-size: 1.05em; padding: 0.6em 0.9em; background: #fdf3e7; border-left: 0.3em solid var(--warn); }
p.empty code, p.key code { font-family: ui-monospace, monospace; background: #f1f1f1; padding: 0.05em 0.3em; }
.panel dl { display: grid; grid-template-columns: repeat(auto-fill, minmax(15em, 1fr)); gap: 0.3em 1.2em; margin: 0; }
.panel dt { color: var(--muted); font-size: 0.85em; }
.panel dd { margin: 0; font-family: ui-monospace, monospace; overflow-wrap: anywhere; }
.panel dd.reason { white-space: pre-wrap; }
.panel .wide { grid-column: 1 / -1; }
.charts { display: flex; gap: 1.2em; margin-top: 1.5em; align-items: flex-start; }
.charts .column { flex: 1 1 0; min-width: 0; display: flex; flex-direction: column; gap: 1.2em; }
.charts figure { margin: 0; border: 1px solid #e2e2e2; border-radius: 0.4em; padding: 0.5em; }
.charts figcaption { font-weight: 600; margin-bottom: 0.3em; }
.charts img { width: 100%; height: auto; display: block; }
.charts .measured { font-size: 0.85em; margin: 0.5em 0.2em 0.2em; }
.charts .measured ul { margin: 0.3em 0 0; padding-left: 1.2em; color: var(--warn); }
@media (max-width: 1000px) {
  body { font-size: 17px; padding: 0.8rem; }
  .charts { flex-direction: column; align-items: stretch; }
  .charts .column { display: contents; }  /* one column: the charts in their own order (each figure's `order`) */
  th.wide, td.wide { display: none; }
}
"""


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _badge(row) -> str:
    verdict = row["vs_next"]
    if missing(verdict) or not verdict:
        return ""
    return f'<span class="badge {html.escape(verdict)}">{html.escape(cell("vs_next", row))}</span>'


def _details(row) -> str:
    items = []
    for col in COLUMNS:
        if col in ("team",):
            continue
        value = fmt(col, row[col])
        if not value:
            continue
        cls = "wide reason" if col == "reason" else ""
        items.append(f'<div class="{cls}"><dt>{html.escape(col)}</dt><dd class="{cls}">{html.escape(value)}</dd></div>')
    return f'<div class="panel"><dl>{"".join(items)}</dl></div>'


def _row(row, color: str) -> str:
    """The team's row, then its details' row (shown while its name is open: it pushes the next team down)."""
    team = html.escape(str(row["team"]))
    ranked = row["status"] == "ok"
    classes = ["ranked" if ranked else "unranked"]
    if ranked and int(row["rank"]) == 1:
        classes.append("rank-1")
    if isinstance(row["tied_with"], str) and row["tied_with"]:
        classes.append("tied")
    if row["vs_next"] == "undetermined":
        classes.append("undetermined")
    open_division = row.get("division") == "open"
    tag = ' <span class="badge division" title="open division: the team\'s own train.py">open</span>' if open_division else ""
    swatch = f'<span class="swatch" style="background: {html.escape(color)}" title="its colour in the charts"></span>'
    cells = [f'<td class="rank">{html.escape(fmt("rank", row["rank"]))}</td>',
             f'<td class="team"><details><summary>{swatch}{team}{tag}</summary></details></td>']
    if ranked:
        for col, _, _ in MAIN[2:]:
            text = _badge(row) if col == "vs_next" else html.escape(cell(col, row))
            if col == "tokens_per_s" and open_division and text:  # the script's own count, not measured
                text += ' <span class="reported" title="reported by the team\'s script, not measured">(reported)</span>'

            wide = " wide" if col in WIDE_ONLY else ""
            cells.append(f'<td class="{col}{wide}">{text}</td>')
    else:
        reason = str(row["reason"] or "")
        cells.append(f'<td class="notice" colspan="{len(MAIN) - 2}"><span class="status">{html.escape(row["status"])}'
                     f'</span><span class="reason">{html.escape(reason)}</span></td>')
    return (f'<tr class="{" ".join(classes)}" data-team="{team}">{"".join(cells)}</tr>\n'
            f'<tr class="details" data-details-for="{team}"><td colspan="{len(MAIN)}">{_details(row)}</td></tr>')


def scaling_caption(scale_records: list[dict]) -> str:
    """The weak-scaling efficiency that was measured, in words under the chart: the figure the page states is the
    measurement, never the model's prediction; and what the measurement itself says not to take at face value."""
    parts, notes = [], []
    for rec in newest_per_team(scale_records):
        points = sorted((p for p in rec.get("points", []) if p.get("world_size", 1) > 1 and measured(p) is not None),
                        key=lambda p: p["world_size"])
        if not points:
            continue
        figures = ", ".join(f"{measured(p):.3f} at {p['world_size']} devices" for p in points)
        when = (rec.get("created_at") or "")[:10]
        parts.append(f"<b>{html.escape(str(rec.get('team', '?')))}</b> {html.escape(figures)} "
                     f"({html.escape(str(rec.get('device_name') or '?'))}{', ' + html.escape(when) if when else ''})")
        notes += [f"{rec.get('team', '?')}: {n}" for n in rec.get("notes", [])]
    if not parts:
        return ""
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f'<div class="measured">Measured weak-scaling efficiency: {"; ".join(parts)}. The dashed line is the '
            f'model\'s prediction, not a measurement.{"<ul>" + items + "</ul>" if items else ""}</div>')


def png_aspect(path: Path) -> float:
    """A PNG's height over its width, from its header (the IHDR chunk: width, height as big-endian 32-bit)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(24)
        width, height = struct.unpack(">II", head[16:24])
    except (OSError, struct.error):  # a chart gone or cut short: placed as a square, never the page's end
        return 1.0
    return height / width if width else 1.0


def chart_columns(paths: list[Path], columns: int = 2) -> list[list[tuple[int, Path]]]:
    """The charts (with their place in `paths`) in `columns` columns of equal width: each, in order, under the
    column that is shortest so far (heights as aspect ratios: at equal widths they compare as heights). A short
    chart is followed by the next one in its column, not by the blank beside a taller chart."""
    placed: list[list[tuple[int, Path]]] = [[] for _ in range(columns)]
    heights = [0.0] * columns
    for i, path in enumerate(paths):
        shortest = heights.index(min(heights))
        placed[shortest].append((i, path))
        heights[shortest] += png_aspect(path)
    return [column for column in placed if column]


def machine_summary(rows: list[dict]) -> str:
    """Which machine(s) produced the figures, from the newest ok run (records are self-contained)."""
    ok = [r for r in rows if r.get("status") == "ok"] or rows
    if not ok:
        return ""
    newest = max(ok, key=lambda r: r.get("started_at") or "")
    machine = newest.get("machine") or {}
    versions = newest.get("versions") or {}
    parts = []
    if machine.get("cpu"):
        parts.append(f"{machine['cpu']} ({machine.get('cores', '?')} cores)")
    if newest.get("world_size"):
        parts.append(f"{newest['world_size']} x {newest.get('device_name') or 'device'} ranks")
    torch = versions.get("torch") or newest.get("torch_version")
    if torch:
        parts.append(f"torch {torch}")
    return "; ".join(parts)


def empty_html(empty: EmptyState | None) -> str:
    """Why nobody is ranked and what to type, above the table (empty.empty_state)."""
    if empty is None:
        return ""
    command = f"<code>{html.escape(empty.command)}</code> " if empty.command else ""
    detail = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(empty.detail))  # options it names, as code
    return f'<p class="empty"><b>{html.escape(empty.headline)}.</b> {command}{detail}</p>'


def to_html(table: pd.DataFrame, track: str, ranking: str, chart_paths: list[Path], generated_at: str,
            rows: list[dict] | None = None, refresh_s: float | None = None,
            scale_records: list[dict] | None = None, *, colors: Callable[[str], str],
            empty: EmptyState | None = None) -> str:
    """The page; `refresh_s` makes it reload itself (views.rebuild passes it only while a watcher runs)."""
    head = "".join(f'<th class="{c}{" wide" if c in WIDE_ONLY else ""}" title="{html.escape(tip)}">{html.escape(h)}</th>'
                   for c, h, tip in MAIN)
    # A team that did not finish is grey on the page as in every chart (its own colour is drawn nowhere yet).
    body = "\n".join(_row(row, colors(str(row["team"])) if row["status"] == "ok" else NOT_FINISHED)
                     for _, row in table.iterrows())
    columns = []
    for column in chart_columns(chart_paths):
        figures = []
        for i, p in column:
            title = html.escape(CHART_TITLES.get(p.stem, p.stem))
            caption = scaling_caption(scale_records or []) if p.stem == "scaling" else ""
            figures.append(f'<figure style="order: {i}"><figcaption>{title}</figcaption><img src="{data_uri(p)}" '
                           f'alt="{html.escape(p.stem)}">{caption}</figure>')
        columns.append(f'<div class="column">{"".join(figures)}</div>')
    ranked = int((table["status"] == "ok").sum())
    machine = machine_summary(rows or [])
    rule = "mean over" if ranking == "mean" else "the best of"
    ranks = table.loc[table["status"] == "ok", "rank"].tolist()
    if len(ranks) != len(set(ranks)):  # ranks restart: the track ranks its divisions apart
        rule = "each division (the harness's loop, then open: a team's own train.py) ranked on its own; " + rule
    refresh = f'<meta http-equiv="refresh" content="{max(1, round(refresh_s))}">' if refresh_s else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Leaderboard: {html.escape(track)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}<style>{CSS}</style></head>
<body>
<h1>Leaderboard: {html.escape(track)}</h1>
<p class="meta">{ranked} ranked of {len(table)} teams, by validation loss ({rule} each team's official ok runs of its
latest submission). Generated {html.escape(generated_at)} from the run records{"; produced on " + html.escape(machine) if machine else ""}.</p>
<p class="key"><span class="badge ahead">ahead</span> significantly better than the next team (p &lt; 0.05).
<span class="badge tied">tied</span> not significantly different: the order between them is not evidence.
<span class="badge undetermined">undetermined</span> one run on a side: nothing can be tested. Interval: the 95% t
interval of the mean; from 2 runs their range (min–max); never below the loss floor (cut at floor).
{NOT_MEASURED}: not measured (MFU without a known peak, as on a CPU; the communication probe in the open division).
Click a team for every figure.</p>
{empty_html(empty)}
<div class="board"><table id="leaderboard"><thead><tr>{head}</tr></thead><tbody>
{body}
</tbody></table></div>
<div class="charts">{"".join(columns)}</div>
</body></html>
"""
