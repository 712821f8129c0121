"""The open division: a team's own train.py under the harness's clock, scored like any run.

Pure parts (detection, [open] parsing, the starter kit's arguments, checkpoint normalisation) as
unit tests; the rest as real runs of tests/fixtures/open_modes through the CLI: the honest script on
2 ranks, and one run per failure the fixed loop is also tested for (on one rank where the failure is
not rank 1's).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import FIXTURES, TINY_TRACK, one_rank, only_record, processes_of_run, tiny_track_with
from harness.submission.contract import SubmissionError
from harness.submission.open_division import FIXED, OPEN, division_of, read_open_spec, script_argv

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)

# Scripts that must be killed (they hang, ignore the clock, or claim an end) are killed whatever the
# machine's load: their track's start-up allowance is shorter than tiny.toml's 20 s, so the test
# waits less for the same outcome.
KILLED_ALLOWANCE_S = 8.0
TINY_TOTAL_S = KILLED_ALLOWANCE_S + 4.0 + 3.0  # start-up allowance + budget + grace (tiny.toml), from the ranks' start
# Runs that end on their own use a track whose allowance holds on a loaded machine: the open division's
# one limit counts start-up (importing torch, the process group, DDP), which load stretches most.
ROOMY_TRACK = TINY_TRACK.with_name("tiny-open.toml")
ROOMY_TOTAL_S = 60.0 + 4.0 + 3.0


def open_submission(tmp_path: Path, mode: str, extra_toml: str = "") -> Path:
    folder = tmp_path / f"open_{mode}"
    shutil.copytree(FIXTURES / "open_modes", folder)
    (folder / "submission.toml").write_text(
        f'division = "open"\n[team]\nname = "open-{mode}"\n[open]\n{extra_toml}\n'
        f'[open.args]\nmode = "{mode}"\nbatch_size = 4\nseq_len = 32\n')
    return folder


# --------------------------------------------------------------------------- pure parts


def test_a_folder_with_train_py_and_no_submission_py_is_open(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "model.py").write_text("")
    assert division_of(tmp_path) == OPEN
    (tmp_path / "submission.py").write_text("")
    assert division_of(tmp_path) == FIXED  # submission.py is the fixed loop's, unless the toml says otherwise
    (tmp_path / "submission.toml").write_text('division = "open"\n')
    assert division_of(tmp_path) == OPEN
    (tmp_path / "submission.toml").write_text('division = "closed"\n')
    with pytest.raises(SubmissionError, match="division must be one of fixed, open"):
        division_of(tmp_path)


def test_open_spec_refuses_what_the_harness_owns_and_names_the_fix(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "model.py").write_text("")
    (tmp_path / "submission.toml").write_text('[open.args]\ntime_limit_min = 60\n')
    with pytest.raises(SubmissionError, match="sets 'time_limit_min', which the harness fills") as err:
        read_open_spec(tmp_path)
    assert "remove time_limit_min" in str(err.value)
    (tmp_path / "submission.toml").write_text('[open]\nmodel = "net.py"\n')
    with pytest.raises(SubmissionError, match="net.py: not found"):
        read_open_spec(tmp_path)
    (tmp_path / "submission.toml").write_text('[open]\nscrip = "train.py"\n')
    with pytest.raises(SubmissionError, match="unknown key"):
        read_open_spec(tmp_path)


def test_script_arguments_are_the_starter_kits_filled_from_the_track(tmp_path):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "model.py").write_text("")
    (tmp_path / "submission.toml").write_text('[open.args]\nn_layer = 12\ncompile = true\nseq_len = 512\n')
    argv = script_argv(read_open_spec(tmp_path), data_dir="/d", checkpoint_path="/c.pt", vocab_size=32768,
                       budget_s=600.0, seq_len=1024)
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs == {"--data_dir": "/d", "--checkpoint_path": "/c.pt", "--vocab_size": "32768",
                     "--time_limit_min": "10", "--n_layer": "12", "--compile": "true", "--seq_len": "512"}
    argv = script_argv(read_open_spec(tmp_path), data_dir="/d", checkpoint_path="/c.pt", vocab_size=8,
                       budget_s=4.0, seq_len=64, max_steps=7)
    pairs = dict(zip(argv[::2], argv[1::2]))
    assert pairs["--max_steps"] == "7" and pairs["--seq_len"] == "512"  # the team's seq_len wins over the track's
    assert float(pairs["--time_limit_min"]) * 60 == pytest.approx(4.0, abs=1e-3)


def test_team_checkpoints_are_normalised_and_bad_ones_named(tmp_path):
    import torch

    from harness.ranks.checkpoint import CheckpointError, normalize_team_checkpoint

    w = torch.randn(3, 3)
    torch.save({"step": 5, "model": {"module._orig_mod.table.weight": w}, "config": {"vocab_size": 3}}, tmp_path / "a.pt")
    found = normalize_team_checkpoint(tmp_path / "a.pt", tmp_path / "b.pt")
    saved = torch.load(tmp_path / "b.pt", weights_only=True)
    assert list(saved["model"]) == ["table.weight"] and torch.equal(saved["model"]["table.weight"], w)
    assert found == {"step": 5, "params": 9, "config": {"vocab_size": 3}, "prefixes_removed": True,
                     "tensors": {"table.weight": [0, 9]}}
    torch.save({"weights": {}}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match=r"must be a dict with a 'model' state dict.*got \['weights'\]"):
        normalize_team_checkpoint(tmp_path / "c.pt", tmp_path / "d.pt")
    (tmp_path / "e.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="does not load with torch.load"):
        normalize_team_checkpoint(tmp_path / "e.pt", tmp_path / "f.pt")


# --------------------------------------------------------------------------- real runs


def test_an_honest_script_is_clocked_and_scored_like_a_fixed_loop_run(cli, tmp_path):
    folder = open_submission(tmp_path, "ok")
    result = cli("run", str(folder), "--track", str(ROOMY_TRACK))
    assert result.code == 0, result.text
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok" and record["division"] == "open", record["reason"]
    assert record["val_loss"] < 5.0  # ln(256) = 5.55 untrained: the script's training reached the scoring
    assert record["eval"]["causality"]["causal"] and record["eval"]["causality"]["checked_batches"] >= 1
    assert record["throughput_source"] == "reported" and record["tokens"] == record["steps"] * 2 * 4 * 32
    assert record["launcher_train_time_s"] <= ROOMY_TOTAL_S
    # A tied embedding and output layer (the same tensor under two names in the state dict) and a buffer:
    # the parameters are the embedding's, counted once; FLOPs are the output layer's matmul, forward and backward.
    assert record["params"] == 256 * 64 and record["flops_per_token"] == 6 * 64 * 256
    assert any("prefixes were removed" in n for n in record["notes"])  # torch.compile's _orig_mod. keys
    assert not record["flagged"], record["flag_reason"]
    logs = "".join((run_dir / "logs" / f"rank{r}.log").read_text() for r in (0, 1))
    assert logs.count(f"HARNESS_RUN_ID={record['run_id']}") == 2  # the script ran on both ranks, as the run's
    assert "--data_dir" in logs and "--time_limit_min" in logs
    assert processes_of_run(record["run_id"]) == []
    rescore = cli("eval", str(run_dir), "--json")  # scored again from the record alone: the same figure
    assert rescore.code == 0, rescore.text
    assert f"{record['val_loss']:.6f}"[:6] in rescore.out


def test_a_script_whose_batches_come_from_a_dataloader_worker_trains_and_is_scored(cli, tmp_path):
    """num_workers > 0: each batch a worker returns crosses to the rank through a Unix socket Python's
    multiprocessing binds in the rank's temporary folder (its private folder's tmp/). Without sockets
    there the batch never arrives and the rank waits to the hard limit; with them it trains, on one rank,
    a few steps."""
    track = one_rank(tmp_path, base=ROOMY_TRACK)
    result = cli("run", str(open_submission(tmp_path, "dataloader")), "--track", str(track), "--max-steps", "5")
    _, record = only_record(tmp_path / "runs")
    assert result.code == 0 and record["status"] == "ok", record["reason"]
    assert record["steps"] == 5 and record["val_loss"] is not None
    assert processes_of_run(record["run_id"]) == [], "the DataLoader's worker outlived the run"


@pytest.mark.parametrize("mode, status, reason", [
    ("crash", "crashed", "boom in train.py"),
    ("crash_in_model", "crashed", "boom in model.py"),
    ("crash_recorded", "crashed", "boom in train.py under @record"),  # torch elastic's error file is writable
    ("hang", "timeout", "hard limit"),
    ("ignores_clock", "timeout", "hard limit"),
    ("claims_done", "timeout", "hard limit"),  # a reported end does not switch the limit off
    ("link_checkpoint", "invalid", "not a regular file"),
    ("no_checkpoint", "crashed", "without saving a checkpoint"),
    ("bad_checkpoint", "invalid", "does not load into get_model"),
    ("exit_code", "crashed", "exited with code 3"),
])
def test_the_failure_matrix_holds_for_open_division_scripts(cli, tmp_path, mode, status, reason):
    # killed either way (a short allowance) / must not be, even loaded (a roomy one)
    limits = {"startup_allowance_s": KILLED_ALLOWANCE_S} if status == "timeout" else {}
    base = TINY_TRACK if status == "timeout" else ROOMY_TRACK
    # crashes and the hang are rank 1's: two ranks; the others on one
    track = (tiny_track_with(tmp_path, base=base, **limits) if mode in ("crash", "crash_in_model", "crash_recorded", "hang")
             else one_rank(tmp_path, base=base, **limits))
    result = cli("run", str(open_submission(tmp_path, mode)), "--track", str(track))
    assert result.code == 1, result.text
    _, record = only_record(tmp_path / "runs")
    assert (record["status"], record["division"]) == (status, "open"), record["reason"]
    assert reason in record["reason"]
    if mode.startswith("crash"):  # the team's own innermost line, in the file where it is
        raised_in = {"crash": "train", "crash_in_model": "model", "crash_recorded": "train"}[mode]
        assert re.match(rf"rank 1: {raised_in}\.py:\d+: RuntimeError: boom in ", record["reason"]), record["reason"]
    assert record["val_loss"] is None
    if status == "timeout":  # killed on the launcher's clock, whatever the script's own limit or reports said
        assert record["startup_s"] + record["launcher_train_time_s"] <= TINY_TOTAL_S + 1.5
    assert processes_of_run(record["run_id"]) == [], "a process of the script outlived the run"


def test_a_script_that_trains_past_its_budget_and_saves_before_the_hard_limit_is_a_timeout(cli, tmp_path):
    """The open division's clock is as hard as the fixed loop's: a script that trains 6 s past its 4 s budget and
    saves well before the hard limit (start-up allowance + budget + grace) gained 6 s of training, `ok`, until
    its window was held to the budget. Its window (first forward to checkpoint saved) is more than the budget and
    the overrun bound (here 1 s for a last step and 1 s for the save): `timeout`, nothing scored."""
    track = one_rank(tmp_path, base=ROOMY_TRACK, startup_allowance_s=30.0, checkpoint_allowance_s=1.0,
                     overrun_allowance_s=1.0)
    result = cli("run", str(open_submission(tmp_path, "overruns")), "--track", str(track))
    assert result.code == 1, result.text
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "timeout", record["reason"]
    assert "past its 4 s budget" in record["reason"] and "open-division window" in record["reason"]
    check = record["window_check"]
    assert check["launcher_window_s"] > 4.0 + 6.0 - 1.0 and check["allowed_s"] == 2.0 and not check["ok"]
    assert record["val_loss"] is None


@pytest.mark.parametrize("mode", ["maps_checkpoint", "hides_checkpoint"])
def test_weights_written_through_a_mapping_after_the_save_hold_the_window_open_to_the_jobs_end(cli, tmp_path, mode):
    """A script that saves on time, then trains 6 s more and writes its weights into the saved file through a
    shared mapping: the file's ctime stays at the save (tmpfs never moves it for such writes), so its window
    ended there and the later weights were scored, `ok`. The launcher hashes each version of the file that
    stands still while the job runs, and again after it: the same version with other bytes holds the window open
    to the job's end, past the budget: `timeout`. The second red team's variant (hides_checkpoint) renamed its
    staging folder away while it saved and wrote, and asked for a write lease so that the launcher's reads would
    fail: the launcher watches the staging folder it held before the ranks started, and leases are refused."""
    track = one_rank(tmp_path, base=ROOMY_TRACK, startup_allowance_s=30.0, checkpoint_allowance_s=1.0,
                     overrun_allowance_s=1.0)
    result = cli("run", str(open_submission(tmp_path, mode)), "--track", str(track))
    assert result.code == 1, result.text
    run_dir, record = only_record(tmp_path / "runs")
    said = (run_dir / "logs" / "rank0.log").read_text()
    assert "MAPPED at " in said and (mode == "maps_checkpoint" or "LEASE refused: Operation not permitted" in said)
    assert record["status"] == "timeout", record["reason"]
    assert any("changed after the last change of the file the kernel recorded" in n for n in record["notes"])
    assert record["window_check"]["launcher_window_s"] > 4.0 + 6.0 - 1.0 and record["val_loss"] is None


def test_check_accepts_the_example_and_finds_a_syntax_error_in_the_script_before_any_run(cli, tmp_path):
    ok = cli("check", str(Path(__file__).parent.parent / "submissions" / "open_example"))
    assert ok.code == 0, ok.text
    assert "division          open" in ok.out and "--time_limit_min 0.5" in ok.out  # local: 30 s
    folder = open_submission(tmp_path, "ok")
    (folder / "train.py").write_text((folder / "train.py").read_text() + "\nif True\n    pass\n")
    bad = cli("check", str(folder))
    assert bad.code == 1
    assert "REJECTED" in bad.out and "train.py:" in bad.out and "syntax error" in bad.out


def test_a_checkpoint_that_unpacks_far_beyond_its_size_is_refused_unread(tmp_path):
    """torch.save writes its zip entries uncompressed: a file that would unpack to 1000x its size is a
    bomb aimed at the launcher's memory and disk, refused before any process loads it."""
    import zipfile

    from harness.launcher.run.open_run import normalize_in_own_process

    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data/0", b"\0" * (50 << 20))
    found = normalize_in_own_process(bomb, tmp_path / "out.pt", tmp_path / "log.txt")
    assert "unpacks to" in found["error"] and not (tmp_path / "out.pt").exists()


