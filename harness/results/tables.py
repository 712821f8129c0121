"""The leaderboard as text: the CSV and the Markdown table.

The CSV holds every column (leaderboard.COLUMNS) with the raw figures (counts as integers); the Markdown the
columns a reader of the standings needs (MARKDOWN_COLUMNS, the page's main table's and why a team is not
ranked), formatted. A cell reads the same in the Markdown, on the page and on the charts (cells.cell).
"""

from __future__ import annotations

import pandas as pd

from harness.results.cells import NOT_MEASURED, cell
from harness.results.charts.empty import EmptyState
from harness.results.leaderboard import COLUMNS

# The Markdown's columns: "interval" is interval_low to interval_high with its kind; "vs_next" says whom a tie is with.
MARKDOWN_COLUMNS = ["rank", "team", "division", "val_loss", "interval", "n_runs", "vs_next", "status", "tokens_per_s",
                    "mfu", "comm_overlap_efficiency", "reason"]


# A spreadsheet runs a cell that starts with one of these as a formula (`=HYPERLINK(...)` as a team name): text
# cells that do are written behind an apostrophe, which spreadsheets show as text and hide.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _inert(value):
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        try:
            float(value)  # "-0.5" is a number, not a formula
            return value
        except ValueError:
            return "'" + value
    return value


def to_csv(table: pd.DataFrame) -> str:
    out = table[COLUMNS].copy()
    for column in out.columns:
        if out[column].dtype == object or pd.api.types.is_string_dtype(out[column]):  # text and mixed columns only
            out[column] = out[column].map(_inert)
    return out.to_csv(index=False)


def to_markdown(table: pd.DataFrame, track: str, ranking: str, empty: EmptyState | None = None) -> str:
    """The table, after a note that says why nobody is ranked and what to type when that is so (`empty`)."""
    lines = [f"# Leaderboard: {track}", "",
             f"Ranked by validation loss ({ranking} over each team's official ok runs of its latest submission). "
             "`vs_next`: `ahead` (significantly better than the next team, p < 0.05), `tied` (not significantly "
             "different) or `undetermined` (one run on a side: nothing can be tested). `interval`: the 95% t "
             "interval of the mean; from 2 runs their range (min–max); never below the loss floor (cut at floor). "
             f"`{NOT_MEASURED}`: not measured (MFU without a known peak, as on a CPU; the communication probe in the "
             "open division). Every column is in the CSV.", ""]
    if empty is not None:
        lines += [empty.markdown(), ""]
    lines.append("| " + " | ".join(MARKDOWN_COLUMNS) + " |")
    lines.append("|" + "".join("---:|" if _numeric(c) else "---|" for c in MARKDOWN_COLUMNS))
    for _, row in table.iterrows():
        cells = [cell(c, row).replace("|", "\\|").replace("\n", "<br>") for c in MARKDOWN_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _numeric(col: str) -> bool:
    return col not in ("team", "division", "interval", "vs_next", "tied_with", "status", "precision", "run_id",
                       "submission_sha256", "reason", "interval_kind")
