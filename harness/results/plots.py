"""Charts of a track, drawn from run records (matplotlib, PNG), into plots/<track>/.

loss_vs_time.png    train loss curves and final val loss against training time, every team
loss_vs_tokens.png  train loss against tokens seen
val_loss.png        final validation loss per team with its 95% interval and n; non-finishers listed
throughput.png      tokens/s, MFU and the communication probe (comm overlap) per team
scaling.png         weak-scaling efficiency from `harness scale`: measured points and the model's prediction

Shared here: the style (type large enough for a projector), one colour per team wherever it
appears (`team_color`, a function of the name alone), atomic PNG writes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from harness.results.records import atomic_path

# Figures are made without pyplot (no global figure manager, no backend to choose: files only), which
# also spares every `harness run` that refreshes a leaderboard the import of pyplot.
matplotlib.rcParams.update({"font.size": 15, "axes.titlesize": 17, "axes.labelsize": 15, "legend.fontsize": 13,
                     "xtick.labelsize": 13, "ytick.labelsize": 13, "axes.grid": True, "grid.alpha": 0.3,
                     "figure.dpi": 100, "savefig.bbox": "tight", "axes.spines.top": False,
                     "axes.spines.right": False})

# Saturated colours that stay distinct on a projector; grey is kept for teams that did not finish.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
           "#000075", "#469990", "#800000", "#f032e6", "#808000"]
NOT_FINISHED = "#9a9a9a"


def team_color(team: str) -> str:
    """The team's colour in every chart (track charts, compare, scale): a hash of its name, so it never
    depends on which other teams a chart shows or in which order."""
    digest = hashlib.sha256(team.encode()).digest()
    return PALETTE[int.from_bytes(digest[:8], "big") % len(PALETTE)]


def subplots(nrows: int = 1, ncols: int = 1, *, figsize, **kw):
    """A new figure and its axes, as pyplot.subplots gives them."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, **kw)


def save_png(fig, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as (fd, tmp):
        os.close(fd)
        fig.savefig(tmp, format="png")
    return path


def log2_axis(ax, values) -> None:
    """A log2 world-size axis labelled with plain numbers (1, 2, 4, ... 256)."""
    ax.set_xscale("log", base=2)
    top = max([1, *values])
    ticks = [2**k for k in range(0, max(1, int(top).bit_length()))]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def legend_outside(ax, handles=None, labels=None, ncol: int = 2, **kw):
    """A legend under the axes (below the x label): it never covers the end of a curve or a final point, and
    the chart keeps the width of a page column."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), borderaxespad=0.0,
                         frameon=False, ncol=ncol, columnspacing=1.6, **kw)
    return None


def message_figure(title: str, lines: list[str], command: str = "", size=(8.5, 4.6)):
    """A chart with nothing measured yet: a title, what to run (in monospace) and why, no empty axes."""
    fig, ax = subplots(figsize=size)
    ax.axis("off")
    ax.text(0.0, 0.97, title, fontsize=18, fontweight="bold", va="top", transform=ax.transAxes)
    y = 0.78
    if command:
        ax.text(0.0, y, command, fontsize=14, family="monospace", va="top", transform=ax.transAxes,
                bbox={"facecolor": "#f3f3f3", "edgecolor": "#ccc", "boxstyle": "round,pad=0.4"})
        y -= 0.2
    ax.text(0.0, y, "\n".join(lines), fontsize=16, va="top", linespacing=1.5, transform=ax.transAxes)
    return fig


def draw_track(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], scale_records: list[dict],
               out_dir: Path, ranking: str = "mean", track_option: str | None = None) -> list[Path]:
    """Draw every chart; `counted` maps each ranked team to its ok runs (rows from leaderboard.load_rows);
    `track_option`: the `--track` value of a command a chart suggests (views.command_track)."""
    from harness.results.loss_charts import loss_figure, val_loss_figure
    from harness.results.rate_charts import scaling_figure, throughput_figure

    paths = []
    for x_col in ("train_time_s", "tokens"):
        fig = loss_figure(track, table, counted, x_col)
        paths.append(save_png(fig, out_dir / ("loss_vs_time.png" if x_col == "train_time_s" else "loss_vs_tokens.png")))
    paths.append(save_png(val_loss_figure(track, table, counted, ranking), out_dir / "val_loss.png"))
    paths.append(save_png(throughput_figure(track, table), out_dir / "throughput.png"))
    paths.append(save_png(scaling_figure(track, scale_records, track_option=track_option), out_dir / "scaling.png"))
    return paths

