"""Loss charts: train-loss curves with the final validation loss, and the validation loss per team.

The y range is the range the teams are actually in: the first steps (loss near ln(vocab)) and
the loss floor would squash every curve into a sliver, so they are stated as labels instead.
Curves: a team's counted runs, at most MAX_CURVES per team (the best ones), so a track with
thousands of runs stays readable.
"""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
from matplotlib.legend_handler import HandlerTuple
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter

from harness.results.plots import NOT_FINISHED, legend_outside, subplots, team_color
from harness.results.stats import finite_first, is_finite
from harness.submission.files import read_regular

MAX_CURVES = 5
METRICS_MAX_BYTES = 64 << 20  # a metrics.csv is a row per log interval: kilobytes
CURVE_TEAMS = 12  # teams with curves on a loss chart: more cannot be told apart (the table has every team)
ROW_TEAMS = 30  # rows of the val_loss chart: the ranked teams first, then the ones that did not finish
SKIP_START = 0.1  # the first tenth of each curve (the fall from ln(vocab)) does not set the y range
X_LABELS = {"train_time_s": "training time (s)", "tokens": "tokens seen"}


def read_curve(run: dict) -> pd.DataFrame | None:
    try:
        data = read_regular(Path(run["run_dir"]) / "metrics.csv", METRICS_MAX_BYTES)  # never a FIFO, a link
        return pd.read_csv(io.BytesIO(data)).dropna(subset=["train_loss"])
    except (OSError, ValueError, KeyError):
        return None


def best_curves(runs: list[dict]) -> list[tuple[dict, pd.DataFrame]]:
    out = []
    for run in sorted(runs, key=lambda r: finite_first(r.get("val_loss")))[:MAX_CURVES]:
        frame = read_curve(run)
        if frame is not None and len(frame):
            out.append((run, frame))
    return out


def plot_runs(ax, color: str, runs: list[tuple[dict, pd.DataFrame]], x_col: str,
              linestyle: str = "-") -> tuple[list[float], tuple | None]:
    """One team's curves and val stars; returns the y values that should set the range and its legend handle."""
    ys: list[float] = []
    handle = None
    for i, (run, frame) in enumerate(runs):
        x, y = frame[x_col], frame["train_loss"]
        ax.plot(x, y, color=color, alpha=0.9 if i == 0 else 0.35, linewidth=2.4 if i == 0 else 1.4,
                linestyle=linestyle)
        start = x.iloc[0] + SKIP_START * (x.iloc[-1] - x.iloc[0])
        ys += [float(v) for v in y[x >= start] if is_finite(float(v))]
        if is_finite(run.get("val_loss")):
            x_end = run.get(x_col) if run.get(x_col) is not None else x.iloc[-1]
            ax.scatter([x_end], [run["val_loss"]], color=color, marker="*", s=300, zorder=4, edgecolor="black",
                       linewidth=0.8)
            ys.append(float(run["val_loss"]))
        if i == 0:
            handle = (Line2D([], [], color=color, linewidth=2.4, linestyle=linestyle),
                      Line2D([], [], color=color, marker="*", markersize=15, markeredgecolor="black", linestyle=""))
    return ys, handle


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


