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
    "harness_version", "team", "run_id", "started_at", "ended_at", "hostname", "launcher_pid",
]


MAX_STEPS = 100  # a step-bounded budget: what the baseline learns must not depend on the machine's speed


@pytest.fixture(scope="module")
def baseline_run(tmp_path_factory, cache_dir):
    """The README's command, `harness run submissions/baseline` on the local track, bounded by steps
    (--max-steps, with a budget whose hard limit a slow or loaded machine cannot reach), shared below.
    As a newcomer runs it: records in the default ./runs, a path relative to the working directory."""
    import os
    import subprocess
    import sys

    work = tmp_path_factory.mktemp("e2e")
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_RUNS_DIR"}
    env["HARNESS_CACHE_DIR"] = str(cache_dir)
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(ROOT / "submissions" / "baseline"),
                           "--seed", "5", "--max-steps", str(MAX_STEPS), "--budget-s", "400"],
                          capture_output=True, text=True, env=env, cwd=work, timeout=900)
    run_dir, record = only_record(work / "runs")
    return proc, run_dir, record, env, work


@pytest.mark.slow
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


def test_the_local_tracks_check_catches_a_one_percent_peeker_with_95_percent_probability(baseline_run):
    """299 of the local track's 512 evaluation rows are re-run with a secret cut (10 of its 16 batches), so a
    model that looks ahead at 1% of positions is caught with at least 95% probability; the record says
    the fraction its own check catches."""
    _, _, record, _, _ = baseline_run
    causality = record["eval"]["causality"]
    assert causality["causal"] is True and causality["rows_checked"] >= 299 and causality["checked_batches"] == 10
    assert causality["detects_fraction_95"] <= 0.01
    assert 1 - (1 - 0.01) ** causality["rows_checked"] >= 0.95


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


@pytest.mark.slow
def test_the_clock_stops_before_the_budget(tiny_run):
    """No step starts past the deadline, and the launcher's own measurement of the window agrees with
    the ranks' within the tolerance the harness applies."""
    from harness.launcher.run.assemble import clock_tolerance_s

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
    for rank in (0, 1):  # each rank's own output, under its own name
        text = (run_dir / "logs" / f"rank{rank}.log").read_text()
        assert f"[harness] rank {rank}: training starts" in text and f"rank {1 - rank}:" not in text, rank
    assert "[harness] world 2 on cpu" in (run_dir / "logs" / "rank0.log").read_text()
    assert "torch.distributed.elastic" in (run_dir / "logs" / "launcher.log").read_text()  # torch elastic's own messages
    for log in ("eval-rank0.log", "preflight.log"):
        assert (run_dir / "logs" / log).is_file(), log
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert rows and list(rows[0]) == ["step", "train_time_s", "train_loss", "lr_scale", "tokens", "tokens_per_s",
                                      "grad_norm"]
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] == record["steps"]
    assert not (run_dir / "staging").exists()
    # Every report of an honest run fits its schema, and nothing flags it (harness/launcher/control/reports.py).
    assert "malformed_reports" not in record and "refused_reports" not in record and not record["flagged"]


def test_nothing_of_the_run_is_left_running(baseline_run):
    _, _, record, _, _ = baseline_run
    assert processes_of_run(record["run_id"]) == []


