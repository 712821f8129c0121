"""`harness scale` records as the views read them: found under runs/, newest per team, measured figures.

Kept apart from the charts so the page (and `--no-charts`) can state what was measured without
importing matplotlib. Schema 1 records (before the probe and weak scaling were named apart) still read.
"""

from __future__ import annotations

from pathlib import Path

from harness.results.records import read_record_json


def load_scale_records(root: Path, track: str) -> list[dict]:
    """Every well-formed scale record of the track: one whose fields the charts and the page read have their
    types (the runs tree may hold a file a team planted where the sandbox was off); the others are left out."""
    out = []
    for path in sorted(Path(root).glob(f"{track}/*/scale-*/scale.json")):
        try:
            rec = read_record_json(path)  # bounded, a regular file, an object
        except (OSError, ValueError):
            continue
        if _well_formed(rec):
            out.append(rec)
    return out


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _well_formed(rec: dict) -> bool:
    if not isinstance(rec.get("team", "?"), str) or not isinstance(rec.get("created_at") or "", str):
        return False
    points = rec.get("points", [])
    if not isinstance(points, list) or not all(
            isinstance(p, dict) and _is_num(p.get("world_size", 1)) and (measured(p) is None or _is_num(measured(p)))
            for p in points):
        return False
    pred = rec.get("prediction") or {}
    try:
        return isinstance(pred, dict) and all(_is_num(v) for v in predicted(rec).values())
    except (TypeError, ValueError, AttributeError):
        return False


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
