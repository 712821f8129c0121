"""Loss charts: train-loss curves with the final validation loss, and the validation loss per team.

The y range is the range the teams are actually in: the first steps (loss near ln(vocab)) and
the loss floor would squash every curve into a sliver, so they are stated as labels instead.
Curves: a team's counted runs, at most MAX_CURVES per team, the run nearest the team's ranked figure
drawn bold (under `mean` a typical run, not the luckiest one), so a track with thousands of runs stays
readable. Beside the curves, each team's ranked figure itself (mean with its interval, or its best
run) is marked, and the legend says whether the ranking found it tied with its neighbour. The interval is the
table's (stats.loss_interval: the runs' range from 2 runs, never below the loss floor), written as the table
writes it.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Callable

import pandas as pd
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D

from harness.results.charts.colors import NOT_FINISHED
from harness.results.charts.empty import EmptyState
from harness.results.charts.kit import ROW_TEAMS, count_axis, legend_outside, subplots
from harness.results.stats import Interval, is_finite
from harness.results.cells import cell
from harness.submission.files import read_regular

MAX_CURVES = 5
METRICS_MAX_BYTES = 64 << 20  # a metrics.csv is a row per log interval: kilobytes
CURVE_TEAMS = 12  # teams with curves on a loss chart: more cannot be told apart (the table has every team)
SKIP_START = 0.1  # the first tenth of each curve (the fall from ln(vocab)) does not set the y range
X_LABELS = {"train_time_s": "training time (s)", "tokens": "tokens seen"}
CURVES_KEPT = 2 * CURVE_TEAMS * MAX_CURVES  # parsed curves kept for the next chart (a board and its -all)
_CURVES: dict[tuple, pd.DataFrame] = {}
BOLD, THIN = 2.4, 1.4  # line widths: the run nearest the ranked figure, the others


def read_curve(run: dict) -> pd.DataFrame | None:
    """A run's metrics.csv with a train loss on each row; None where it cannot be read. Both loss charts read the
    same curves: a file is parsed once while it is unchanged (the same inode, size and change time)."""
    try:
        path = Path(run["run_dir"]) / "metrics.csv"
        st = os.lstat(path)
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        if key not in _CURVES:
            data = read_regular(path, METRICS_MAX_BYTES)  # never a FIFO, a link
            if len(_CURVES) >= CURVES_KEPT:
                _CURVES.pop(next(iter(_CURVES)))
            _CURVES[key] = pd.read_csv(io.BytesIO(data)).dropna(subset=["train_loss"])
        return _CURVES[key]
    except (OSError, ValueError, KeyError):
        return None


def nearest_curves(runs: list[dict], figure: float) -> list[tuple[dict, pd.DataFrame]]:
    """Up to MAX_CURVES runs with their curves, the one whose val_loss is nearest the team's ranked figure first
    (plot_runs draws it bold): under `mean` a typical run rather than the luckiest, under `best` the best run."""
    def distance(run: dict) -> tuple[bool, float, str]:
        v = run.get("val_loss")
        return (not is_finite(v), abs(float(v) - figure) if is_finite(v) else 0.0, str(run.get("run_id", "")))

    out = []
    for run in sorted(runs, key=distance)[:MAX_CURVES]:
        frame = read_curve(run)
        if frame is not None and len(frame):
            out.append((run, frame))
    return out


def plot_runs(ax, color: str, runs: list[tuple[dict, pd.DataFrame]], x_col: str,
              linestyle: str = "-") -> tuple[list[float], tuple | None]:
    """One team's curves (the first bold) and val stars; returns the y values that should set the range and its
    legend handle (bold line, star, ranked-figure diamond)."""
    ys: list[float] = []
    handle = None
    stars: tuple[list[float], list[float]] = ([], [])
    for i, (run, frame) in enumerate(runs):
        x, y = frame[x_col], frame["train_loss"]
        ax.plot(x, y, color=color, alpha=0.9 if i == 0 else 0.35, linewidth=BOLD if i == 0 else THIN,
                linestyle=linestyle)
        start = x.iloc[0] + SKIP_START * (x.iloc[-1] - x.iloc[0])
        ys += [float(v) for v in y[x >= start] if is_finite(float(v))]
        if is_finite(run.get("val_loss")):
            stars[0].append(curve_end(run, frame, x_col))
            stars[1].append(float(run["val_loss"]))
            ys.append(float(run["val_loss"]))
        if i == 0:
            handle = (Line2D([], [], color=color, linewidth=BOLD, linestyle=linestyle),
                      Line2D([], [], color=color, marker="*", markersize=15, markeredgecolor="black", linestyle=""),
                      Line2D([], [], color=color, marker="D", markersize=9, markeredgecolor="black", linestyle=""))
    if stars[0]:  # one collection for the team's stars: a collection per run was a tenth of a board's drawing
        ax.scatter(*stars, color=color, marker="*", s=300, zorder=4, edgecolor="black", linewidth=0.8)
    return ys, handle


def curve_end(run: dict, frame: pd.DataFrame, x_col: str) -> float:
    """Where a run's val star sits: its recorded total (training time, tokens), else its last logged point."""
    return float(run[x_col]) if is_finite(run.get(x_col)) else float(frame[x_col].iloc[-1])