@pytest.mark.slow
def test_eval_gives_the_same_figure_for_one_and_two_ranks(baseline_run):
    import subprocess
    import sys

    _, run_dir, record, env, work = baseline_run
    figures = []
    for n in (1, 2):  # the run's folder as a user types it: relative to where they are
        proc = subprocess.run([sys.executable, "-m", "harness", "eval", str(run_dir.relative_to(work)), "--nproc-per-node", str(n),
                               "--json"], capture_output=True, text=True, env=env, cwd=work, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["world_size"] == n and out["val_tokens"] == record["track"]["data"]["val_tokens"]
        figures.append(out["val_loss"])
    assert figures[0] == pytest.approx(figures[1], abs=1e-5)
    assert figures[0] == pytest.approx(record["val_loss"], abs=1e-5)


@pytest.mark.slow
def test_a_config_typo_is_in_the_run_records_warnings(cli, tmp_path):
    from conftest import FIXTURES, quick_track

    result = cli("run", str(FIXTURES / "config_typo"), "--track", str(quick_track(tmp_path)), "--no-leaderboard")
    assert result.code == 0, result.err
    _, record = only_record(tmp_path / "runs")
    (warning,) = record["warnings"]
    assert "'learnig_rate'" in warning and "did you mean 'learning_rate'?" in warning
    assert f"WARNING    {warning}" in result.out and f"warning: {warning}" in result.err


@pytest.mark.slow
def test_compiled_submission_runs_and_saves_the_plain_module(cli, tmp_path):
    """torch.compile compiles in the first step, on the clock (13-23 s on these CPUs, cold cache
    included): the compile step is the slow one, and the checkpoint holds the plain module's keys.
    Three steps, not a budget: the compile alone is longer than any budget the suite can afford, and a
    first step that ends past the budget is a timeout (test_clock.py: check_window). (That the stop
    rule leaves the compile step out of its estimate is tests/test_clock.py's too.) On one rank: each
    rank compiles on its own."""
    from conftest import FIXTURES, one_rank

    result = cli("run", str(FIXTURES / "compiled"), "--track", str(one_rank(tmp_path, max_steps=3)), "--grace-s", "90")
    assert result.code == 0, result.err
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok" and record["steps"] == 3
    assert record["max_step_s"] > 5 * record["median_step_s"]  # the compile step, left out of the median
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert list(ckpt["model"]) == ["table.weight"]


@pytest.mark.slow
def test_a_track_may_train_a_compiled_model_eagerly_and_says_so(cli, tmp_path):
    """A team's files that return torch.compile(model) get a laptop result unchanged where the track says
    compile = "eager" (local does): the plain module trains (no compile step), the record says so, and the
    checkpoint is the plain module's, as it would be compiled."""
    from conftest import FIXTURES, one_rank

    folder = tmp_path / "returns_compiled"
    folder.mkdir()
    source = (FIXTURES / "compiled" / "submission.py").read_text().replace("COMPILE = True\n", "")
    source = source.replace("    return Bigram(config[\"vocab_size\"])", "    import torch\n"
                            "    return torch.compile(Bigram(config[\"vocab_size\"]))")
    (folder / "submission.py").write_text(source)
    result = cli("run", str(folder), "--track", str(one_rank(tmp_path, max_steps=3, compile="eager")))
    assert result.code == 0, result.err
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok" and record["steps"] == 3 and record["compiled"] is False
    assert record["track"]["compile"] == "eager"
    assert record["compile_skipped"] is True
    assert any("trained its plain module" in note for note in record["notes"]), record["notes"]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert list(ckpt["model"]) == ["table.weight"]


# ------------------------------------------------------------------ the event's data path: shard files
SHARD_TRACK = """\
name = "shards"
description = "Tests: the event's data layout (shard files) at the smallest scale"
nproc_per_node = 2
backend = "gloo"
device = "cpu"
dtype = "float32"  # the figure is recomputed below in float32
budget_s = 60.0
grace_s = 30.0
clock_start = "model_build"
startup_timeout_s = 120.0
startup_allowance_s = 30.0
save_allowance_s = 30.0
collective_timeout_s = 30.0
shutdown_timeout_s = 2.0
log_interval_s = 0.5
comm_probe_steps = 2
max_steps = 30  # steps, not seconds: what is learned does not depend on the machine's speed

[data]
source = "shards"
vocab_size = 256
val_tokens = 4096
train = "train_*.bin"
val = "val_*.bin"

[eval]
seq_len = 64
batch_size = 16
nproc_per_node = 1
timeout_s = 120.0
"""
BUILD_SLEEP_S = 2.5  # linear_lm's get_model in the ranks: on the clock with clock_start = "model_build"


def make_token_files(folder, seed: int = 0):
    """The event's layout: three raw uint16 train shards and one llm.c-headered (uint16) val shard of a
    noisy affine bigram source (next = 5 * token + 1 + noise, noise in 0..3), learnable by linear_lm."""
    import numpy as np

    from harness.data.shards import write_shard

    rng = np.random.default_rng(seed)

    def tokens(n):
        noise = rng.integers(0, 4, n)
        out = [int(rng.integers(256))]
        for i in range(1, n):
            out.append((5 * out[-1] + 1 + int(noise[i])) % 256)
        return np.array(out, dtype=np.int64)

    folder.mkdir(parents=True, exist_ok=True)
    for k in range(3):
        write_shard(folder / f"train_{k:04d}.bin", tokens(20_000), "raw_uint16")
    write_shard(folder / "val_0000.bin", tokens(5_000), "llmc_uint16")
    return folder


@pytest.fixture(scope="module")
def shard_runs(tmp_path_factory, cache_dir):
    """`harness run --repeat 2` of linear_lm on a shard-file track (--data-root), shared below."""
    import os
    import shutil
    import subprocess
    import sys
    import time

    from conftest import FIXTURES, run_dirs

    work = tmp_path_factory.mktemp("shards")
    data = make_token_files(work / "data")
    (work / "shards.toml").write_text(SHARD_TRACK)
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(work / "runs")}
    sub = work / "linear_lm"  # a copy that sleeps BUILD_SLEEP_S in get_model
    shutil.copytree(FIXTURES / "linear_lm", sub)
    (sub / "build_sleep_s").write_text(str(BUILD_SLEEP_S))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(sub), "--track",
                           str(work / "shards.toml"), "--data-root", str(data), "--repeat", "2"],
                          capture_output=True, text=True, env=env, cwd=work, timeout=900)
    wall_s = time.monotonic() - t0
    records = sorted(((d, json.loads((d / "run.json").read_text())) for d in run_dirs(work / "runs")),
                     key=lambda dr: dr[1]["seed"])
    return proc, records, wall_s, data, env, work