SHORT_POSITIONS_MODEL = '''
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:  # the starter kit's way: get_model(config) builds it with **config
    vocab_size: int
    seq_len: int


class ShortPositions(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.vocab_size)
        self.pos = nn.Embedding(cfg.seq_len, cfg.vocab_size)  # sized to the training length only

    def forward(self, idx, targets=None):
        logits = self.embed(idx) + self.pos(torch.arange(idx.size(1)))
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def get_model(config):
    return ShortPositions(Config(**config))
'''


def test_a_model_that_fails_at_the_evaluation_length_is_found_before_training(cli, tmp_path):
    # Trained at --seq_len 32, scored on tiny's 64-token windows: found after a whole slot, until now.
    guessed = open_submission(tmp_path / "guessed", "ok")
    (guessed / "model.py").write_text(SHORT_POSITIONS_MODEL)
    checked = cli("check", str(guessed), "--track", str(ROOMY_TRACK), "--json")
    assert checked.code == 0, checked.text  # a config the harness guessed never rejects: a warning
    report = json.loads(checked.out)
    before = report["before_training"]
    # the script's own arguments the model does not take (mode, batch_size) were left out of the guess
    assert before["ok"] is False and before["declared"] is False and before["config"] == {"vocab_size": 256,
                                                                                          "seq_len": 32}
    (warning,) = [w for w in report["warnings"] if "window of 64 tokens" in w]
    assert warning.startswith("model.py:") and "[open.config]" in warning

    declared = open_submission(tmp_path / "declared", "ok", extra_toml="config = { vocab_size = 256, seq_len = 32 }")
    (declared / "model.py").write_text(SHORT_POSITIONS_MODEL)
    rejected = cli("check", str(declared), "--track", str(ROOMY_TRACK))
    assert rejected.code == 1 and "REJECTED" in rejected.out and "window of 64 tokens" in rejected.out
    result = cli("run", str(declared), "--track", str(ROOMY_TRACK))
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "invalid" and "window of 64 tokens" in record["reason"], record["reason"]
    assert not (run_dir / "logs" / "rank0.log").exists(), "the script ran for a model that cannot be scored"