def row_interval(row) -> Interval | None:
    """A table row's interval (leaderboard: interval_low, interval_high, interval_kind), None where it has none."""
    low, high = row["interval_low"], row["interval_high"]
    if not (is_finite(low) and is_finite(high)):
        return None
    return Interval(float(low), float(high), str(row["interval_kind"]))


def error_bar(value: float, interval: Interval | None):
    """matplotlib's xerr / yerr of an interval that need not be symmetric (a range, an interval cut at the floor)."""
    if interval is None:
        return None
    return [[max(value - interval.low, 0.0)], [max(interval.high - value, 0.0)]]


def mark_ranked(ax, color: str, x: float, value: float, interval: Interval | None) -> list[float]:
    """The team's ranked figure beside its curves: a diamond at the mean (or the best run) with its interval as
    a bar, the figure the table ranks by rather than any one run. Returns the y values it covers."""
    ax.errorbar([x], [value], yerr=error_bar(value, interval), fmt="D", color=color, ecolor=color, elinewidth=3,
                capsize=7, markersize=11, markeredgecolor="black", zorder=5)
    return [value] + ([interval.low, interval.high] if interval else [])


def mark_positions(right: float, left: float, count: int) -> list[float]:
    """x of each team's ranked-figure mark: a strip just right of every curve's end, one slot a team in rank
    order, so that two tied teams' marks stand side by side instead of on top of each other."""
    span = max(right - left, 1e-9)
    return [right + span * (0.03 + 0.1 * i / max(count, 4)) for i in range(count)]


def figure_label(name: str, value: float, interval: Interval | None, n: int, ranking: str,
                 tied_with: str = "") -> str:
    """'#1 alpha: 2.0050, 1.9415–2.0685, n=3', '2.0050, 2.0000–2.0100 (min–max), n=2' or 'best 1.9000 of n=4', and
    ', tied with #2' where the ranking said so."""
    if ranking == "best":
        figure = f"best {value:.4f} of n={n}"
    else:
        figure = f"{value:.4f}, {interval.text()}, n={n}" if interval else f"{value:.4f}, n={n}: no interval"
    return f"{name}: {figure}" + (f", tied with {tied_with}" if tied_with else "")


def key_handles(ranking: str, whose: str = "the ranking's figure") -> tuple[list, list[str]]:
    """The legend's first entries, in black: what the bold line, a star and a diamond (`whose` figure) are."""
    bold = "the best run" if ranking == "best" else "the run nearest the mean"
    figure = "the best run's val loss" if ranking == "best" else "mean val loss and its interval"
    handles = [(Line2D([], [], color="black", linewidth=BOLD), Line2D([], [], color="black", alpha=0.35,
                                                                        linewidth=THIN)),
               Line2D([], [], color="black", marker="*", markersize=15, linestyle=""),
               Line2D([], [], color="black", marker="D", markersize=9, linestyle="")]
    return handles, [f"train loss: bold {bold}, thin other runs", "a run's val loss",
                     f"{whose}: {figure}"]


def fit_loss_axis(ax, ys: list[float], all_top: float | None, floor: float | None, best: float | None) -> list[str]:
    """Set the y range the curves are in. Returns notes for what it leaves out (the first steps above it, a loss
    floor below it): they go in the legend, where they cover nothing."""
    if not ys:
        return []
    lo, hi = min(ys), max(ys)
    pad = max(0.08 * (hi - lo), 0.01)
    bottom, top = lo - pad, hi + pad
    notes = []
    if floor is not None and floor >= bottom - 2 * pad:  # close enough to show without squashing
        bottom = min(bottom, floor - pad)
        ax.axhline(floor, color="black", linestyle="--", linewidth=1.3)
        ax.annotate(f"loss floor {floor:.3f}", (0.01, floor), xycoords=("axes fraction", "data"),
                    xytext=(0, 4), textcoords="offset points", fontsize=13)
    elif floor is not None:
        notes.append(f"↓ loss floor {floor:.3f}, below the axis" + (f"\n   (best {best - floor:+.3f} above it)"
                                                                    if best is not None else ""))
    ax.set_ylim(bottom, top)
    if all_top is not None and all_top > top:
        notes.append(f"↑ first steps, above the axis\n   (loss up to {all_top:.2f})")
    return notes


