"""Submissions that try to game the rules, through the real CLI."""

import json
import shutil

import pytest

from conftest import FIXTURES, TINY_TRACK, one_rank, processes_of_run, quick_track
from records_factory import make_run

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _record(runs, team):
    (path,) = (runs / "tiny" / team).glob("*/run.json")
    return json.loads(path.read_text())


def test_a_model_that_peeks_ahead_is_invalid_before_training(cli, tmp_path):
    result = cli("run", str(FIXTURES / "peeks_ahead"), "--track", str(TINY_TRACK))
    assert result.code == 1
    record = _record(tmp_path / "runs", "peeks_ahead")
    assert record["status"] == "invalid" and "non-causal" in record["reason"] and record["steps"] is None


def test_a_model_that_peeks_only_once_trained_is_caught_by_evaluation(cli, tmp_path):
    result = cli("run", str(FIXTURES / "sneaky_peek"), "--track", str(quick_track(tmp_path)))
    assert result.code == 1
    record = _record(tmp_path / "runs", "sneaky_peek")
    assert record["status"] == "invalid" and "non-causal" in record["reason"]
    assert record["steps"] > 5 and record["val_loss"] is None  # it trained; its figure is not a result
    assert record["eval"]["causality"]["causal"] is False and "unscored_val_loss" in record["eval"]


def test_a_patched_clock_is_caught_by_the_launchers_own_measurement(cli, tmp_path):
    """The cheat's clocks run at 0.6: it trains a 4 s budget in about 6.7 s. The grace (20 s here, not
    tiny's 3) keeps the hard limit far from that on a slow machine: the launcher's own window is past
    the budget by far more than a last step may be, so the run is a timeout, and flagged."""
    result = cli("run", str(FIXTURES / "clock_cheat"), "--track", str(one_rank(tmp_path, grace_s=20.0)),
                 leaderboard=True)
    record = _record(tmp_path / "runs", "clock_cheat")
    assert record["status"] == "timeout" and "past its 4 s budget" in record["reason"], record["reason"]
    assert record["window_check"]["ok"] is False and record["val_loss"] is None
    assert record["flagged"] is True and "clock disagreement" in record["flag_reason"]
    budget = record["budget_s"]
    assert record["train_time_s"] <= budget + record["max_step_s"]  # what the cheated ranks believed
    assert record["launcher_train_time_s"] > budget / 0.6 * 0.9  # what really happened: the slowdown, less 10%
    assert record["tokens_per_s"] == record["tokens"] / record["launcher_train_time_s"]  # the enforced window
    assert "FLAGGED" in result.out
    board = (tmp_path / "leaderboard" / "tiny.csv").read_text().splitlines()
    assert board[1].startswith(",clock_cheat,") and ",flagged," in board[1]  # listed, not ranked


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_writes_into_results_are_blocked_or_undone_and_flag_the_run(cli, tmp_path, sandbox):
    """Two layers: with the sandbox the ranks cannot even open another run's record; without it (a
    machine without Landlock, here the track's `sandbox = "off"`) the guard restores what was changed
    and flags the run."""
    runs = tmp_path / "runs"
    victim = make_run(runs, "victim", 2.5, track="tiny") / "run.json"
    before = victim.read_bytes()
    assert cli("leaderboard", "--runs-dir", str(runs), "--no-charts").code == 0
    board = tmp_path / "leaderboard" / "tiny.csv"
    sub = tmp_path / "tamper"
    shutil.copytree(FIXTURES / "tamper", sub)
    (sub / "targets.json").write_text(json.dumps({"records": [str(victim)], "leaderboard": [str(board)]}))
    quick = quick_track(tmp_path)
    quick.write_text(quick.read_text().replace('name = "tiny"', f'name = "tiny"\nsandbox = "{sandbox}"'))

    result = cli("run", str(sub), "--track", str(quick), env={"HARNESS_DATA_ROOT": "/secret/data"})
    assert victim.read_bytes() == before, "another team's record was changed"
    record = _record(runs, "tamper")
    (log,) = (runs / "tiny" / "tamper").glob("*/logs/rank0.log")
    if sandbox == "auto":
        assert record["sandbox"]["training"]["active"] is True
        assert "TAMPER: denied (PermissionError)" in log.read_text() and record["status"] == "ok"
        assert not record["flagged"]
    else:
        assert "TAMPER: wrote" in log.read_text()
        assert record["flagged"] is True and str(victim) in record["flag_reason"]
        assert "FLAGGED" in result.out
        assert any("training ranks ran without the sandbox" in w for w in record["warnings"])
    text = board.read_text()
    assert "HACKED" not in text and ",victim," in text
    assert processes_of_run(record["run_id"]) == []
    # The ranks were told nothing about where results or data live, and worked in a private folder.
    line = next(l for l in log.read_text().splitlines() if l.startswith("SEEN-ENV"))
    seen = json.loads(line.split("SEEN-ENV ", 1)[1].split(" CWD ")[0])
    assert set(seen) == {"HARNESS_RUN_ID", "HARNESS_LAUNCHER_PID", "HARNESS_SUBMISSION_PACKAGE_DIR"}, seen
    assert seen["HARNESS_RUN_ID"] == record["run_id"], seen
    package = seen["HARNESS_SUBMISSION_PACKAGE_DIR"]  # the ranks' own copy, for their spawned workers
    assert "harness-train-" in package and str(tmp_path) not in package, seen
    cwd = line.split(" CWD ")[1]
    assert str(tmp_path) not in cwd and "harness-train-" in cwd


