"""`harness run` end to end through the real CLI: 2 gloo ranks, a real clock, a real evaluation."""

import csv
import json

import pytest
import torch

from conftest import ROOT, only_record, processes_of_run
from harness.submission.contract import submission_sha256

REQUIRED = [
    "status", "reason", "val_loss", "loss_floor", "train_loss", "steps", "tokens", "budget_s", "train_time_s",
    "launcher_train_time_s", "tokens_per_s", "params", "seed", "world_size", "nnodes", "device_name",
    "torch_version", "submission_sha256", "data_fingerprint", "track", "overrides", "official",
    "harness_version", "team", "run_id", "started_at", "ended_at",
]


MAX_STEPS = 100  # a step-bounded budget: what the baseline learns must not depend on the machine's speed


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory, cache_dir):
    """The README's command, `harness run submissions/baseline` on the local track, bounded by steps
    (--max-steps, with a budget whose hard limit a slow or loaded machine cannot reach), shared below."""
    import os
    import subprocess
    import sys

    work = tmp_path_factory.mktemp("e2e")
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(work / "runs")}
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(ROOT / "submissions" / "baseline"),
                           "--seed", "5", "--max-steps", str(MAX_STEPS), "--budget-s", "400"],
                          capture_output=True, text=True, env=env, cwd=work, timeout=900)
    run_dir, record = only_record(work / "runs")
    return proc, run_dir, record, env, work


def test_run_ends_ok_with_every_record_field(baseline_run):
    proc, run_dir, record, _, _ = baseline_run
    assert proc.returncode == 0, proc.stderr
    assert record["status"] == "ok" and record["reason"] == ""
    missing = [k for k in REQUIRED if k not in record or (record[k] is None and k != "reason")]
    assert not missing, f"run.json lacks {missing}"
    assert record["world_size"] == 2 and record["nnodes"] == 1 and record["seed"] == 5
    assert record["team"] == "baseline" and record["official"] is False
    assert record["overrides"] == {"max_steps": {"track": 0, "run": MAX_STEPS}, "budget_s": {"track": 30.0, "run": 400.0}}
    assert record["precision"] in ("bfloat16", "float32") and record["precision_reason"].startswith("auto: ")
    assert record["track"]["name"] == "local" and record["torch_version"] == torch.__version__
    assert run_dir.parts[-3:] == ("local", "baseline", record["run_id"])
    versions = record["versions"]
    assert versions["torch"] == torch.__version__ and versions["numpy"] and versions["python"]
    assert versions["harness"] == record["harness_version"] and "cuda" in versions and "nccl" in versions
    assert (versions["harness_git_commit"] is not None) == (ROOT / ".git").exists()
    assert record["machine"]["cores"] >= 1 and record["warnings"] == []
    assert record["comm_overlap_efficiency"] > 0 and record["comm_probe"]["steps"] == 4
    assert "scaling_efficiency" not in record


def test_baseline_learns_well_below_the_unigram_entropy(baseline_run):
    _, _, record, _, _ = baseline_run
    # The unigram entropy is what a model that ignores context scores; the baseline must use context.
    assert record["loss_floor"] < record["val_loss"] < record["unigram_entropy"] - 2.0
    assert record["loss_gap"] == pytest.approx(record["val_loss"] - record["loss_floor"])


def test_the_log_gets_one_line_per_phase(baseline_run):
    """Not a terminal: each phase once, then one line per progress report (never the same line twice)."""
    proc, _, record, _, _ = baseline_run
    lines = proc.stderr.splitlines()
    for phase in ("checking the submission", "starting ranks", "training done", "evaluating on"):
        assert sum(line.startswith(phase) for line in lines) == 1, (phase, proc.stderr)
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == len(set(steps)) and 1 <= len(steps) <= record["steps"]


def test_a_step_bounded_run_trains_exactly_its_steps(baseline_run):
    _, _, r, _, _ = baseline_run
    assert r["steps"] == MAX_STEPS and r["tokens"] == r["steps"] * r["tokens_per_step"]
    assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["train_time_s"])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, cache_dir):
    """A time-bounded run of the bigram fixture on 2 ranks (track `tiny`: 4 s), shared below."""
    import os
    import subprocess
    import sys

    from conftest import FIXTURES, TINY_TRACK

    work = tmp_path_factory.mktemp("tiny")
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(work / "runs")}
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK)],
                          capture_output=True, text=True, env=env, cwd=work, timeout=600)
    assert proc.returncode == 0, proc.stderr
    run_dir, record = only_record(work / "runs")
    return run_dir, record, work


