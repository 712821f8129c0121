"""Broken submissions through the real CLI: each ends as a record with a status and a reason,
within a bound, with nothing of the job left running. Track `tiny`: budget 4 s, grace 3 s,
collective timeout 8 s, SIGTERM->SIGKILL after 2 s."""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import FIXTURES, TINY_TRACK, only_record, processes_of_run, run_dirs


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def run_fixture(cli, name, *extra):
    result = cli("run", str(FIXTURES / name), "--track", str(TINY_TRACK), *extra)
    return result


def assert_clean(record, tmp_path=None, cli=None):
    """Nothing of the job left running; and the leaderboard lists the team as not finished, with the reason."""
    assert processes_of_run(record["run_id"]) == [], "a process of the job outlived it"
    if tmp_path is None:
        return
    name = "tiny.csv" if record["official"] else "tiny-all.csv"
    if not record["official"]:
        assert cli("leaderboard", "--all", "--no-charts").code == 0
    rows = list(csv.DictReader((tmp_path / "leaderboard" / name).open()))
    (row,) = [r for r in rows if r["team"] == record["team"]]
    if record["status"] == "ok":
        assert row["rank"] == "1"
    else:
        assert row["rank"] == "" and row["status"] == record["status"] and row["reason"] == record["reason"]


@pytest.mark.parametrize("fixture, message", [
    ("syntax_error", "submission.py:5: syntax error: expected ':'. Fix the line shown:\n    def get_model(config)\n"),
    ("import_error", "import failed"),
    ("no_get_model", "defines no get_model"),
    ("bad_config", "CONFIG has no `seq_len`"),
    ("forward_not_pair", "not a pair (logits, loss)"),
    ("wrong_logits_shape", "logits have shape"),
    ("nonscalar_loss", "not a scalar tensor"),
    ("int_logits", "not a float type"),
    ("short_positions", "forward fails on a window of 64 tokens, the track's evaluation length"),
])
def test_contract_errors_are_invalid_before_any_process_group(cli, tmp_path, fixture, message):
    result = run_fixture(cli, fixture)
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "invalid" and message in record["reason"]
    # The team's own file, relative to its submission folder: the same on every machine that runs it.
    assert record["reason"].startswith("submission.py"), record["reason"]
    assert str(tmp_path) not in record["reason"] and str(FIXTURES) not in record["reason"]
    assert not (run_dir / "logs" / "rank0.log").exists(), "ranks were started for an invalid submission"
    assert "status     invalid" in result.err
    assert_clean(record, tmp_path, cli)


def test_exception_on_one_rank_is_crashed_with_its_traceback(cli, tmp_path):
    result = run_fixture(cli, "crash_rank1")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and record["failing_rank"] == 1
    assert "deliberate crash on rank 1 at step 3" in record["reason"]
    assert "deliberate crash" in record["traceback"] and "submission.py" in record["traceback"]
    assert record["launcher_train_time_s"] < 5.0, "all ranks must be gone within seconds of the crash"
    assert_clean(record, tmp_path, cli)


def test_forward_sleeping_past_the_budget_is_killed_at_the_hard_limit(cli, tmp_path):
    result = run_fixture(cli, "sleepy_forward")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "timeout" and "hard limit" in record["reason"]
    hard_limit = record["track"]["budget_s"] + record["track"]["grace_s"]
    assert hard_limit <= record["launcher_train_time_s"] < hard_limit + 1.0
    assert record["timings"]["kill_latency_s"] < 3.0  # poll (0.1 s) + SIGTERM, SIGKILL after 2 s if needed
    assert record["killed_pids"], "the launcher must have ended the ranks"
    assert_clean(record, tmp_path, cli)


def test_one_hung_rank_ends_the_job_by_timeout(cli, tmp_path):
    result = run_fixture(cli, "hang_rank1")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    # Hard limit (7 s) comes before the collective timeout (8 s) on this track.
    assert record["status"] == "timeout" and "hard limit" in record["reason"]
    assert record["launcher_train_time_s"] < 7.0 + 1.0
    assert_clean(record, tmp_path, cli)


def test_hung_rank_is_named_when_the_collective_timeout_comes_first(cli, tmp_path):
    result = run_fixture(cli, "hang_rank1", "--grace-s", "30")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and "rank(s) 1 stopped responding" in record["reason"]
    assert record["failing_rank"] == 1
    assert record["launcher_train_time_s"] < 8.0 + 4.0  # collective timeout + teardown
    assert_clean(record, tmp_path, cli)


def test_nan_loss_is_diverged_and_not_evaluated(cli, tmp_path):
    result = run_fixture(cli, "nan_loss")
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "diverged" and "NaN or inf" in record["reason"]
    assert record["val_loss"] is None and not (run_dir / "checkpoint.pt").exists()
    assert not (run_dir / "logs" / "eval-rank0.log").exists()
    assert record["launcher_train_time_s"] < 3.0
    assert_clean(record, tmp_path, cli)


