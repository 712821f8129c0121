"""Run records made by tests, without training: the views are derived from records alone."""

from __future__ import annotations

from pathlib import Path

from harness.results.records import RunRecord, save_metrics, save_record


def make_run(root: Path, team: str, val_loss: float | None, *, status: str = "ok", track: str = "local",
             official: bool = True, seed: int = 1, sha: str = "a" * 64, started_at: str = "2026-11-29T10:00:00Z",
             reason: str = "", flagged: bool = False, run_id: str | None = None, **fields) -> Path:
    run_id = run_id or f"20261129T1000{seed:02d}-{abs(hash((team, seed, sha, status))) % 16**6:06x}"
    rec = RunRecord(run_id=run_id, team=team, track_name=track, status=status, reason=reason, official=official,
                    val_loss=val_loss, seed=seed, submission_sha256=sha, started_at=started_at, flagged=flagged,
                    track={"name": track, "ranking": fields.pop("ranking", "mean"),
                           "max_steps": fields.pop("max_steps", 0), **fields.pop("track_fields", {})},
                    world_size=fields.pop("world_size", 2),
                    tokens_per_s=fields.pop("tokens_per_s", 1000.0), tokens=fields.pop("tokens", 30000),
                    steps=fields.pop("steps", 100), train_time_s=fields.pop("train_time_s", 30.0),
                    params=fields.pop("params", 1000), loss_floor=fields.pop("loss_floor", 1.5), **fields)
    run_dir = root / track / team / run_id
    save_record(run_dir, rec)
    if val_loss is not None:
        save_metrics(run_dir, [{"step": s, "train_time_s": s * 0.3, "train_loss": val_loss + 3.0 / (s + 1),
                                "lr_scale": 1.0, "tokens": s * 300, "tokens_per_s": 1000.0} for s in range(1, 101, 10)])
    return run_dir
