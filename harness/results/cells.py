"""How a leaderboard cell reads, one way in the Markdown, on the page and on the charts (the CSV keeps the raw
figures): the formats, the interval, whom a tie is with, and what a ranked team's missing measurement is called."""

from __future__ import annotations

import math

import pandas as pd

from harness.results.stats import interval_text

# A probe ratio above 1 is timing noise around "no exposed communication": shown as such, kept raw in the CSV.
NOISE_ABOVE_ONE = "≈100%"
# A ranked team's measurement the record does not hold: MFU without a known peak (a CPU), the communication probe
# of an open-division run (its own train.py runs none). Said so, the same way, in every table and chart.
NOT_MEASURED = "n/a"
MEASURED = ("tokens_per_s", "mfu", "comm_overlap_efficiency")


def missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def fmt(col: str, value) -> str:
    """One cell as people read it (the CSV keeps the raw value)."""
    if missing(value):
        return ""
    if col in ("val_loss", "val_loss_std", "interval_low", "interval_high"):
        return f"{value:.4f}"
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


def cell(col: str, row) -> str:
    """A shown cell of a team's row (a table row): the Markdown's, the page's and the charts' labels. `interval` and
    `vs_next` are read from several columns; a ranked team's missing measurement is NOT_MEASURED, never blank."""
    if col == "interval":
        low, high, kind = row["interval_low"], row["interval_high"], row["interval_kind"]
        return "" if missing(low) or missing(high) else interval_text(float(low), float(high), str(kind))
    if col == "vs_next":
        verdict, tied = row["vs_next"], row["tied_with"]
        if verdict == "tied" and isinstance(tied, str) and tied:
            return f"tied with {tied}"
        return fmt(col, verdict)
    value = row[col]
    if missing(value) and col in MEASURED and row["status"] == "ok":
        return NOT_MEASURED
    return fmt(col, value)