def note_handles(notes: list[str]) -> tuple[list, list[str]]:
    return [Line2D([], [], linestyle="", marker="") for _ in notes], notes


def not_finished_handles(table: pd.DataFrame) -> tuple[list, list[str]]:
    rows = table[table["status"] != "ok"]
    handles = [Line2D([], [], color=NOT_FINISHED, marker="x", linestyle="", markersize=10) for _ in range(len(rows))]
    return handles, [f"{r['team']}: {r['status']}" for _, r in rows.iterrows()]


def loss_figure(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], x_col: str, *,
                colors: Callable[[str], str], ranking: str = "mean", empty: EmptyState | None = None):
    what = X_LABELS[x_col]
    title = f"Loss against {what.split(' (')[0]}: track {track}"
    ranked_rows = table[table["status"] == "ok"]
    if ranked_rows.empty:  # why, and what to type, rather than empty axes
        return (empty or EmptyState("No finished runs yet", "", "")).figure(title)
    shown_rows = ranked_rows.head(CURVE_TEAMS)
    fig, ax = subplots(figsize=(8.5, 5.4))
    teams = []  # (row, colour, curves): curves first, so that the marks can stand right of every curve
    for _, row in shown_rows.iterrows():
        curves = nearest_curves(counted.get(row["team"], []), float(row["val_loss"]))
        if curves:
            teams.append((row, colors(row["team"]), curves))
    ends = [curve_end(run, frame, x_col) for _, _, curves in teams for run, frame in curves]
    starts = [float(frame[x_col].iloc[0]) for _, _, curves in teams for _, frame in curves]
    marks = mark_positions(max(ends, default=1.0), min(starts + [0.0]), len(teams))
    ys, handles, labels = [], [], []
    for (row, color, curves), x_mark in zip(teams, marks):
        team_ys, handle = plot_runs(ax, color, curves, x_col)
        interval = row_interval(row)
        ys += team_ys + mark_ranked(ax, color, x_mark, float(row["val_loss"]), interval)
        tied = row["tied_with"] if isinstance(row["tied_with"], str) else ""
        handles.append(handle)
        labels.append(figure_label(f"#{int(row['rank'])} {row['team']}", float(row["val_loss"]), interval,
                                   int(row["n_runs"]), ranking, tied))
    floors = [r["loss_floor"] for runs in counted.values() for r in runs if is_finite(r.get("loss_floor"))]
    best = min((float(v) for v in ranked_rows["val_loss"] if is_finite(v)), default=None)
    all_top = max((float(frame["train_loss"].max()) for _, _, curves in teams for _, frame in curves), default=None)
    notes = fit_loss_axis(ax, ys, all_top, min(floors) if floors else None, best)
    shown = f" (top {len(shown_rows)} of {len(ranked_rows)} teams)" if len(ranked_rows) > len(shown_rows) else ""
    ax.set(title=title + shown, xlabel=what, ylabel="loss (nats per token)")
    if x_col == "tokens":
        count_axis(ax.xaxis, max(ends, default=0.0), what)
    key_h, key_l = key_handles(ranking)
    extra_h, extra_l = not_finished_handles(table)
    note_h, note_l = note_handles(notes)
    legend_outside(ax, key_h + handles + extra_h + note_h, key_l + labels + extra_l + note_l,
                   ncol=1 if len(handles) <= 5 else 2, handler_map={tuple: HandlerTuple(ndivide=None, pad=0.8)},
                   handlelength=3.0)
    return fig