def linear_lm_val_loss(run_dir, val_file, val_tokens: int, seq_len: int) -> float:
    """The figure recomputed here, without the harness and without the submission's code: logits =
    emb[x] @ head.T from checkpoint.pt, the first val_tokens + 1 tokens after the llm.c header."""
    import numpy as np

    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    emb, head = ckpt["model"]["emb.weight"], ckpt["model"]["head.weight"]
    tokens = torch.from_numpy(np.fromfile(val_file, dtype=np.uint16)[512:].astype(np.int64))[: val_tokens + 1]
    x, y = tokens[:-1].view(-1, seq_len), tokens[1:].view(-1, seq_len)
    logits = emb[x] @ head.t()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").double().item() / val_tokens


@pytest.mark.slow
def test_shard_files_train_and_are_scored_as_computed_independently(shard_runs):
    """Raw train shards and a headered val shard, found under --data-root, through `harness run --repeat 2`:
    consecutive seeds, both ok, the summary's mean, and each figure equal to one computed here."""
    import math
    import re

    proc, records, _, data, _, _ = shard_runs
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r["seed"] for _, r in records] == [1, 2] and all(r["status"] == "ok" for _, r in records)
    run_dir, r = records[0]
    assert r["data"]["train_shards"] == ["train_0000.bin", "train_0001.bin", "train_0002.bin"]
    assert r["data"]["format"] == "raw_uint16" and r["data"]["train_tokens"] == 60_000
    assert records[1][1]["data_fingerprint"] == r["data_fingerprint"]
    for d, rec in records:
        assert rec["val_loss"] == pytest.approx(linear_lm_val_loss(d, data / "val_0000.bin", 4096, 64), abs=1e-5)
        assert rec["val_loss"] < math.log(256) - 0.5, "it learned nothing from the train shards"
    assert records[0][1]["val_loss"] != records[1][1]["val_loss"], "two seeds, the same run"
    mean = re.search(r"2 runs \(seeds 1\.\.2\): 2 ok, val_loss mean (\d+\.\d+), (\d+\.\d+)–(\d+\.\d+) \(min–max\)",
                     proc.stdout)
    assert mean, proc.stdout[-2000:]
    assert float(mean.group(1)) == pytest.approx((records[0][1]["val_loss"] + records[1][1]["val_loss"]) / 2, abs=1e-4)


def test_the_record_holds_the_measured_figures(shard_runs):
    """The docs' list of what every run records (docs/leaderboard.md), read from a real run."""
    import psutil

    proc, records, wall_s, _, _, _ = shard_runs
    _, r = records[0]
    assert r["flops_per_token"] == 6 * 16 * 256 and r["flops_method"] == "meta"  # head: 2DV forward, 4DV backward
    assert r["mfu"] is None  # a CPU: no peak known, none invented
    assert r["tokens_per_s_per_device"] == pytest.approx(r["tokens_per_s"] / r["world_size"])
    assert 0.1 < r["peak_mem_gib"] < psutil.virtual_memory().total / 2**30  # a process that imported torch
    s = r["comm_probe"]
    assert s["steps"] == 2
    assert r["comm_overlap_efficiency"] == pytest.approx(s["compute_step_s"] / s["synced_step_s"])
    assert s["efficiency_min"] <= r["comm_overlap_efficiency"] <= s["efficiency_max"]
    assert 0.0 <= r["data_wait_s"] <= r["train_time_s"]
    t = r["timings"]
    assert t["train_s"] == pytest.approx(r["launcher_train_time_s"]) and t["startup_s"] == pytest.approx(r["startup_s"])
    # The check runs while the ranks start and wait for its word (harness/launcher/run/check_phase.py): inside the
    # time from launch to the word, which is inside the time from launch to the first step.
    assert t["preflight_s"] <= t["launch_to_go_s"] <= t["launch_to_train_s"]
    phases = t["launch_to_train_s"] + t["train_s"] + t["save_and_teardown_s"] + t["eval_s"]
    assert phases <= t["total_s"]
    # Two runs in one command: their totals together fit in its wall time (each alone need not fit in half
    # of it: the runs of a --repeat differ in length).
    assert sum(rec["timings"]["total_s"] for _, rec in records) <= wall_s


