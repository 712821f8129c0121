"""`harness compare`'s overlay chart: every run's loss curve, each side in its team's colour."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from harness.results.compare import Side


def overlay_chart(sides: list[Side], path: Path) -> Path:
    from harness.results.charts.kit import save_png

    return save_png(overlay_figure(sides, side_colors(sides)), path)


def side_colors(sides: list[Side]) -> Callable[[str], str]:
    """The leaderboard's colours of the sides' track (colors.track_colors), read from the records beside the
    sides' runs (runs/<track>/<team>/<run_id>): a team is drawn in the colour it has in the track's charts."""
    from harness.results.charts.colors import TeamColors, track_colors

    run = next((r for s in sides for r in s.runs if r.get("run_dir") and r.get("track_name")), None)
    if run is None:
        return TeamColors([])
    return track_colors(Path(run["run_dir"]).parents[2], run["track_name"])


def overlay_figure(sides: list[Side], colors: Callable[[str], str]):
    """Every run's loss curve, each side in its team's colour (the same as on the leaderboard's charts); a
    second side of the same team is dashed. As on the leaderboard's loss charts, the run nearest the side's mean
    is bold, and the side's mean val_loss with the leaderboard's interval (stats.loss_interval: never below the
    loss floor) is marked right of the curves."""
    from matplotlib.legend_handler import HandlerTuple

    from harness.results.charts.loss_charts import (curve_end, figure_label, fit_loss_axis, key_handles, mark_positions,
                                             mark_ranked, nearest_curves, note_handles, plot_runs)
    from harness.results.charts.kit import legend_outside, subplots
    from harness.results.leaderboard import floor_of
    from harness.results.stats import is_finite, loss_interval, summarize

    fig, ax = subplots(figsize=(12, 6.5))
    drawn, seen = [], []
    for side in sides:
        team = str(side.runs[0].get("team", side.label))
        style = "--" if team in seen else "-"
        seen.append(team)
        values = side.values("val_loss")
        summary = summarize(values) if values else None
        runs = nearest_curves(side.runs, summary.mean if summary else 0.0)
        if runs:
            drawn.append((side, colors(team), style, runs, summary))
    ends = [curve_end(run, frame, "train_time_s") for *_, runs, _ in drawn for run, frame in runs]
    marks = mark_positions(max(ends, default=1.0), 0.0, len(drawn))
    ys, handles, labels, floors = [], [], [], []
    for (side, color, style, runs, summary), x_mark in zip(drawn, marks):
        side_ys, handle = plot_runs(ax, color, runs, "train_time_s", linestyle=style)
        ys += side_ys
        floors += [r["loss_floor"] for r in side.runs if is_finite(r.get("loss_floor"))]
        handles.append(handle)
        if summary is None:
            labels.append(f"{side.label} (n={len(side.runs)}, no val_loss)")
            continue
        interval = loss_interval(side.values("val_loss"), floor_of(side.runs))
        ys += mark_ranked(ax, color, x_mark, summary.mean, interval)
        labels.append(figure_label(side.label, summary.mean, interval, summary.n, "mean"))
    top = max((float(frame["train_loss"].max()) for *_, runs, _ in drawn for _, frame in runs), default=None)
    best = min((float(r["val_loss"]) for s in sides for r in s.runs if is_finite(r.get("val_loss"))), default=None)
    note_h, note_l = note_handles(fit_loss_axis(ax, ys, top, min(floors) if floors else None, best))
    ax.set(title="Loss curves: " + " vs ".join(s.label for s in sides), xlabel="training time (s)",
           ylabel="loss (nats per token)")
    key_h, key_l = key_handles("mean", whose="each side's figure")
    legend_outside(ax, key_h + handles + note_h, key_l + labels + note_l,
                   handler_map={tuple: HandlerTuple(ndivide=None, pad=0.8)}, handlelength=3.0)
    return fig