def val_loss_figure(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], ranking: str = "mean", *,
                    colors: Callable[[str], str], empty: EmptyState | None = None):
    """One row per team: the mean with its interval (the table's), or the best of n runs; teams that did not finish
    greyed, with their status. The figures are written right of the axes, so that the axis spans the data (and the
    loss floor when it is near), not room for text. No interval is drawn from a single run: there is none."""
    what = "best run of each team" if ranking == "best" else "mean and interval"
    if table.empty:  # every run unofficial, say: why, and what to type
        return (empty or EmptyState("No runs yet", "", "")).figure(f"Validation loss ({what}): track {track}")
    rows = list(table.iterrows())
    total = len(rows)
    rows = rows[:ROW_TEAMS]
    fig, ax = subplots(figsize=(8.5, max(2.6, 0.7 * len(rows) + 1.4)))
    fig.subplots_adjust(right=0.66)  # the figures' column, right of the axes
    ys = list(range(len(rows)))[::-1]
    xs: list[float] = []
    for y, (_, row) in zip(ys, rows):
        if row["status"] != "ok" or not is_finite(row["val_loss"]):
            reason = str(row["reason"] or "")
            reason = reason.splitlines()[0][:REASON_CHARS] + ("…" if len(reason) > REASON_CHARS else "") if reason else ""
            ax.annotate(f"did not finish: {row['status']}" + (f"\n{reason}" if reason else ""), (1.0, y),
                        xycoords=("axes fraction", "data"), xytext=(12, 0), textcoords="offset points", va="center",
                        fontsize=13, linespacing=1.2, color=NOT_FINISHED, annotation_clip=False)
            continue
        value, interval = float(row["val_loss"]), (None if ranking == "best" else row_interval(row))
        color = colors(row["team"])
        ax.errorbar([value], [y], xerr=error_bar(value, interval), fmt="o", color=color, ecolor=color, elinewidth=3,
                    capsize=8, markersize=11, markeredgecolor="black")
        xs += [value] + ([interval.low, interval.high] if interval else [])
        n = int(row["n_runs"])
        text = (f"{value:.4f}   best of n={n}" if ranking == "best" else
                f"{value:.4f}   n={n}" + (f"\n{cell('interval', row)}" if interval else ": no interval"))
        ax.annotate(text, (1.0, y), xycoords=("axes fraction", "data"), xytext=(12, 0), textcoords="offset points",
                    va="center", fontsize=13, linespacing=1.2, annotation_clip=False)
    floors = [r["loss_floor"] for runs in counted.values() for r in runs if is_finite(r.get("loss_floor"))]
    floor = min(floors) if floors and xs else None
    left, right, floor_shown = fit_value_axis(xs, floor)
    labels = []
    for _, row in rows:
        mark = " (tied)" if isinstance(row.get("tied_with"), str) and row["tied_with"] else ""
        labels.append(f"#{int(row['rank'])} {row['team']}{mark}" if row["status"] == "ok" else row["team"])
    ax.set_yticks(ys, labels)
    for tick, (_, row) in zip(ax.get_yticklabels(), rows):
        if row["status"] != "ok":
            tick.set_color(NOT_FINISHED)
    ax.set_ylim(-0.7, len(rows) - 0.3)
    ax.set_xlim(left, right)
    if floor is not None:
        if floor_shown:
            ax.axvline(floor, color="black", linestyle="--", linewidth=1.3)
        ax.set_xlabel(f"validation loss (nats per token); loss floor {floor:.3f}"
                      + ("" if floor_shown else ", left of this axis"))
    else:
        ax.set_xlabel("validation loss (nats per token)")
    ax.grid(axis="y", visible=False)
    shown = f", top {len(rows)} of {total} teams" if total > len(rows) else ""
    ax.set_title(f"Validation loss ({what}{shown}): track {track}")
    return fig


REASON_CHARS = 32  # of a reason, in the figures' column: its first line, cut to the column's width
FLOOR_REACH = 1.0  # the floor is drawn when it is at most this many data spans below the lowest figure
MARGIN = 0.08  # of the data's span, each side


def fit_value_axis(xs: list[float], floor: float | None) -> tuple[float, float, bool]:
    """(left, right, floor shown) of an axis of loss values: the data with a margin each side, and the loss floor
    when it is near enough to show without squashing the data (else the label says it is left of the axis)."""
    if not xs:
        return 0.0, 1.0, False
    lo, hi = min(xs), max(xs)
    span = max(hi - lo, 0.01 * max(abs(hi), 1.0))  # one team, or teams on one figure: a readable width
    shown = floor is not None and floor >= lo - FLOOR_REACH * span
    if shown:
        lo, hi = min(lo, floor), max(hi, floor)
        span = max(hi - lo, span)
    return lo - MARGIN * span, hi + MARGIN * span, shown
