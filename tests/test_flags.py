"""`harness flag` / `harness unflag` through the CLI."""

import pytest
import json

from harness.results.locks import TrackLock
from records_factory import make_run

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def test_flag_hides_a_run_and_unflag_brings_it_back(cli, tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0)
    beta = make_run(runs, "beta", 1.5)
    result = cli("flag", beta.name, "--reason", "looked at validation data", "--runs-dir", str(runs))
    assert result.code == 0, result.err
    record = json.loads((beta / "run.json").read_text())
    assert record["flagged"] and record["flag_reason"] == "looked at validation data"
    assert record["flag_history"][0]["flagged"] is True
    board = (tmp_path / "leaderboard" / "local.csv").read_text().splitlines()
    assert board[1].startswith("1,alpha,") and ",beta," in board[2] and ",flagged," in board[2]
    assert cli("unflag", beta.name, "--runs-dir", str(runs)).code == 0
    board = (tmp_path / "leaderboard" / "local.csv").read_text().splitlines()
    assert board[1].startswith("1,beta,")
    assert len(json.loads((beta / "run.json").read_text())["flag_history"]) == 2


def test_flag_needs_a_reason_and_a_known_run(cli, tmp_path):
    runs = tmp_path / "runs"
    run = make_run(runs, "alpha", 2.0)
    assert cli("flag", "nope", "--reason", "x", "--runs-dir", str(runs)).code == 2
    assert cli("flag", run.name, "--reason", " ", "--runs-dir", str(runs)).code == 2


def test_flag_waits_for_a_run_training_on_the_track(cli, tmp_path):
    runs = tmp_path / "runs"
    run = make_run(runs, "alpha", 2.0)
    with TrackLock(runs / "local", exclusive=False):  # what a training run's guard holds
        result = cli("flag", run.name, "--reason", "x", "--runs-dir", str(runs))
    assert result.code == 2 and "a run is training on this track" in result.err
