"""The leaderboard as text: cell formatting shared by every view, the CSV and the Markdown table.

CSV and Markdown have the same columns in the same order (leaderboard.COLUMNS); the CSV holds
the raw figures (counts as integers), the Markdown the formatted ones.
"""

from __future__ import annotations

import math

import pandas as pd

from harness.results.charts.empty import EmptyState
from harness.results.leaderboard import COLUMNS

# A probe ratio above 1 is timing noise around "no exposed communication": shown as such, kept raw in the CSV.
NOISE_ABOVE_ONE = "≈100%"


def missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def fmt(col: str, value) -> str:
    """One cell as people read it (the CSV keeps the raw value)."""
    if missing(value):
        return ""
    if col in ("val_loss", "val_loss_std"):
        return f"{value:.4f}"
    if col == "ci95":
        return f"±{value:.4f}"
    if col == "mfu":
        return f"{100 * value:.1f}%"
    if col == "comm_overlap_efficiency":
        return NOISE_ABOVE_ONE if value > 1.0 else f"{100 * value:.1f}%"
    if col == "tokens_per_s":
        return f"{value:,.0f}"
    if col in ("train_time_s", "startup_s"):
        return f"{value:.1f}"
    if col == "p_vs_next":
        return "<0.001" if value < 0.001 else f"{value:.3f}"
    if col in ("params", "tokens", "steps", "n_runs", "rank"):
        return f"{int(value):,}"
    return str(value)


def to_csv(table: pd.DataFrame) -> str:
    return table[COLUMNS].to_csv(index=False)


def to_markdown(table: pd.DataFrame, track: str, ranking: str, empty: EmptyState | None = None) -> str:
    """The table, after a note that says why nobody is ranked and what to type when that is so (`empty`)."""
    lines = [f"# Leaderboard: {track}", "",
             f"Ranked by validation loss ({ranking} over each team's official ok runs of its latest submission). "
             "`vs_next`: `ahead` (significantly better than the next team, p < 0.05), `tied` (not significantly "
             "different) or `undetermined` (one run on a side: nothing can be tested).", ""]
    if empty is not None:
        lines += [empty.markdown(), ""]
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "".join("---:|" if _numeric(c) else "---|" for c in COLUMNS))
    for _, row in table.iterrows():
        cells = [fmt(c, row[c]).replace("|", "\\|").replace("\n", "<br>") for c in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _numeric(col: str) -> bool:
    return col not in ("team", "vs_next", "tied_with", "status", "precision", "run_id", "submission_sha256", "reason")