def test_an_honest_model_passes_the_check_before_training_with_its_arguments(cli):
    report = json.loads(cli("check", str(Path(__file__).parent.parent / "submissions" / "open_example"),
                            "--json").out)
    assert report["accepted"] and report["before_training"]["ok"], report.get("before_training")
    assert report["before_training"]["params"] == 425_984


def test_finishing_a_script_stops_an_idle_pool_and_waits_for_a_running_save():
    # torch.compile leaves an idle ThreadPoolExecutor worker (non-daemon): joined as is, it waits forever.
    # What Python's own exit does first (threading's atexit callbacks) tells it to stop; a thread still
    # working (an asynchronous checkpoint save) is waited for.
    import subprocess
    import sys

    code = (
        "import gc, threading, time, sys\n"
        "gc.disable()\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from harness.ranks.open_rank import finish_threads\n"
        "pool = ThreadPoolExecutor(1); pool.submit(int).result()\n"
        "saved = []\n"
        "threading.Thread(target=lambda: (time.sleep(0.5), saved.append(1))).start()\n"
        "finish_threads()\n"
        "print(saved, sorted(t.name for t in threading.enumerate()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1] ['MainThread']", out.stdout


def with_guessed_config_doing(tmp_path: Path, statement: str) -> Path:
    """The honest open_modes submission whose get_model runs `statement` for the config the harness guesses
    before training (the script's own config passes d_model; the guess has none)."""
    folder = open_submission(tmp_path, "ok")
    (folder / "model.py").write_text((FIXTURES / "open_modes" / "model.py").read_text() + (
        "\n\nimport os\n_build = get_model\n\n\ndef get_model(config):\n"
        "    if not config.get('d_model'):  # the guessed config\n"
        f"        {statement}\n"
        "    return _build(config)\n"))
    return folder


def test_a_check_with_a_guessed_config_that_kills_its_process_is_a_warning_not_a_rejection(cli, tmp_path):
    # The guessed config never rejects, even when what it builds hangs or kills the check process: what was
    # checked before it stands, and the end is a warning with the log's path.
    folder = with_guessed_config_doing(tmp_path, "os._exit(3)  # as an out-of-memory kill or a native crash ends it")
    checked = cli("check", str(folder), "--track", str(ROOMY_TRACK))
    assert checked.code == 0, checked.text
    assert "model.py's check before training: it ended the check process (exit code 3)" in checked.out


def test_the_parameter_count_is_the_checkpoints_distinct_tensors_under_the_models_parameter_names(tmp_path):
    # Counted by harness code from the checkpoint: what the sandboxed check says only selects names, so a
    # forged answer can never make the count exceed what the checkpoint really holds.
    import torch

    from harness.launcher.run.open_run import parameter_count
    from harness.ranks.checkpoint import normalize_team_checkpoint

    spec = importlib.util.spec_from_file_location("fixture_model", FIXTURES / "open_modes" / "model.py")
    fixture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixture)
    model = fixture.get_model({"vocab_size": 256, "d_model": 64})
    torch.save({"model": model.state_dict(), "config": {}, "step": 2**70}, tmp_path / "team.pt")
    found = normalize_team_checkpoint(tmp_path / "team.pt", tmp_path / "ours.pt")
    assert found["step"] is None  # a step the tables could not hold is no step
    names = [name for name, _ in model.named_parameters()]
    assert parameter_count(found, names) == 256 * 64  # tied: one tensor under wte and lm_head; the buffer is not one
    assert parameter_count(found, names * 3 + ["lm_head.weight", "scale", "nonsense"]) == 256 * 64 + 1
    assert parameter_count(found, "everything") == 256 * 64 + 1  # no usable names: every distinct tensor, once


