"""`harness compare`'s overlay chart: every run's loss curve, each side in its team's colour."""

from __future__ import annotations

from pathlib import Path

from harness.results.compare import Side


def overlay_chart(sides: list[Side], path: Path) -> Path:
    from harness.results.plots import save_png

    return save_png(overlay_figure(sides), path)


def overlay_figure(sides: list[Side]):
    """Every run's loss curve, each side in its team's colour (the same as on the leaderboard's charts); a
    second side of the same team is dashed."""
    from harness.results.loss_charts import fit_loss_axis, note_handles, plot_runs, read_curve
    from harness.results.plots import legend_outside, subplots, team_color
    from harness.results.stats import is_finite

    fig, ax = subplots(figsize=(12, 6.5))
    ys, handles, labels, floors, seen, top = [], [], [], [], [], None
    for side in sides:
        team = str(side.runs[0].get("team", side.label))
        style = "--" if team in seen else "-"
        seen.append(team)
        runs = [(run, frame) for run in side.runs if (frame := read_curve(run)) is not None and len(frame)]
        side_ys, handle = plot_runs(ax, team_color(team), runs, "train_time_s", linestyle=style)
        ys += side_ys
        floors += [r["loss_floor"] for r in side.runs if is_finite(r.get("loss_floor"))]
        for _, frame in runs:
            top = max(top or float("-inf"), float(frame["train_loss"].max()))
        if handle:
            handles.append(handle)
            labels.append(f"{side.label} (n={len(side.runs)})")
    best = min((float(r["val_loss"]) for s in sides for r in s.runs if is_finite(r.get("val_loss"))), default=None)
    note_h, note_l = note_handles(fit_loss_axis(ax, ys, top, min(floors) if floors else None, best))
    ax.set(title="Loss curves: " + " vs ".join(s.label for s in sides), xlabel="training time (s)",
           ylabel="loss (nats per token)")
    from matplotlib.legend_handler import HandlerTuple

    legend_outside(ax, handles + note_h, labels + note_l, handler_map={tuple: HandlerTuple(ndivide=None, pad=0.8)},
                   handlelength=3.0)
    return fig
