"""`harness compare A B [C ...]`: does one submission really beat another?

Each side is a team name (its official ok runs of its latest submission), a run id, or a run
directory. Every metric is shown side by side with the difference from the first side (the
reference), a 95% Welch interval and a Welch t-test p-value; with a single run on a side no
significance is claimed. Throughput is compared as a ratio. An overlay chart shows the loss
curves of every run of every side.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.results.leaderboard import current_runs, scored
from harness.results.records import iter_run_dirs, match_runs, read_record_json, upgrade_record
from harness.results.stats import is_finite, summarize, welch

# (field, label, how differences are shown)
METRICS = [
    ("val_loss", "val_loss", "diff"),
    ("train_loss", "train_loss", "diff"),
    ("tokens_per_s", "tokens_per_s", "ratio"),
    ("mfu", "mfu", "diff"),
    ("comm_overlap_efficiency", "comm_overlap_efficiency", "diff"),
    ("steps", "steps", "diff"),
    ("tokens", "tokens", "diff"),
    ("train_time_s", "train_time_s", "diff"),
    ("params", "params", "diff"),
    ("flops_per_token", "flops_per_token", "diff"),
    ("peak_mem_gib", "peak_mem_gib", "diff"),
]


@dataclass
class Side:
    label: str
    runs: list[dict] = field(default_factory=list)  # raw run.json contents, with "run_dir"

    def values(self, key: str) -> list[float]:
        """The side's figures for a metric; missing and non-finite ones are left out (never averaged in)."""
        return [float(r[key]) for r in self.runs if is_finite(r.get(key))]


def _load(run_dir: Path) -> dict:
    raw = upgrade_record(read_record_json(run_dir / "run.json"))
    raw["run_dir"] = str(run_dir)
    return raw


def resolve_side(key: str, runs_root: Path, track: str | None, include_unofficial: bool) -> Side:
    """A side from a run directory, a run id (or unique prefix), or a team name."""
    path = Path(key)
    if (path / "run.json").is_file():
        raw = _load(path)
        return Side(f"{raw['team']}/{raw['run_id']}", [raw])
    dirs = list(iter_run_dirs(runs_root, track))
    by_id = match_runs(runs_root, key, track)
    if len(by_id) == 1:
        raw = _load(by_id[0])
        return Side(f"{raw['team']}/{raw['run_id']}", [raw])
    loaded = [_load(d) for d in dirs]
    team_runs = [r for r in loaded if r.get("team") == key]
    if not team_runs:
        if len(by_id) > 1:
            raise LookupError(f"{key!r} matches {len(by_id)} runs: give more of the run id")
        teams = sorted({str(r.get("team")) for r in loaded})
        hint = difflib.get_close_matches(key, teams, n=1)
        raise LookupError(f"{key!r} is not a run directory, a run id or a team under {runs_root}"
                          + (f" (track {track})" if track else "") + "."
                          + (f" Did you mean: {hint[0]}?" if hint else "")
                          + (f" Teams: {', '.join(teams)}." if teams and len(teams) <= 20 else ""))
    tracks = sorted({r["track_name"] for r in team_runs})
    if len(tracks) > 1:
        raise LookupError(f"team {key!r} has runs on tracks {', '.join(tracks)}: choose one with --track")
    eligible = [r for r in team_runs if r.get("official") or include_unofficial]
    counted = current_runs(eligible).get(key, [])
    ok = [r for r in counted if scored(r)]
    if not ok:
        raise LookupError(f"team {key!r} has no {'' if include_unofficial else 'official '}ok run to compare"
                          + ("" if include_unofficial else " (--all includes unofficial runs)"))
    return Side(key, ok)


def compare(sides: list[Side]) -> list[dict[str, Any]]:
    """One row per metric: each side's mean and n, and each later side against the first."""
    ref = sides[0]
    rows = []
    for key, label, mode in METRICS:
        row: dict[str, Any] = {"metric": label}
        for side in sides:
            vals = side.values(key)
            s = summarize(vals) if vals else None
            row[side.label] = None if s is None else s.mean
            row[f"{side.label} ci95"] = None if s is None else s.ci95
            row[f"{side.label} n"] = len(vals)
        for side in sides[1:]:
            a, b = ref.values(key), side.values(key)
            prefix = f"{side.label} vs {ref.label}"
            if not a or not b:
                row[f"{prefix}: diff"] = row[f"{prefix}: ci95"] = row[f"{prefix}: p"] = None
                row[f"{prefix}: note"] = "missing on a side"
                continue
            cmp = welch(b, a)
            if mode == "ratio":
                ma, mb = sum(a) / len(a), sum(b) / len(b)
                row[f"{prefix}: ratio"] = mb / ma if ma else None
            row[f"{prefix}: diff"] = cmp.diff
            row[f"{prefix}: ci95"] = cmp.ci95
            row[f"{prefix}: p"] = cmp.p_value
            row[f"{prefix}: note"] = cmp.note
        rows.append(row)
    return rows


def verdict(sides: list[Side]) -> list[str]:
    """Plain sentences on val_loss: who is lower, and whether it is significant."""
    ref = sides[0]
    lines = []
    for side in sides[1:]:
        cmp = welch(side.values("val_loss"), ref.values("val_loss"))
        better, worse = (side.label, ref.label) if cmp.diff < 0 else (ref.label, side.label)
        if cmp.p_value is None:
            lines.append(f"{better} has the lower val_loss than {worse} by {abs(cmp.diff):.4f}, but {cmp.note}.")
        elif cmp.p_value < 0.05:
            lines.append(f"{better} beats {worse} by {abs(cmp.diff):.4f} ± {cmp.ci95:.4f} (95% CI), "
                         f"Welch p = {cmp.p_value:.3g}: significant.")
        else:
            lines.append(f"{better} is lower than {worse} by {abs(cmp.diff):.4f} ± {cmp.ci95:.4f} (95% CI), "
                         f"Welch p = {cmp.p_value:.3g}: not significant at 0.05.")
    return lines


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
