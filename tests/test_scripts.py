"""A newcomer's first hour: the scripts of the README's quickstart, and a clean checkout after them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import ROOT


def _git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"git {' '.join(args)} failed (these tests read the checkout's index): {proc.stderr}"
    return proc.stdout


def test_no_tracked_file_lies_where_a_run_writes_by_default(monkeypatch):
    """The quickstart's run refreshes leaderboard/ and plots/ (the defaults, relative to the checkout where the
    README's commands are typed): no file of the repository may be there, and what a run writes there is
    ignored, so that a newcomer's `git status` stays clean after it."""
    from harness.results.records import leaderboard_root, plots_root

    for var in ("HARNESS_LEADERBOARD_DIR", "HARNESS_PLOTS_DIR"):
        monkeypatch.delenv(var, raising=False)
    board, plots = leaderboard_root(), plots_root()
    assert not board.is_absolute() and not plots.is_absolute()
    assert _git("ls-files", "--", str(board), str(plots)).split() == []
    written = [str(board / "local.csv"), str(board / "local.html"), str(board / ".lock"),
               str(plots / "local" / "val_loss.png"), str(plots / "compare" / "a_vs_b.png")]
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *written], capture_output=True,
                             text=True)
    assert sorted(ignored.stdout.split()) == sorted(written), ignored.stderr


def test_the_example_standings_are_regenerated_where_they_are_committed(tmp_path, monkeypatch):
    """scripts/example-standings writes the folders that hold the committed example files, never the
    defaults a user's own runs write to."""
    from harness.results.records import leaderboard_root, plots_root

    log = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$HARNESS_LEADERBOARD_DIR $HARNESS_PLOTS_DIR" >> "{log}"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    proc = subprocess.run([str(ROOT / "scripts" / "example-standings")], env={**env, "PYTHON": str(fake), "SEEDS": "1"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (dirs,) = set(log.read_text().splitlines())
    board, plots = dirs.split()
    for var in ("HARNESS_LEADERBOARD_DIR", "HARNESS_PLOTS_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert Path(board) != leaderboard_root() and Path(plots) != plots_root()
    tracked = set(_git("ls-files", "--", board, plots).split())
    assert {f"{board}/local.{ext}" for ext in ("csv", "md", "html")} <= tracked, tracked
    charts = ("loss_vs_time", "loss_vs_tokens", "val_loss", "throughput", "scaling")
    assert {f"{plots}/local/{name}.png" for name in charts} <= tracked, tracked
