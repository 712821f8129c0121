"""Rate charts: throughput per team, and weak scaling from `harness scale`.

Two different quantities, never on one axis:
- comm overlap efficiency (every run's probe, at the run's own world size): compute-only step time /
  synchronised step time, the share of a step not lost to communication the backward did not hide;
- weak-scaling efficiency (`harness scale`): tokens/s at N / (N x tokens/s at 1 device), measured at
  the sizes one machine can run, and the model's prediction beyond them, drawn differently.
"""

from __future__ import annotations

import shlex
from typing import Callable

import pandas as pd

from harness.results.cells import NOT_MEASURED, cell
from harness.results.charts.empty import EmptyState
from harness.results.charts.kit import ROW_TEAMS
from harness.results.charts.kit import count_axis, legend_outside, log2_axis, message_figure, subplots
from harness.results.scale_records import measured, newest_per_team, predicted
from harness.results.stats import is_finite


def _bars(ax, ys, values, colors, labels, title: str, xlabel: str, xmax: float | None = None) -> None:
    ax.barh(ys, [v if is_finite(v) else 0.0 for v in values], color=colors, height=0.6)
    top = xmax if xmax is not None else max([v for v in values if is_finite(v)] + [1e-9])
    for y, v, text in zip(ys, values, labels):
        ax.annotate(text, (min(v, top) if is_finite(v) else 0, y), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=14)
    ax.set_xlim(0, top * 1.3)
    ax.set(title=title, xlabel=xlabel)
    ax.grid(axis="y", visible=False)


def throughput_figure(track: str, table: pd.DataFrame, *, colors: Callable[[str], str],
                      empty: EmptyState | None = None):
    """Per ranked team: tokens/s (all devices), MFU, and the comm overlap efficiency its runs measured. A panel no
    team has a figure for (MFU on a CPU, where no peak is known) is not drawn, and the figure is as tall as the
    panels drawn; a team without a figure on a panel drawn is labelled as the tables label it (cells.cell)."""
    all_ranked = table[table["status"] == "ok"]
    ranked = all_ranked.head(ROW_TEAMS)  # the table has every team; a chart of 100 bars reads as none
    teams = list(ranked["team"])
    if not teams:  # why, and what to type
        return (empty or EmptyState("No finished runs yet", "", "")).figure(f"Throughput: track {track}")
    rows = [row for _, row in ranked.iterrows()]
    panels = [col for col in ("tokens_per_s", "mfu", "comm_overlap_efficiency")
              if col == "tokens_per_s" or any(is_finite(row[col]) for row in rows)]
    if len(teams) <= 12:  # stacked: the width of one page column
        panel_in = max(2.2, 0.55 * len(teams) + 1.3)
        fig, axes = subplots(len(panels), 1, figsize=(8.5, len(panels) * panel_in + 1.0), sharey=True, squeeze=False)
        fig.subplots_adjust(hspace=0.75)
    else:  # side by side: many teams would make the stack metres tall
        fig, axes = subplots(1, len(panels), figsize=(6 * len(panels), 0.4 * len(teams) + 2.5), sharey=True,
                             squeeze=False)
        fig.subplots_adjust(wspace=0.3)
    axes = list(axes.flat)
    ys = list(range(len(teams)))[::-1]
    bar_colors = [colors(t) for t in teams]
    for ax, col in zip(axes, panels):
        values = [row[col] if is_finite(row[col]) else float("nan") for row in rows]
        labels = [cell(col, row) for row in rows]
        if col == "tokens_per_s":
            _bars(ax, ys, values, bar_colors, labels,
                  f"Throughput: track {track}" + (f" (top {len(teams)} of {len(all_ranked)})"
                                                  if len(all_ranked) > len(teams) else ""),
                  "tokens per second (all devices)")
            count_axis(ax.xaxis, max([v for v in values if is_finite(v)], default=0.0) * 1.3,
                       "tokens per second, all devices")  # 1.3: _bars's right margin
        elif col == "mfu":
            _bars(ax, ys, [100 * v for v in values], bar_colors, labels, "Model FLOPs utilisation",
                  "MFU (% of peak dense bf16)")
        else:
            _bars(ax, ys, [100 * min(v, 1.0) for v in values], bar_colors, labels,
                  "Comm overlap (probe at the run's world size)",
                  "compute-only / synchronised step (%)\n100% = no exposed communication; not weak scaling", xmax=100.0)
            ax.set_xticks([0, 25, 50, 75, 100])
    axes[0].set_yticks(ys, [f"#{int(r)} {t}" for r, t in zip(ranked["rank"], teams)])
    if "mfu" not in panels:  # said once, under the panels (room kept for it under the last x label)
        height_in = fig.get_size_inches()[1]
        fig.subplots_adjust(bottom=1.4 / height_in)
        fig.text(0.02, 0.1 / height_in, f"MFU {NOT_MEASURED}: the track gives no peak FLOP/s for this device (a CPU)",
                 va="bottom", fontsize=13, color="#555")
    return fig


