"""`harness scale` records as the views read them: found under runs/, newest per team, measured figures.

Kept apart from the charts so the page (and `--no-charts`) can state what was measured without
importing matplotlib. Schema 1 records (before the probe and weak scaling were named apart) still read.
"""

from __future__ import annotations

import json
from pathlib import Path


def load_scale_records(root: Path, track: str) -> list[dict]:
    out = []
    for path in sorted(Path(root).glob(f"{track}/*/scale-*/scale.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def measured(point: dict) -> float | None:
    """A point's measured weak-scaling efficiency (schema 1 called it "efficiency")."""
    return point.get("weak_scaling_efficiency", point.get("efficiency"))


def predicted(record: dict) -> dict[int, float]:
    """The model's predicted efficiency per world size: a prediction, never shown as a measurement."""
    pred = record.get("prediction") or {}
    if isinstance(pred.get("efficiency"), dict):  # schema 1: {"efficiency": {"32": 0.9, ...}}
        return {int(k): float(v) for k, v in pred["efficiency"].items()}
    return {int(k): float(v["efficiency"]) for k, v in pred.items() if isinstance(v, dict) and "efficiency" in v}


def newest_per_team(records: list[dict]) -> list[dict]:
    by_team: dict[str, dict] = {}
    for rec in sorted(records, key=lambda r: r.get("created_at") or ""):
        by_team[rec.get("team", "?")] = rec
    return [by_team[t] for t in sorted(by_team)]