def test_a_warning_made_of_team_text_cannot_forge_lines_on_the_terminal(cli, tmp_path):
    # The red team's case: a model that raises, for the guessed config only, a message of terminal escapes
    # and line breaks that would have printed "val_loss 1.2345" over the check's own lines.
    folder = with_guessed_config_doing(
        tmp_path, "raise RuntimeError('\\x1b[3A\\x1b[2Kval_loss 1.2345\\nACCEPTED: forged\\r' + 'x' * 100000)")
    checked = cli("check", str(folder), "--track", str(ROOMY_TRACK))
    assert checked.code == 0, checked.text
    assert "\x1b" not in checked.out and "\r" not in checked.out
    lines = checked.out.splitlines()
    assert [line for line in lines if line.startswith("ACCEPTED")] == [lines[-1]], lines[-3:]
    (warning,) = [line for line in lines if "val_loss 1.2345" in line]
    assert "\\x1b[3A" in warning and len(warning) < 1200  # shown as text, capped


def test_a_submission_toml_the_harness_cannot_carry_is_invalid_not_a_harness_error(tmp_path):
    # A TOML date in [open.config] once crashed the launcher ("harness error: TypeError ... datetime"), and
    # arrays nested past the parser's depth escaped as a RecursionError: both are the team's file, named.
    folder = tmp_path / "odd"
    shutil.copytree(FIXTURES / "open_modes", folder)
    (folder / "submission.toml").write_text('division = "open"\n[open.config]\nreleased = 1979-05-27T07:32:00Z\n')
    with pytest.raises(SubmissionError, match=r"\[open\] config must be a table of strings, numbers"):
        read_open_spec(folder)
    (folder / "submission.toml").write_text('division = "open"\nx = ' + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SubmissionError, match="is not valid TOML: RecursionError"):
        division_of(folder)
