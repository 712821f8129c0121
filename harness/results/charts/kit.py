"""What every chart shares: the style (type large enough for a projector), figures made without pyplot, the
legend under the axes, axes of counts and of world sizes, a chart that says why it is empty, atomic PNG writes,
and how many teams a chart lists. Imported by every chart module; imports none of them."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from harness.results.records import atomic_path

ROW_TEAMS = 30  # rows of a per-team chart: the ranked teams first, then the ones that did not finish

# Figures are made without pyplot (no global figure manager, no backend to choose: files only), which
# also spares every `harness run` that refreshes a leaderboard the import of pyplot.
matplotlib.rcParams.update({"font.size": 15, "axes.titlesize": 17, "axes.labelsize": 15, "legend.fontsize": 13,
                     "xtick.labelsize": 13, "ytick.labelsize": 13, "axes.grid": True, "grid.alpha": 0.3,
                     "figure.dpi": 100, "savefig.bbox": "tight", "axes.spines.top": False,
                     "axes.spines.right": False,
                     # Team names and reasons are team-written text: `$...$` must never be read as math (an
                     # unknown command in it once made every chart, and with them the board, fail to build).
                     "text.parse_math": False, "text.usetex": False})

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