def test_the_check_and_model_processes_can_change_no_file_by_path_nor_reach_a_daemon(cli, tmp_path):
    """chmod, utime and connect() by path are not Landlock's: the check process and evaluation's model
    processes run in a root of their own that holds neither another team's record nor a daemon's socket."""
    import os
    import socket

    runs = tmp_path / "runs"
    victim = make_run(runs, "victim", 2.5, track="tiny") / "run.json"
    before = os.stat(victim)
    sub = tmp_path / "meddler"
    shutil.copytree(FIXTURES / "meddler", sub)
    daemon = socket.socket(socket.AF_UNIX)
    daemon.bind(str(tmp_path / "daemon.sock"))
    daemon.listen(4)
    (sub / "targets.json").write_text(json.dumps({"files": [str(victim)], "socket": str(tmp_path / "daemon.sock")}))
    try:
        result = cli("run", str(sub), "--track", str(quick_track(tmp_path)))
    finally:
        daemon.close()
    after = os.stat(victim)
    assert (after.st_mode, after.st_mtime_ns) == (before.st_mode, before.st_mtime_ns), "another team's record was changed"
    record = _record(runs, "meddler")
    assert record["status"] == "ok", (record["reason"], result.err[-2000:])
    logs = next((runs / "tiny" / "meddler").glob("*/logs"))
    for name in ("preflight.log", "eval-model-rank0.log", "eval-check-rank0.log"):
        text = (logs / name).read_text()
        assert "MEDDLE chmod ENOENT utime ENOENT" in text and "MEDDLE socket ENOENT" in text, (name, text[-800:])
        assert "MEDDLE fchmod" in text and (logs / name).stat().st_mode & 0o7777 == 0o644, name  # undone after
    assert record["sandbox"]["check"]["filesystem"]["active"] is True
    assert all(r["filesystem"]["active"] is True for r in record["sandbox"]["evaluation"].values())
    assert not [w for w in record["warnings"] if "isolation" in w]


def test_a_claimed_end_of_training_does_not_stop_the_launchers_clock(cli, tmp_path):
    """The submission reports "training ended" at its 3rd step through its own channel and trains on
    (budget 30 s): the launcher kills it a save allowance (6 s here) after the claim, and flags the run
    for the progress reports that came after it."""
    result = cli("run", str(FIXTURES / "fake_train_end"), "--track", str(one_rank(tmp_path, save_allowance_s=6.0)),
                 "--budget-s", "30")
    assert result.code == 1
    record = _record(tmp_path / "runs", "fake_train_end")
    save = record["track"]["save_allowance_s"]
    assert record["status"] == "timeout" and "the save allowance" in record["reason"]
    assert record["launcher_train_time_s"] < save + 5, "the claimed end must start the save allowance"
    assert record["flagged"] is True and "reported 'progress' after training had ended" in record["flag_reason"]
    assert processes_of_run(record["run_id"]) == []


def test_a_process_that_pretends_to_be_a_rank_is_refused_and_flags_the_run(cli, tmp_path):
    result = cli("run", str(FIXTURES / "impostor"), "--track", str(TINY_TRACK))  # rank 1 starts the impostor
    record = _record(tmp_path / "runs", "impostor")
    assert record["status"] == "ok", record["reason"]  # its fake "training ended" changed nothing
    assert record["flagged"] is True and "pretended to be a rank" in record["flag_reason"]
    assert any("claimed rank 0, already reporting" in r for r in record["refused_reports"])
    assert record["launcher_train_time_s"] > record["budget_s"] - 1.0
    assert "FLAGGED" in result.out
