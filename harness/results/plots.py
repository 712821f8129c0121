"""Charts of a track, drawn from run records (matplotlib, PNG), into plots/<track>/.

loss_vs_time.png    train loss curves and final val loss against training time, every team
loss_vs_tokens.png  train loss against tokens seen
val_loss.png        final validation loss per team with its 95% interval and n; non-finishers listed
throughput.png      tokens/s, MFU and the communication probe (comm overlap) per team
scaling.png         weak-scaling efficiency from `harness scale`: measured points and the model's prediction

Shared here: the style (type large enough for a projector), the legend under the axes, a chart that says
why it is empty, atomic PNG writes. A team's colour is colors.py's, the same in every chart and on the page.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from harness.results.colors import TeamColors
from harness.results.empty import EmptyState
from harness.results.records import atomic_path

# Figures are made without pyplot (no global figure manager, no backend to choose: files only), which
# also spares every `harness run` that refreshes a leaderboard the import of pyplot.
matplotlib.rcParams.update({"font.size": 15, "axes.titlesize": 17, "axes.labelsize": 15, "legend.fontsize": 13,
                     "xtick.labelsize": 13, "ytick.labelsize": 13, "axes.grid": True, "grid.alpha": 0.3,
                     "figure.dpi": 100, "savefig.bbox": "tight", "axes.spines.top": False,
                     "axes.spines.right": False})

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


# The unit a count axis is written in: the largest whose tick labels reach 10 or more.
COUNT_UNITS = ((1e9, "billions"), (1e6, "millions"), (1e3, "thousands"))


def count_axis(axis, largest: float, what: str) -> None:
    """A count axis (tokens, tokens per second) in plain numbers, its unit a word in the label: "tokens seen
    (millions)" over ticks 0, 50, 100. Engineering suffixes wrote 200 thousand tokens as "200k" and a fraction of
    one as "200m", which reads as milli; a word reads one way."""
    scale, word = next(((s, w) for s, w in COUNT_UNITS if largest >= 10 * s), (1.0, ""))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / scale:,.6g}"))
    axis.set_label_text(f"{what} ({word})" if word else what)


def legend_outside(ax, handles=None, labels=None, ncol: int = 2, **kw):
    """A legend under the axes (below the x label): it never covers the end of a curve or a final point, and
    the chart keeps the width of a page column."""
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        return ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.16), borderaxespad=0.0,
                         frameon=False, ncol=ncol, columnspacing=1.6, **kw)
    return None


def message_figure(title: str, lines: list[str], command: str = "", size=(8.5, 4.6), headline: str = ""):
    """A chart with nothing to draw: a title, what is missing (`headline`), what to run (in monospace) and why,
    no empty axes."""
    fig, ax = subplots(figsize=size)
    ax.axis("off")
    ax.text(0.0, 0.97, title, fontsize=18, fontweight="bold", va="top", transform=ax.transAxes)
    y = 0.8
    if headline:
        ax.text(0.0, y, headline, fontsize=17, color="#a64200", va="top", transform=ax.transAxes)
        y -= 0.16
    if command:
        ax.text(0.0, y, command, fontsize=14, family="monospace", va="top", transform=ax.transAxes,
                bbox={"facecolor": "#f3f3f3", "edgecolor": "#ccc", "boxstyle": "round,pad=0.4"})
        y -= 0.2
    ax.text(0.0, y, "\n".join(lines), fontsize=16, va="top", linespacing=1.5, transform=ax.transAxes)
    return fig


def draw_track(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], scale_records: list[dict],
               out_dir: Path, ranking: str = "mean", track_option: str | None = None, *, colors: TeamColors,
               empty: EmptyState | None = None) -> list[Path]:
    """Draw every chart; `counted` maps each ranked team to its ok runs (rows from leaderboard.load_rows), `colors`
    is the track's (colors.team_colors), `empty` says why nobody is ranked (empty.empty_state), `track_option` the
    `--track` value of a command a chart suggests (views.command_track)."""
    from harness.results.loss_charts import loss_figure, val_loss_figure
    from harness.results.rate_charts import scaling_figure, throughput_figure

    paths = []
    for x_col, name in (("train_time_s", "loss_vs_time.png"), ("tokens", "loss_vs_tokens.png")):
        fig = loss_figure(track, table, counted, x_col, colors=colors, ranking=ranking, empty=empty)
        paths.append(save_png(fig, out_dir / name))
    paths.append(save_png(val_loss_figure(track, table, counted, ranking, colors=colors, empty=empty),
                          out_dir / "val_loss.png"))
    paths.append(save_png(throughput_figure(track, table, colors=colors, empty=empty), out_dir / "throughput.png"))
    paths.append(save_png(scaling_figure(track, scale_records, colors=colors, track_option=track_option), out_dir / "scaling.png"))
    return paths