def test_out_of_memory_is_crashed_with_that_reason(cli, tmp_path):
    result = run_fixture(cli, "oom")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and "out of memory" in record["reason"]
    assert_clean(record, tmp_path, cli)


def test_processes_a_submission_leaves_behind_are_ended(cli, tmp_path):
    result = run_fixture(cli, "orphan_child")
    assert result.code == 0, result.err
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok"
    assert record["killed_pids"] and any("left running" in n for n in record["notes"])
    assert_clean(record, tmp_path, cli)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_the_launcher_tears_everything_down(cache_dir, tmp_path, cli, sig):
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(FIXTURES / "sleepy_forward"),
                             "--track", str(TINY_TRACK), "--budget-s", "60"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the ranks are training
        dirs = run_dirs(tmp_path / "runs")
        if dirs and "training starts" in _read(dirs[0] / "logs" / "rank1.log"):
            break
        time.sleep(0.2)
    _, running = only_record(tmp_path / "runs")
    assert running["status"] == "running", "the record must exist while the run is in progress"
    time.sleep(2.0)
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5.0
    assert proc.returncode == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "aborted" and sig.name in record["reason"]
    assert "status     aborted" in err
    assert_clean(record, tmp_path, cli)


def test_two_runs_at_once_on_the_same_tree(cache_dir, tmp_path, cli):
    import shutil

    other = tmp_path / "other_team"
    shutil.copytree(FIXTURES / "ok_bigram", other)
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    procs = [subprocess.Popen([sys.executable, "-m", "harness", "run", str(sub), "--track", str(TINY_TRACK)],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for sub in (FIXTURES / "ok_bigram", other)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = run_dirs(tmp_path / "runs")
    assert len(dirs) == 2
    import json

    records = [json.loads((d / "run.json").read_text()) for d in dirs]
    assert {r["team"] for r in records} == {"ok_bigram", "other_team"}
    assert all(r["status"] == "ok" and not r["flagged"] for r in records), [r["flag_reason"] for r in records]
    assert not list((tmp_path / "runs").rglob(".run.json.*")), "a temporary file was left behind"
    rows = list(csv.DictReader((tmp_path / "leaderboard" / "tiny.csv").open()))
    assert sorted(r["team"] for r in rows) == ["ok_bigram", "other_team"] and all(r["rank"] for r in rows)
    for r in records:
        assert_clean(r)


@pytest.mark.parametrize("fixture, extra, reason", [
    ("nan_micro_batch", (), "loss became NaN or inf at step"),  # the first of two micro-batches
    ("nan_weights", ("--max-steps", "5"), "the weights hold NaN or inf values after the last step (5;"),
    ("nan_eval", (), "evaluation: the validation loss is nan"),
])
def test_non_finite_numbers_end_the_run_diverged_and_never_rank(cli, tmp_path, fixture, extra, reason):
    result = run_fixture(cli, fixture, *extra)
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "diverged" and reason in record["reason"], record["reason"]
    assert record["val_loss"] is None
    if fixture != "nan_eval":
        assert not (run_dir / "checkpoint.pt").exists() and not (run_dir / "logs" / "eval-rank0.log").exists()
    assert_clean(record, tmp_path, cli)


def test_work_before_the_clock_is_held_to_the_start_up_allowance(cli, tmp_path):
    """get_model "pretrains" for 45 s in the ranks: the track (tiny: 20 s allowance) ends it."""
    result = run_fixture(cli, "slow_get_model")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    allowance = record["track"]["startup_allowance_s"]
    assert record["status"] == "timeout" and "start-up took longer than the track's allowance" in record["reason"]
    assert record["steps"] is None and record["timings"]["kill_latency_s"] < record["track"]["shutdown_timeout_s"] + 2
    assert record["timings"]["launch_to_setup_s"] + allowance <= result.seconds
    assert_clean(record, tmp_path, cli)


def test_per_optimizer_schedules_and_gradient_clipping(cli, tmp_path):
    """lr_schedule returns one multiplier per optimizer (the second stays at 0: its parameter never
    moves), the harness clips the gradients to CONFIG['grad_clip'] and reports their norm; a schedule
    with the wrong number of multipliers is refused with the file and the fix."""
    import torch

    result = run_fixture(cli, "two_optimizers")
    assert result.code == 0, result.err
    run_dir, record = only_record(tmp_path / "runs")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert torch.count_nonzero(ckpt["model"]["bias"]) == 0, "the optimizer scheduled at 0 moved its parameter"
    assert record["config"]["grad_clip"] == 0.5
    norms = [float(r["grad_norm"]) for r in csv.DictReader((run_dir / "metrics.csv").open()) if r["grad_norm"]]
    assert norms and all(n > 0 for n in norms)

    bad = cli("run", str(FIXTURES / "two_optimizers"), "--track", str(TINY_TRACK), env={"TWO_OPTIMIZERS_BAD": "1"},
              runs_dir=tmp_path / "bad")
    assert bad.code == 1
    _, record = only_record(tmp_path / "bad")
    assert record["status"] == "invalid" and "lr_schedule returned 3 multipliers for 2 optimizer(s)" in record["reason"]