def loss_figure(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], x_col: str):
    fig, ax = subplots(figsize=(8.5, 5.4))
    all_ranked = list(table[table["status"] == "ok"]["team"])
    ranked = all_ranked[:CURVE_TEAMS]
    ys, handles, labels, all_top = [], [], [], None
    for team in ranked:
        runs = best_curves(counted.get(team, []))
        team_ys, handle = plot_runs(ax, team_color(team), runs, x_col)
        ys += team_ys
        for _, frame in runs:
            all_top = max(all_top or float("-inf"), float(frame["train_loss"].max()))
        if handle:
            handles.append(handle)
            labels.append(team)
    floors = [r["loss_floor"] for runs in counted.values() for r in runs if is_finite(r.get("loss_floor"))]
    best = min((float(v) for v in table[table["status"] == "ok"]["val_loss"] if is_finite(v)), default=None)
    notes = fit_loss_axis(ax, ys, all_top, min(floors) if floors else None, best)
    what = X_LABELS[x_col]
    shown = f" (top {len(ranked)} of {len(all_ranked)} teams)" if len(all_ranked) > len(ranked) else ""
    ax.set(title=f"Loss against {what.split(' (')[0]}: track {track}{shown}", xlabel=what,
           ylabel="loss (nats per token)")
    if x_col == "tokens":
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    if not ranked:
        ax.text(0.5, 0.5, "no finished runs yet", transform=ax.transAxes, ha="center", fontsize=16)
    extra_h, extra_l = not_finished_handles(table)
    note_h, note_l = note_handles(notes)
    if handles or extra_h:
        key = [(Line2D([], [], color="black", linewidth=2.4),
                Line2D([], [], color="black", marker="*", markersize=15, linestyle=""))]
        legend_outside(ax, key + handles + extra_h + note_h, ["train loss, ★ val loss"] + labels + extra_l + note_l,
                       handler_map={tuple: HandlerTuple(ndivide=None, pad=0.8)}, handlelength=3.0)
    return fig


def val_loss_figure(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], ranking: str = "mean"):
    """One row per team: mean with its 95% interval and n (or the best of n runs); teams that did not
    finish greyed, with their status. No interval is drawn from a single run: there is none."""
    rows = list(table.iterrows())
    total = len(rows)
    rows = rows[:ROW_TEAMS]
    fig, ax = subplots(figsize=(8.5, max(3.2, 0.7 * len(rows) + 1.8)))
    ys = list(range(len(rows)))[::-1]
    xs: list[float] = []
    for y, (_, row) in zip(ys, rows):
        if row["status"] != "ok" or not is_finite(row["val_loss"]):
            continue
        ci = row["ci95"] if is_finite(row["ci95"]) else None
        color = team_color(row["team"])
        ax.errorbar([row["val_loss"]], [y], xerr=[[ci], [ci]] if ci else None, fmt="o", color=color,
                    ecolor=color, elinewidth=3, capsize=8, markersize=11, markeredgecolor="black")
        xs += [row["val_loss"] - (ci or 0), row["val_loss"] + (ci or 0)]
    span = max(max(xs) - min(xs), 0.02) if xs else 1.0
    left, right = (min(xs) - 0.15 * span, max(xs) + 1.2 * span) if xs else (0.0, 1.0)
    for y, (_, row) in zip(ys, rows):
        if row["status"] == "ok" and is_finite(row["val_loss"]):
            ci = row["ci95"] if is_finite(row["ci95"]) else None
            n = int(row["n_runs"])
            if ranking == "best":
                text = f"{row['val_loss']:.4f}   best of n={n}"
            else:
                text = f"{row['val_loss']:.4f}" + (f" ± {ci:.4f}" if ci else "") + f"   n={n}" + ("" if ci else ": no interval")
            ax.annotate(text, (row["val_loss"] + (ci or 0), y), xytext=(12, -5), textcoords="offset points",
                        fontsize=14)
        else:
            reason = str(row["reason"] or "")
            reason = reason.splitlines()[0][:45] + ("…" if len(reason) > 45 else "") if reason else ""
            ax.annotate(f"did not finish: {row['status']}" + (f" ({reason})" if reason else ""), (left, y),
                        xytext=(8, -5), textcoords="offset points", fontsize=13, color=NOT_FINISHED)
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
    floors = [r["loss_floor"] for runs in counted.values() for r in runs if is_finite(r.get("loss_floor"))]
    if floors and xs:
        floor = min(floors)
        if floor >= left:
            ax.axvline(floor, color="black", linestyle="--", linewidth=1.3)
        ax.set_xlabel(f"validation loss (nats per token); loss floor {floor:.3f}"
                      + ("" if floor >= left else ", left of this axis"))
    else:
        ax.set_xlabel("validation loss (nats per token)")
    ax.grid(axis="y", visible=False)
    what = "best run of each team" if ranking == "best" else "mean ± 95% interval"
    shown = f", top {len(rows)} of {total} teams" if total > len(rows) else ""
    ax.set_title(f"Validation loss ({what}{shown}): track {track}")
    return fig