def test_the_clock_stops_before_the_budget(tiny_run):
    """No step starts past the deadline, and the launcher's own measurement of the window agrees with
    the ranks' within the tolerance the harness applies."""
    from harness.launcher.assemble import clock_tolerance_s

    _, r, _ = tiny_run
    assert r["steps"] > 3 and r["tokens"] == r["steps"] * r["tokens_per_step"]
    assert r["last_step_start_s"] < r["budget_s"], "a step started after the deadline"
    assert r["train_time_s"] <= r["budget_s"] + r["max_step_s"]
    assert abs(r["launcher_train_time_s"] - r["train_time_s"]) <= clock_tolerance_s(r["budget_s"])
    assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["train_time_s"])
    assert not r["flagged"]


def test_two_ranks_agree_on_time_loss_and_weights(tiny_run):
    """The default schedule's warm-up and decay are driven by time: every rank sets the same lr at every
    step, so the replicas end identical; the recorded train loss is the mean over all ranks of the
    last log interval, the figure of metrics.csv's last row; each rank draws its own random numbers
    after the model is built; the team's start-up is recorded and on the leaderboard."""
    run_dir, r, work = tiny_run
    assert r["replicas_identical"] is True, r["notes"]
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert float(rows[-1]["train_loss"]) == pytest.approx(r["train_loss"], rel=1e-12)
    assert int(rows[-1]["step"]) == r["steps"]
    draws = [next(line for line in (run_dir / "logs" / f"rank{k}.log").read_text().splitlines()
                  if line.startswith("FIRST-DRAW")) for k in (0, 1)]
    assert draws[0] != draws[1], "the ranks drew the same random numbers (dropout masks would be equal)"
    assert 0 < r["startup_s"] < r["track"]["startup_allowance_s"]
    board = list(csv.DictReader((work / "leaderboard" / "tiny.csv").open()))
    assert float(board[0]["startup_s"]) == pytest.approx(r["startup_s"])


def test_record_directory_is_self_contained(baseline_run):
    _, run_dir, record, _, _ = baseline_run
    assert submission_sha256(run_dir / "submission") == record["submission_sha256"]
    assert submission_sha256(ROOT / "submissions" / "baseline") == record["submission_sha256"]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert set(ckpt) == {"config", "model", "step", "tokens"}
    assert ckpt["step"] == record["steps"] and ckpt["config"]["vocab_size"] == 256
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ckpt["model"]), "a wrapper leaked into the state dict"
    for log in ("rank0.log", "rank1.log", "eval-rank0.log", "launcher.log", "preflight.log"):
        assert (run_dir / "logs" / log).is_file(), log
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert rows and list(rows[0]) == ["step", "train_time_s", "train_loss", "lr_scale", "tokens", "tokens_per_s",
                                      "grad_norm"]
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] == record["steps"]
    assert not (run_dir / "staging").exists()


def test_nothing_of_the_run_is_left_running(baseline_run):
    _, _, record, _, _ = baseline_run
    assert processes_of_run(record["run_id"]) == []


def test_eval_gives_the_same_figure_for_one_and_two_ranks(baseline_run):
    import subprocess
    import sys

    _, run_dir, record, env, work = baseline_run
    figures = []
    for n in (1, 2):
        proc = subprocess.run([sys.executable, "-m", "harness", "eval", str(run_dir), "--nproc-per-node", str(n),
                               "--json"], capture_output=True, text=True, env=env, cwd=work, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["world_size"] == n and out["val_tokens"] == record["track"]["data"]["val_tokens"]
        figures.append(out["val_loss"])
    assert figures[0] == pytest.approx(figures[1], abs=1e-5)
    assert figures[0] == pytest.approx(record["val_loss"], abs=1e-5)


def test_a_config_typo_is_in_the_run_records_warnings(cli, tmp_path):
    from conftest import FIXTURES, TINY_TRACK

    result = cli("run", str(FIXTURES / "config_typo"), "--track", str(TINY_TRACK), "--max-steps", "3",
                 "--no-leaderboard")
    assert result.code == 0, result.err
    _, record = only_record(tmp_path / "runs")
    (warning,) = record["warnings"]
    assert "'learnig_rate'" in warning and "did you mean 'learning_rate'?" in warning
    assert f"WARNING    {warning}" in result.err and f"warning: {warning}" in result.err


def test_compiled_submission_runs_and_saves_the_plain_module(cli, tmp_path):
    """torch.compile compiles in the first step, on the clock (17-23 s on these CPUs, cold cache
    included): with a grace long enough for it the run ends ok, the compile step is the slow one,
    and the checkpoint holds the plain module's keys. (That the stop rule leaves the compile step
    out of its estimate is tests/test_clock.py's.)"""
    from conftest import FIXTURES, TINY_TRACK

    result = cli("run", str(FIXTURES / "compiled"), "--track", str(TINY_TRACK), "--budget-s", "4",
                 "--grace-s", "90")
    assert result.code == 0, result.err
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok" and record["steps"] >= 1
    assert record["last_step_start_s"] < record["budget_s"]  # no step started after the deadline
    assert record["train_time_s"] <= record["budget_s"] + record["max_step_s"]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert list(ckpt["model"]) == ["table.weight"]