def test_clock_start_model_build_puts_get_model_on_the_clock(shard_runs):
    """clock_start = "model_build": get_model's 2.5 s are training time, measured by the ranks and by
    the launcher, and not the team's start-up."""
    _, records, _, _, _, _ = shard_runs
    for run_dir, r in records:
        assert r["track"]["clock_start"] == "model_build"
        first = next(csv.DictReader((run_dir / "metrics.csv").open()))
        assert float(first["train_time_s"]) >= BUILD_SLEEP_S  # before the first step, already on the clock
        assert r["train_time_s"] >= BUILD_SLEEP_S and r["launcher_train_time_s"] >= BUILD_SLEEP_S
        assert r["startup_s"] < BUILD_SLEEP_S


@pytest.mark.slow
def test_eval_of_a_shard_run_and_its_refusals(shard_runs, tmp_path):
    """`harness eval` re-scores with the run's data (--data-root), at another number of ranks; it refuses
    data whose fingerprint differs and a checkpoint that changed after training."""
    import shutil
    import subprocess
    import sys

    import numpy as np

    _, records, _, data, env, work = shard_runs
    run_dir, r = records[0]

    def harness_eval(target, root):
        return subprocess.run([sys.executable, "-m", "harness", "eval", str(target), "--data-root", str(root),
                               "--nproc-per-node", "2", "--json"], capture_output=True, text=True, env=env, cwd=work,
                              timeout=300)

    same = harness_eval(run_dir, data)
    assert same.returncode == 0, same.stderr[-2000:]
    out = json.loads(same.stdout)
    assert out["world_size"] == 2 and out["val_tokens"] == 4096
    assert out["val_loss"] == pytest.approx(r["val_loss"], abs=1e-6)

    other = tmp_path / "other"
    shutil.copytree(data, other)
    val = np.fromfile(other / "val_0000.bin", dtype=np.uint16)
    val[600] = (int(val[600]) + 1) % 256  # one token of the val shard
    val.tofile(other / "val_0000.bin")
    refused = harness_eval(run_dir, other)
    assert refused.returncode == 2 and "is not the data this run used" in refused.stderr, refused.stderr[-2000:]

    changed = tmp_path / "runs" / "shards" / "linear_lm" / r["run_id"]
    shutil.copytree(run_dir, changed)
    ckpt = torch.load(changed / "checkpoint.pt", weights_only=True)
    ckpt["model"]["head.weight"][0, 0] += 1.0
    torch.save(ckpt, changed / "checkpoint.pt")
    tampered = harness_eval(changed, data)
    assert tampered.returncode == 1, tampered.stdout + tampered.stderr[-2000:]
    assert "the checkpoint was changed after training" in tampered.stdout + tampered.stderr


@pytest.mark.parametrize("spoil, message", [
    ("token", r"token id 300 >= vocab_size 256"),
    ("header", r"val_0000.bin: header says 5000 tokens but the file holds 4000"),
    ("glob", r"train globs match validation file.*val_0000.bin"),
])
def test_bad_shard_files_are_refused_before_anything_runs(cli, tmp_path, spoil, message):
    """A setup error (exit 2, no record) that names the file: a token outside the vocabulary, a header
    that disagrees with the file's size, a train glob that matches the val shard."""
    import re

    import numpy as np

    from conftest import FIXTURES
    from harness.data.shards import HEADER_BYTES

    data = make_token_files(tmp_path / "data")
    track = SHARD_TRACK
    if spoil == "token":
        tokens = np.fromfile(data / "train_0001.bin", dtype=np.uint16)
        tokens[0] = 300
        tokens.tofile(data / "train_0001.bin")
    elif spoil == "header":
        with open(data / "val_0000.bin", "r+b") as fh:
            fh.truncate(HEADER_BYTES + 4000 * 2)
    else:
        track = track.replace('train = "train_*.bin"', 'train = "*.bin"')
    (tmp_path / "shards.toml").write_text(track)
    result = cli("run", str(FIXTURES / "linear_lm"), "--track", str(tmp_path / "shards.toml"), "--data-root", str(data))
    assert result.code == 2 and re.search(message, result.err), result.err[-2000:]
    if spoil == "token":
        assert "train_0001.bin" in result.err
    assert not (tmp_path / "runs").exists(), "a refused run must leave no record"