def scaling_figure(track: str, records: list[dict], assumptions: bool = False, track_option: str | None = None, *,
                   colors: Callable[[str], str]):
    """Measured weak-scaling efficiency (filled markers, solid) and the model's prediction (hollow, dashed).
    `track_option`: what the suggested command passes as `--track` (an organiser's file by its path; default
    the name)."""
    if not records:
        return message_figure(f"Weak scaling, track {track}: not measured yet", [
            "measures tokens/s at several world sizes. This chart",
            "then shows the measured weak-scaling efficiency",
            "(tokens/s at N / (N x tokens/s at 1)) and the model's",
            "prediction up to 256 devices. The communication probe",
            "of every run (comm overlap) is on the throughput chart:",
            "a different quantity."],
            command=f"harness scale submissions/<team> --track {shlex.quote(track_option or track)} --world-sizes 1,2")
    fig, ax = subplots(figsize=(8.5, 5.4))
    xs_all: list[int] = []
    event = None
    for rec in newest_per_team(records):
        team, color = rec.get("team", "?"), colors(rec.get("team", "?"))
        pts = sorted(rec.get("points", []), key=lambda p: p["world_size"])
        mx = [p["world_size"] for p in pts if measured(p) is not None]
        ax.plot(mx, [measured(p) for p in pts if measured(p) is not None], "o-", color=color, markersize=11,
                linewidth=2.6, label=f"{team}: measured ({rec.get('device_name') or '?'})", zorder=3)
        pred = predicted(rec)
        if pred:
            px = sorted(pred)
            ax.plot(px, [pred[x] for x in px], "o--", color=color, markerfacecolor="white", markersize=8,
                    linewidth=1.8, label=f"{team}: predicted (model)", zorder=2)
        event = rec.get("track_world_size") or event
        if event and event in pred:
            ax.annotate(f"predicted {pred[event]:.3f}\nat {event} devices", (event, pred[event]), xytext=(14, -52),
                        textcoords="offset points", ha="left", fontsize=13, color=color,
                        arrowprops={"arrowstyle": "-", "color": color, "alpha": 0.6})
        xs_all += mx + list(pred)
        if mx:
            ax.axvspan(max(mx) * 1.15, max(xs_all + [max(mx) * 2]), color="#f2f2f2", zorder=0)
    top = max([1.12] + [v + 0.08 for rec in records for p in rec.get("points", []) if (v := measured(p)) is not None])
    if event:  # labelled at the foot of the line: at the top it covered the measured point at that size
        ax.axvline(event, color="#555", linestyle=":", linewidth=1.5)
        ax.text(event, 0.03, f" the event: {event} devices", fontsize=13, color="#555", va="bottom", ha="left",
                transform=ax.get_xaxis_transform(),
                bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    log2_axis(ax, xs_all)
    ax.text(0.99, 0.14, "shaded: beyond what was measured\n(prediction only)", transform=ax.transAxes, ha="right",
            fontsize=12, color="#666")
    ax.set(title=f"Weak scaling: track {track}", xlabel="devices (world size)",
           ylabel="tokens/s at N / (N x tokens/s at 1)", ylim=(0, top))
    legend_outside(ax, ncol=1)
    if assumptions:
        model = (records[-1].get("model") or {})
        lines = ["Prediction = model, not measurement. Assumptions:"] + [f"- {a}" for a in model.get("assumptions", [])]
        note = (model.get("fit") or {}).get("note")
        if note:
            lines.append(f"- fit: {note}")
        lines += [f"- measured: {n}" for n in records[-1].get("notes", [])]
        ax.text(0.0, -0.24 - 0.06 * len(ax.get_legend().get_texts()), "\n".join(lines), ha="left", va="top",
                fontsize=11, color="#333", transform=ax.transAxes)
    return fig
