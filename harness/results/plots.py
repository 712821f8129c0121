"""Charts of a track, drawn from run records (matplotlib, PNG), into plots/<track>/.

loss_vs_time.png    train loss curves and final val loss against training time, every team
loss_vs_tokens.png  train loss against tokens seen
val_loss.png        final validation loss per team with its 95% interval
throughput.png      tokens/s and MFU per team
scaling.png         scaling efficiency against world size (harness scale, and each run's probe)

Where the data has a loss floor, it is drawn. Curves: the team's counted runs, at most
MAX_CURVES per team (the best ones), so a track with thousands of runs stays readable.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.results.stats import finite_first  # noqa: E402

MAX_CURVES = 5
plt.rcParams.update({"font.size": 12, "axes.titlesize": 14, "axes.grid": True, "grid.alpha": 0.3,
                     "figure.dpi": 110, "savefig.bbox": "tight"})


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".png", dir=path.parent)
    os.close(fd)
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def log2_axis(ax, values) -> None:
    """A log2 world-size axis labelled with plain numbers (1, 2, 4, ... 256)."""
    ax.set_xscale("log", base=2)
    top = max([1, *values])
    ticks = [2**k for k in range(0, max(1, int(top).bit_length()))]
    ax.set_xticks(ticks, [str(t) for t in ticks])


def _colors(teams: list[str]) -> dict[str, str]:
    cmap = plt.get_cmap("tab10" if len(teams) <= 10 else "tab20")
    return {t: cmap(i % cmap.N) for i, t in enumerate(teams)}


def _floor(ax, floors: list[float]) -> None:
    if floors:
        ax.axhline(min(floors), color="black", linestyle="--", linewidth=1.2, label=f"loss floor {min(floors):.3f}")


def _curves(run_rows: list[dict]) -> list[tuple[dict, pd.DataFrame]]:
    out = []
    for row in sorted(run_rows, key=lambda r: finite_first(r["val_loss"]))[:MAX_CURVES]:
        path = Path(row["run_dir"]) / "metrics.csv"
        try:
            frame = pd.read_csv(path)
        except (OSError, ValueError):
            continue
        out.append((row, frame.dropna(subset=["train_loss"])))
    return out


def draw_track(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], scale_records: list[dict],
               out_dir: Path) -> list[Path]:
    """Draw every chart; `counted` maps each ranked team to its ok runs (rows from leaderboard.load_rows)."""
    ranked = table[table["status"] == "ok"]
    teams = list(ranked["team"])
    colors = _colors(list(table["team"]))
    floors = [r["loss_floor"] for runs in counted.values() for r in runs if r.get("loss_floor") is not None]
    paths = []

    for x_col, name, xlabel in (("train_time_s", "loss_vs_time.png", "training time (s)"),
                                ("tokens", "loss_vs_tokens.png", "tokens seen")):
        fig, ax = plt.subplots(figsize=(10, 6))
        for team in teams:
            for i, (row, frame) in enumerate(_curves(counted.get(team, []))):
                ax.plot(frame[x_col], frame["train_loss"], color=colors[team], alpha=0.8 if i == 0 else 0.35,
                        label=f"{team} (train)" if i == 0 else None)
                x_end = row.get(x_col) if row.get(x_col) is not None else (frame[x_col].iloc[-1] if len(frame) else 0)
                ax.scatter([x_end], [row["val_loss"]], color=colors[team], marker="*", s=140, zorder=3,
                           edgecolor="black", label=f"{team} (val)" if i == 0 else None)
        _floor(ax, floors)
        ax.set(title=f"Loss against {xlabel.split(' (')[0]}: track {track}", xlabel=xlabel,
               ylabel="loss (nats per token)")
        if teams:
            ax.legend(loc="upper right", fontsize=10)
        else:
            ax.text(0.5, 0.5, "no finished runs yet", transform=ax.transAxes, ha="center")
        paths.append(out_dir / name)
        _save(fig, paths[-1])

    fig, ax = plt.subplots(figsize=(10, max(3, 0.6 * len(teams) + 1.5)))
    if teams:
        ys = list(range(len(teams)))[::-1]
        xerr = [v if pd.notna(v) else 0.0 for v in ranked["ci95"]]
        ax.errorbar(ranked["val_loss"], ys, xerr=xerr, fmt="o", color="black", ecolor="gray", capsize=6)
        for y, (_, row) in zip(ys, ranked.iterrows()):
            ax.annotate(f"#{row['rank']}  {row['val_loss']:.4f}" + (f" ±{row['ci95']:.4f}" if pd.notna(row["ci95"]) else ""),
                        (row["val_loss"], y), textcoords="offset points", xytext=(0, 10), ha="center", fontsize=11)
        ax.set_yticks(ys, teams)
        ax.set_ylim(-0.6, len(teams) - 0.3)
        ax.margins(x=0.15)
    if floors:
        ax.axvline(min(floors), color="black", linestyle="--", linewidth=1.2, label=f"loss floor {min(floors):.3f}")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1, frameon=False)
    ax.set(title=f"Validation loss per team (95% interval): track {track}", xlabel="validation loss (nats per token)")
    paths.append(out_dir / "val_loss.png")
    _save(fig, paths[-1])

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, max(3, 0.6 * len(teams) + 1.5)))
    ys = list(range(len(teams)))[::-1]
    ax1.barh(ys, ranked["tokens_per_s"].fillna(0), color=[colors[t] for t in teams])
    ax1.set(title="Throughput", xlabel="tokens per second (all devices)")
    mfus = ranked["mfu"]
    if mfus.notna().any():
        ax2.barh(ys, [100 * v if pd.notna(v) else 0 for v in mfus], color=[colors[t] for t in teams])
        for y, v in zip(ys, mfus):
            ax2.annotate("n/a" if pd.isna(v) else f"{100 * v:.1f}%", (0, y), textcoords="offset points",
                         xytext=(4, -4), fontsize=10)
    else:
        ax2.text(0.5, 0.5, "MFU n/a: the track gives no peak FLOP/s\nfor this device (a CPU)", ha="center",
                 va="center", transform=ax2.transAxes)
        ax2.set_xticks([])
        ax2.set_yticks([])
    ax1.set(title=f"Throughput: track {track}")
    ax2.set(title="Model FLOPs utilisation", xlabel="MFU (% of peak dense bf16)")
    ax1.set_yticks(ys, teams)
    if mfus.notna().any():
        ax2.set_yticks(ys, teams)
    fig.subplots_adjust(wspace=0.45)
    paths.append(out_dir / "throughput.png")
    _save(fig, paths[-1])

    fig, ax = plt.subplots(figsize=(10, 6))
    for rec in scale_records:
        team = rec.get("team", "?")
        pts = sorted(rec.get("points", []), key=lambda p: p["world_size"])
        color = colors.get(team, "tab:gray")
        ax.plot([p["world_size"] for p in pts], [p["efficiency"] for p in pts], "o-", color=color,
                label=f"{team}: measured")
        pred = rec.get("prediction", {}).get("efficiency", {})
        if pred:
            xs = sorted(int(k) for k in pred)
            ax.plot(xs, [pred[str(x)] for x in xs], "x--", color=color, label=f"{team}: predicted (fit)")
    for team in teams:
        for row in counted.get(team, []):
            if row.get("scaling_efficiency") is not None and row.get("world_size"):
                ax.scatter([row["world_size"]], [row["scaling_efficiency"]], color=colors[team], marker="s")
    if not scale_records:
        ax.text(0.5, 0.5, "no scaling data yet: run `harness scale SUBMISSION`", transform=ax.transAxes, ha="center")
    xs = [p["world_size"] for rec in scale_records for p in rec.get("points", [])]
    xs += [int(k) for rec in scale_records for k in rec.get("prediction", {}).get("efficiency", {})]
    log2_axis(ax, xs)
    ax.set(title=f"Scaling efficiency against world size: track {track}", xlabel="devices (world size)",
           ylabel="efficiency (1 = perfect)", ylim=(0, 1.15))
    if scale_records:
        ax.legend(fontsize=10)
    paths.append(out_dir / "scaling.png")
    _save(fig, paths[-1])
    return paths


def load_scale_records(root: Path, track: str) -> list[dict]:
    out = []
    for path in sorted(Path(root).glob(f"{track}/*/scale-*/scale.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out
