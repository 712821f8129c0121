"""Around the sandbox: every channel from team code to the harness that is not the scoring path
(docs/rules.md, "Every door from team code to the harness"). Each test runs a hostile submission of
tests/fixtures/ through the real CLI and asserts that it is caught or gains nothing."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, TINY_TRACK, one_rank, only_record, quick_track

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _record(runs: Path, team: str) -> tuple[Path, dict]:
    (path,) = (runs / "tiny" / team).glob("*/run.json")
    return path.parent, json.loads(path.read_text())


def _copy_fixture(name: str, dest: Path) -> Path:
    import shutil

    shutil.copytree(FIXTURES / name, dest / name)
    return dest / name


# ----------------------------------------------------------------------------- the submission folder


@pytest.mark.parametrize("entry", ["link to a file", "link to a folder", "fifo"])
def test_a_submission_folder_that_holds_anything_but_regular_files_is_invalid(cli, tmp_path, entry):
    """A link to where validation data lies would make it the team's own file once copied; a FIFO would
    block the launcher that opens it. Nothing of either is read: the run is invalid, naming the entry."""
    sub = _copy_fixture("linked_data", tmp_path)
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "val.bin").write_bytes(b"SECRET-TOKENS" * 100)
    if entry == "link to a file":
        os.symlink(secret / "val.bin", sub / "corpus.bin")
        name = "corpus.bin"
    elif entry == "link to a folder":
        (sub / "data").mkdir()
        os.symlink(secret, sub / "data" / "shards")
        name = "data/shards"
    else:
        os.mkfifo(sub / "corpus.bin")
        name = "corpus.bin"
    result = cli("run", str(sub), "--track", str(quick_track(tmp_path)), timeout=120)
    assert result.code == 1
    run_dir, record = _record(tmp_path / "runs", "linked_data")
    assert record["status"] == "invalid", record["reason"]
    assert record["reason"].startswith(f"{name}: is a ") and "regular files only" in record["reason"]
    copied = [p for p in (run_dir / "submission").rglob("*") if p.is_file()] if (run_dir / "submission").exists() else []
    assert not any(b"SECRET-TOKENS" in p.read_bytes() for p in copied)


# ----------------------------------------------------------------------------- stores and reports


def test_a_rank_that_writes_pickles_into_the_rendezvous_store_runs_nothing_in_the_launcher(cli, tmp_path):
    """A rank has TCP and the store's address: it writes, under the keys torch elastic's c10d backend
    keeps its pickled state in, a pickle that leaves a file when loaded. The launcher's rendezvous keeps
    no pickled state: no process ever loads it, and the run is scored as the bigram it is."""
    track = one_rank(tmp_path, startup_allowance_s=40.0)  # it scans ports and waits in get_model: start-up
    result = cli("run", str(FIXTURES / "store_writer"), "--track", str(track), timeout=180)
    run_dir, record = _record(tmp_path / "runs", "store_writer")
    mark = Path(f"/tmp/harness-door-store-{record['run_id']}")
    try:
        assert not mark.exists(), f"a process loaded the rank's pickle: {mark.read_text()}"
        assert re.search(r"STORE-WRITER wrote [1-9]\d* keys", (run_dir / "logs" / "rank0.log").read_text())  # it reached a store
        assert result.code == 0 and record["status"] == "ok", record["reason"]
    finally:
        mark.unlink(missing_ok=True)


# ----------------------------------------------------------------------------- the clock's edges and the checkpoint


def test_a_last_step_held_open_past_the_budget_is_a_timeout(cli, tmp_path):
    """late_step trains on for 3 s inside the forward that starts just before the end of its 4 s budget:
    the stop rule cannot see inside a step, but the launcher's window ends 2-3 s late, far more than two
    median steps or the track's 1 s: a timeout, not scored."""
    result = cli("run", str(FIXTURES / "late_step"), "--track", str(one_rank(tmp_path, grace_s=20.0)), timeout=180)
    assert result.code == 1
    run_dir, record = _record(tmp_path / "runs", "late_step")
    assert "LATE-STEP held its last step open" in (run_dir / "logs" / "rank0.log").read_text()
    assert record["status"] == "timeout" and "a step held open past the clock" in record["reason"], record["reason"]
    check = record["window_check"]
    assert check["ok"] is False and check["over_s"] > 1.5 and check["allowed_s"] == pytest.approx(1.0)
    assert record["val_loss"] is None and not (run_dir / "checkpoint.pt").exists()


def test_an_honest_window_ends_within_its_bound(cli, tmp_path):
    """The same tiny track, an honest bigram on two ranks: the window check passes and says by how much."""
    result = cli("run", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK), timeout=180)
    assert result.code == 0, result.err
    _, record = _record(tmp_path / "runs", "ok_bigram")
    assert record["status"] == "ok" and record["window_check"]["ok"] is True and not record["flagged"]
    assert record["window_check"]["over_s"] < record["window_check"]["allowed_s"]
    assert record["first_step"]["knows_tokens_by"] < record["first_step"]["bound"]


@pytest.mark.parametrize("how", ["trained before the clock", "shipped weights"])
def test_a_model_that_arrives_trained_is_flagged(cli, tmp_path, cache_dir, monkeypatch, how):
    """pretrains sets its table to the train shards' bigram log-frequencies inside get_model (seconds,
    within the start-up allowance), or loads weights shipped beside it: the harness's loss of the
    first step, before any optimizer step, is far below ln V, and the run is flagged for review. Shipped
    weights are flagged from the folder itself as well."""
    import torch

    sub = _copy_fixture("pretrains", tmp_path)
    if how == "shipped weights":  # trained offline: the train shard's bigram log-frequencies
        import numpy as np

        from harness.data.prepare import prepare_data
        from harness.tracks.spec import load_track

        monkeypatch.setenv("HARNESS_CACHE_DIR", str(cache_dir))
        shard = prepare_data(load_track(str(TINY_TRACK)), None).train[0]
        t = np.memmap(shard.path, dtype=np.uint16, mode="r", offset=shard.offset_bytes, shape=(shard.num_tokens,))
        t = np.asarray(t[:200_000], dtype=np.int64)
        counts = np.bincount(t[:-1] * 256 + t[1:], minlength=256 * 256).reshape(256, 256) + 0.1
        table = torch.from_numpy(np.log(counts / counts.sum(1, keepdims=True))).float()
        torch.save({"table.weight": table}, sub / "pretrained.pt")
    result = cli("run", str(sub), "--track", str(quick_track(tmp_path)), timeout=180)
    assert result.code == 0, result.err
    run_dir, record = _record(tmp_path / "runs", "pretrains")
    assert record["status"] == "ok" and record["flagged"] is True
    first = record["first_step"]
    assert first["knows_tokens_by"] > first["bound"] and "the model arrived trained" in record["flag_reason"]
    if how == "shipped weights":
        assert "pretrained.pt (a zip archive" in record["flag_reason"]
        assert "PRETRAINS loaded shipped weights" in (run_dir / "logs" / "rank0.log").read_text()
    else:
        assert "PRETRAINS trained before the clock" in (run_dir / "logs" / "rank0.log").read_text()
    assert "FLAGGED" in result.out


def test_a_checkpoint_swapped_after_the_save_is_never_scored(cli, tmp_path):
    """swaps_checkpoint replaces staging/checkpoint.pt with a forged one right after the harness writes it.
    The launcher takes the file when rank 0 says it is saved and checks it is the one rank 0 hashed: the
    forged file is either never taken, or the run is invalid; it is never scored."""
    import torch

    result = cli("run", str(FIXTURES / "swaps_checkpoint"), "--track", str(quick_track(tmp_path)), timeout=180)
    run_dir, record = _record(tmp_path / "runs", "swaps_checkpoint")
    assert "SWAPS-CHECKPOINT replaced" in (run_dir / "logs" / "rank0.log").read_text()
    if record["status"] == "invalid":
        assert "was replaced after the harness saved it" in record["reason"] and record["val_loss"] is None
    else:
        assert result.code == 0 and record["status"] == "ok", record["reason"]
        assert "forged" not in torch.load(run_dir / "checkpoint.pt", weights_only=True)["config"]


def test_a_checkpoint_said_saved_before_it_is_is_never_taken_later(cli, tmp_path):
    """reports_early patches the loop in its rank: rank 0 says "checkpoint saved" at the end of training, trains
    3 s more, then saves. The launcher takes the checkpoint once, on the report, and there is none: invalid
    (it took the file after the job before, 14 s of training later in the red team's run)."""
    result = cli("run", str(FIXTURES / "reports_early"), "--track", str(one_rank(tmp_path, grace_s=20.0)),
                 timeout=180)
    assert result.code == 1
    run_dir, record = _record(tmp_path / "runs", "reports_early")
    assert "REPORTS-EARLY trained" in (run_dir / "logs" / "rank0.log").read_text()
    assert record["status"] == "invalid" and "staging held no checkpoint then" in record["reason"], record["reason"]
    assert record["val_loss"] is None and not (run_dir / "checkpoint.pt").exists()


def test_work_inside_the_models_own_state_dict_is_never_saved(cli, tmp_path):
    """shadow_state trains its evaluation buffer inside its own state_dict (work after the clock, in the
    save). The harness copies the weights without calling any method of the model: the saved buffer is
    the zeros training left, and the model scores exactly ln V (uniform logits)."""
    import math

    result = cli("run", str(FIXTURES / "shadow_state"), "--track", str(quick_track(tmp_path)), timeout=180)
    assert result.code == 0, result.err
    run_dir, record = _record(tmp_path / "runs", "shadow_state")
    assert record["status"] == "ok" and record["val_loss"] == pytest.approx(math.log(256), abs=1e-4)
    assert "SHADOW-STATE state_dict called" not in (run_dir / "logs" / "rank0.log").read_text()


# ----------------------------------------------------------------------------- the checks' arithmetic


def _window_record(window_s, budget_s=10.0, steps=50, median=0.1, slowest=0.0):
    from harness.results.records import RunRecord

    record = RunRecord(run_id="r", team="t", track_name="x", budget_s=budget_s, steps=steps)
    record.launcher_train_time_s = window_s
    record.extra["median_step_s"] = median
    record.extra["slowest_earlier_step_s"] = slowest
    return record


def test_the_window_bound_is_two_median_steps_or_the_tracks_allowance_and_never_above_five_percent():
    from types import SimpleNamespace

    from harness.launcher.run.assemble import check_window

    track = SimpleNamespace(max_steps=0, overrun_allowance_s=1.0)
    assert check_window(_window_record(10.9), track) == ""  # within 1 s
    assert "held open" in check_window(_window_record(11.1), track)
    assert check_window(_window_record(101.5, budget_s=100.0, median=0.8), track) == ""  # two median steps of 0.8 s
    assert "held open" in check_window(_window_record(101.7, budget_s=100.0, median=0.8), track)
    # Steps claimed huge: the steps' part is capped at 5% of the budget (0.5 s here), so the 1 s floor holds.
    assert "held open" in check_window(_window_record(11.2, median=50.0), track)
    assert "first step alone did not fit" in check_window(_window_record(25.0, steps=1), track)
    # A step that is slow every k steps (a preconditioner's refresh, 10x the median) may be the last one.
    assert check_window(_window_record(601.05, budget_s=600.0, median=0.1, slowest=1.0), track) == ""
    assert "held open" in check_window(_window_record(602.5, budget_s=600.0, median=0.1, slowest=1.0), track)
    assert check_window(_window_record(25.0), SimpleNamespace(max_steps=20, overrun_allowance_s=1.0)) == ""


def test_relabelling_the_vocabulary_costs_an_untrained_model_nothing_and_a_trained_one_nats():
    """The premise of the first-step check, measured on modules as the loop probes them: untrained models
    (a bigram table, a tied-embedding model whose initialisation favours repeating the current token, on
    text where half the tokens repeat the one before) score the batch and its relabelled copy alike; the same tied
    model scores below ln V - 1 there (a bound on the loss itself would flag it); a bigram trained on the
    data loses more than the bound once relabelled."""
    import math

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from harness.launcher.run.assemble import RELABEL_GAIN_BOUND

    torch.manual_seed(0)
    V, n = 256, 8192
    tokens = torch.randint(0, V, (n + 1,))
    repeat = torch.rand(n + 1) < 0.5
    for i in range(1, n + 1):  # repetitive text (padding, indentation): half the next tokens are the current one
        if repeat[i]:
            tokens[i] = tokens[i - 1]
    x, y = tokens[:-1].view(8, -1), tokens[1:].view(8, -1)
    perm = torch.randperm(V)

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, 64)
            nn.init.normal_(self.emb.weight, std=0.12)
            self.norm = nn.LayerNorm(64)

        def forward(self, idx):  # an untrained stack's output: the input token's embedding, normalised, tied
            return self.norm(self.emb(idx)) @ self.emb.weight.t()

    def gain(model):
        with torch.no_grad():
            a = F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
            b = F.cross_entropy(model(perm[x]).flatten(0, 1), perm[y].flatten()).item()
        return a, b - a

    bigram = nn.Embedding(V, V)
    tied_loss, tied_gain = gain(Tied())
    assert abs(gain(bigram)[1]) < 0.2 and abs(tied_gain) < 0.2 < RELABEL_GAIN_BOUND
    assert tied_loss < math.log(V) - 1.0  # an honest initialisation below ln V - 1: the old bound's false positive
    counts = torch.zeros(V, V)
    counts.index_put_((x.flatten(), y.flatten()), torch.ones(n), accumulate=True)
    with torch.no_grad():
        bigram.weight.copy_(torch.log((counts + 0.1) / (counts + 0.1).sum(1, keepdim=True)))
    assert gain(bigram)[1] > RELABEL_GAIN_BOUND  # even here, where half its knowledge (repeats) survives relabelling


# ----------------------------------------------------------------------------- secrets


def test_the_validation_tokens_cannot_be_rebuilt_from_the_public_track_file(cli, tmp_path):
    """rebuilds_val regenerates the synthetic validation tokens in evaluation with the harness's own code and
    every seed a track file has named, and predicts by six-token context. The seed is drawn when the cache is
    built: the rebuilt tokens are not the validation tokens, and the figure is the trained bigram's, above
    the floor, with no flag but the one its rebuild may earn: on a loaded machine the rebuild inside the
    first scoring batch takes past SLOW_BATCH_FLOOR_S (3.2 s on a quiet one), work in evaluation that is not
    a forward pass, which is flagged as it should be."""
    result = cli("run", str(FIXTURES / "rebuilds_val"), "--track", str(one_rank(tmp_path, max_steps=200, budget_s=30.0)),
                 timeout=240)
    assert result.code == 0, result.err
    run_dir, record = _record(tmp_path / "runs", "rebuilds_val")
    assert "REBUILDS-VAL rebuilt" in (run_dir / "logs" / "eval-model-rank0.log").read_text()
    others = [f for f in record["flag_reason"].split("; ") if f and "over one batch" not in f]
    assert record["status"] == "ok" and not others, record["flag_reason"]
    assert record["val_loss"] > record["loss_floor"] + 0.3, record["val_loss"]  # a bigram's gap, not a lookup's
    assert record["floor_check"]["below_by"] < 0


def test_a_figure_below_the_floor_by_more_than_chance_is_flagged():
    """The tripwire for any leak of the validation tokens: below the true source's own loss by more than
    five standard errors of the gap (and 0.01 nats), the run is flagged; an honest model near the floor
    is not."""
    from harness.launcher.run.evaluation import below_floor_margin, check_below_floor
    from harness.results.records import RunRecord

    def checked(val_loss, floor=1.6, n=131072, s_model=1.2, s_floor=1.1):
        record = RunRecord(run_id="r", team="t", track_name="local", val_loss=val_loss, loss_floor=floor)
        record.extra["loss_floor_token_std"] = s_floor
        check_below_floor(record, {"val_loss_token_std": s_model, "val_tokens": n})
        return record

    margin = below_floor_margin(131072, 1.2, 1.1)
    assert 0.03 < margin < 0.04  # 5 x 2.3 / sqrt(131072)
    assert not checked(1.6 - margin / 2).flagged and not checked(1.9).flagged
    flagged = checked(0.0075)
    assert flagged.flagged and "below the data's own floor" in flagged.flag_reason
    assert below_floor_margin(10**9, 0.0, 0.0) == 0.01


def test_the_local_text_validation_text_is_readable_from_no_sandbox(cli, tmp_path):
    """local-text validates on the running Python's test suite. reads_test_suite tries to list and read it in
    the check process, the training rank and both model processes: every sandbox hides its text (the rest
    of the standard library stays readable: the same processes import from it; a listing of its names
    may remain where only Landlock holds, as Python's import system lists the folders on its path)."""
    result = cli("run", str(FIXTURES / "reads_test_suite"), "--track", str(quick_track(tmp_path)), timeout=180)
    assert result.code == 0, result.err
    run_dir, record = _record(tmp_path / "runs", "reads_test_suite")
    if not record["sandbox"]["training"].get("active"):
        pytest.fail(f"no sandbox on this machine: {record['sandbox']['training']}")
    logs = run_dir / "logs"
    for log in ("preflight.log", "rank0.log", "eval-model-rank0.log", "eval-check-rank0.log"):
        lines = [line for line in (logs / log).read_text().splitlines() if line.startswith("READS-TEST-SUITE")]
        assert lines, log
        for line in lines:
            assert "read " not in line.split(":", 1)[1] and line.count(" denied (") >= 4, (log, line)


def test_the_rows_a_detection_power_needs_and_the_batches_that_hold_them():
    """A row with one secret cut catches a model that looks ahead at a fraction f of positions with
    probability f; n rows with 1 - (1 - f)^n. The plan keeps adding batches in its secret order until
    the rows are there (a partial last batch counts for what it holds)."""
    from harness.scoring.plan import choose_checks, detectable_fraction, rows_to_detect

    assert rows_to_detect(0.01) == 299 and 1 - 0.99 ** 299 >= 0.95 > 1 - 0.99 ** 298
    assert rows_to_detect(0.0) == 0 and detectable_fraction(0) is None
    assert detectable_fraction(299) == pytest.approx(0.01, rel=0.01) and detectable_fraction(64) > 0.045
    rows = [32] * 15 + [16]
    for seed in range(20):
        chosen = choose_checks(16, 0.1, seed, rows=rows, min_rows=299)
        assert sum(rows[b] for b in chosen) >= 299 and len(chosen) <= 11
        assert choose_checks(16, 0.1, seed) <= chosen  # the fraction's batches first, then more
    assert len(choose_checks(16, 0.1, 3)) == 2


# ----------------------------------------------------------------------------- what outlives a run


def _sysv_segment(key: int) -> int:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).shmget(key, 0, 0)


def _remove_carried() -> None:
    import ctypes

    Path("/dev/shm/harness-door-carry.pt").unlink(missing_ok=True)
    shmid = _sysv_segment(0x48524E53)
    if shmid >= 0:
        ctypes.CDLL(None).shmctl(shmid, 0, None)  # IPC_RMID


def test_nothing_a_run_leaves_in_shared_memory_reaches_the_next(cli, tmp_path):
    """carries_state leaves its weights in /dev/shm and in a System V segment, and looks for an earlier run's
    at start. Each job has a /dev/shm and an IPC namespace of its own: the second run finds nothing, and
    nothing of the first is left on the machine."""
    _remove_carried()
    track = quick_track(tmp_path)
    try:
        for n in (1, 2):
            result = cli("run", str(FIXTURES / "carries_state"), "--track", str(track), "--seed", str(n), timeout=180)
            assert result.code == 0, result.err
            assert not Path("/dev/shm/harness-door-carry.pt").exists(), "the run's /dev/shm file outlived it"
            assert _sysv_segment(0x48524E53) < 0, "the run's System V segment outlived it"
        logs = sorted((tmp_path / "runs" / "tiny" / "carries_state").glob("*/logs/rank0.log"))
        assert len(logs) == 2
        for log in logs:
            text = log.read_text()
            assert "CARRIES-STATE left its table" in text and "CARRIES-STATE found: nothing" in text, text[-2000:]
        _, record = _record_of(tmp_path / "runs", "carries_state")
        assert record["sandbox"]["training"]["namespaces"]["active"] is True
    finally:
        _remove_carried()


def _record_of(runs: Path, team: str) -> tuple[Path, dict]:
    path = sorted((runs / "tiny" / team).glob("*/run.json"))[-1]
    return path.parent, json.loads(path.read_text())


def test_team_code_sees_an_allowed_environment_and_never_the_launchers(cli, tmp_path):
    """The organiser's environment holds a secret (here HARNESS_DOOR_TOKEN). reads_environment looks for it in
    its own environment and in /proc/<pid>/environ of itself, its parent and the launcher, in every process
    that runs team code: it finds it nowhere, and what it sees is the allow-list."""
    import secrets as _secrets

    secret = f"DOOR-SECRET-{_secrets.token_hex(8)}"
    result = cli("run", str(FIXTURES / "reads_environment"), "--track", str(quick_track(tmp_path)), timeout=180,
                 env={"HARNESS_DOOR_TOKEN": secret, "AWS_SECRET_ACCESS_KEY": secret})
    assert result.code == 0, result.err
    run_dir, record = _record(tmp_path / "runs", "reads_environment")
    text = "\n".join(p.read_text(errors="replace") for p in (run_dir / "logs").iterdir() if p.is_file())
    assert "READS-ENVIRONMENT rank /proc/launcher/environ" in text and "READS-ENVIRONMENT model" in text
    assert secret not in text and secret not in (run_dir / "run.json").read_text()
    from harness.ranks.confine.sandbox import KEEP_ENV, KEEP_ENV_PREFIXES

    elastic = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
               "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
               "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
               "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
               "HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH",
               "PYTHONDONTWRITEBYTECODE"}
    for line in text.splitlines():
        if line.startswith("READS-ENVIRONMENT") and " names: " in line:
            names = set(line.split(" names: ", 1)[1].split())
            odd = {n for n in names - elastic if n not in KEEP_ENV and not n.startswith(KEEP_ENV_PREFIXES)}
            assert not odd, (line[:60], odd)


# ----------------------------------------------------------------------------- caps


def test_a_run_that_floods_its_log_is_ended_and_its_record_stays_small(cli, tmp_path):
    """floods_log prints a megabyte a forward. The track caps the ranks' logs (8 MiB on tiny): the job is
    ended, invalid, with that reason; the record's copy of the log stops at the cap. (The check process's
    log, which has its forwards too, is bounded by the file-size limit of every sandboxed process.)"""
    from harness.ranks.confine.logs import FILE_CAP_BYTES

    result = cli("run", str(FIXTURES / "floods_log"), "--track", str(one_rank(tmp_path, grace_s=20.0)), timeout=180)
    assert result.code == 1
    run_dir, record = _record(tmp_path / "runs", "floods_log")
    assert record["status"] == "invalid" and "more than 8 MiB to their logs" in record["reason"], record["reason"]
    rank_log = run_dir / "logs" / "rank0.log"
    assert rank_log.stat().st_size < 8 * 2**20 + 4096 and "cut here" in rank_log.read_text()[-300:]
    assert (run_dir / "logs" / "preflight.log").stat().st_size <= FILE_CAP_BYTES


def test_logs_a_team_leaves_neither_grow_the_record_nor_pass_the_cap(cli, tmp_path):
    """litters_logs leaves eight sparse 7 MiB files and a chain of 1,200 folders in its logs folder, in a run that
    ends within the second. The record takes only the logs the harness names (rank0.log and the launcher's), within
    one budget for all, without walking the folder; the caps are measured during the job and once more after it
    (tests/test_launcher_reasons.py): the run is invalid for its logs, and its record stays small."""
    result = cli("run", str(FIXTURES / "litters_logs"), "--track", str(quick_track(tmp_path)), timeout=180)
    assert result.code == 1, result.out + result.err
    run_dir, record = _record(tmp_path / "runs", "litters_logs")
    assert record["status"] == "invalid" and "more than 8 MiB to their logs" in record["reason"], record["reason"]
    logs = run_dir / "logs"
    assert not (logs / "extra0.log").exists() and not (logs / "d").exists()
    training = [p for p in logs.iterdir() if p.is_file() and not p.name.startswith(("eval-", "preflight"))]
    assert sum(p.stat().st_size for p in training) <= 8 * 2**20 + 4096, [p.name for p in training]
    assert any("not taken into the record" in n and "extra" in n for n in record["notes"]), record["notes"]


@pytest.mark.parametrize("sandbox", ["on", "off"])
def test_a_disk_filled_while_the_launcher_copies_the_checkpoint_is_never_a_free_rerun(cli, tmp_path, sandbox):
    """fills_disk_at_save fills the file system of its private folder with an anonymous file as its checkpoint is
    saved, leaving room for its own save and not for a copy. The records are on a 320 MB tmpfs mounted by the test,
    and so is the scratch root. With the sandbox, the private folder is a file system of the job's own: the team
    fills only that, the launcher's copy lands on the records' disk, and the run is `ok`, gaining nothing. Without
    it (sandbox "off": the folder on the records' disk), the launcher's copy fails with ENOSPC; a team can cause
    that, so the run is `crashed`, never `aborted` (a queue runs an aborted run again: a re-roll of a seed the team
    judged unlucky)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=320m", "tmpfs", str(disk)], check=True)
    try:
        (disk / "scratch").mkdir()
        track = quick_track(tmp_path)
        if sandbox == "off":  # the track's own key, beside its name (not a key tiny.toml writes down)
            track.write_text(track.read_text().replace('name = "tiny"\n', 'name = "tiny"\nsandbox = "off"\n', 1))
        result = cli("run", str(FIXTURES / "fills_disk_at_save"), "--track", str(track),
                     env={"HARNESS_SCRATCH_DIR": str(disk / "scratch")}, runs_dir=disk / "runs")
        _, record = _record(disk / "runs", "fills_disk_at_save")
        if sandbox == "on":
            assert result.code == 0 and record["status"] == "ok", record["reason"]
            assert record["job_namespace"]["scratch"] == "tmpfs"
            return
        assert result.code == 1, result.out + result.err
        assert record["status"] == "crashed", record["reason"]
        assert "the checkpoint could not be taken" in record["reason"] and "No space left" in record["reason"]
        assert "the team's processes could cause this" in record["reason"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("sandbox", ["on", "off"])
def test_a_run_that_fills_its_private_folder_is_ended(cli, tmp_path, sandbox):
    """fills_scratch writes 64 MiB a forward into its working folder. With the sandbox, that folder is a file system
    of the job's own of the track's scratch cap (0.25 GiB on tiny): the write past it fails, the rank dies of it, and
    the reason says first which cap it met. Without it (sandbox "off": the folder on the launcher's disk), the caps'
    walk ends the job past the cap, `invalid`."""
    track = one_rank(tmp_path, grace_s=20.0)
    if sandbox == "off":
        track.write_text(track.read_text().replace('name = "tiny"\n', 'name = "tiny"\nsandbox = "off"\n', 1))
    result = cli("run", str(FIXTURES / "fills_scratch"), "--track", str(track), timeout=180)
    assert result.code == 1
    _, record = _record(tmp_path / "runs", "fills_scratch")
    if sandbox == "off":
        assert record["status"] == "invalid", record["reason"]
        assert record["reason"] == "the ranks' private folder holds more than 0.25 GiB (the track's scratch_cap_gib)"
        return
    assert record["status"] == "crashed", record["reason"]
    assert record["reason"].startswith("the ranks' private folder is full (the private folder and /dev/shm are each a "
                                       "file system of the track's scratch_cap_gib, 0.25 GiB): rank 0: "), record["reason"]
    assert "No space left on device" in record["reason"]


def test_a_submission_of_too_many_files_or_too_many_bytes_for_the_folder_is_refused_before_any_rank(cli, tmp_path):
    """The red team's: a submission of 450,000 empty files slowed the copy into the ranks' tmpfs past its holder's
    ready time (no namespace for the job), and 67,000 small files broke the folder's cap with the copy alone. A
    submission holds at most 10,000 files and folders, and what its copy takes is measured against the track's
    scratch cap before any rank starts: both `invalid`, with the fix."""
    many = tmp_path / "many"
    shutil.copytree(FIXTURES / "ok_bigram", many)
    (many / "empty").mkdir()
    for i in range(10_001):
        (many / "empty" / f"{i}").touch()
    result = cli("run", str(many), "--track", str(quick_track(tmp_path)))
    assert result.code == 1
    _, record = _record(tmp_path / "runs", "many")
    assert record["status"] == "invalid", record["reason"]
    assert "past the 10,000th file or folder (9,999 of them under empty/)" in record["reason"], record["reason"]
    assert "keep at most 10,000 files and folders in the submission" in record["reason"]

    large = tmp_path / "large"
    shutil.copytree(FIXTURES / "ok_bigram", large)
    (large / "notes.txt").write_bytes(os.urandom(40 << 20))
    (tmp_path / "small").mkdir()
    result = cli("run", str(large), "--track", str(quick_track(tmp_path / "small", scratch_cap_gib=0.03)))
    assert result.code == 1
    _, record = _record(tmp_path / "runs", "large")
    assert record["status"] == "invalid", record["reason"]
    assert record["reason"].startswith("the submission's files take 40.0 MiB in the ranks' folder, more than the "
                                       "track's scratch_cap_gib (0.03 GiB): keep code and small config files"), \
        record["reason"]
    assert record["val_loss"] is None and not record["sandbox"].get("training")


def test_a_model_process_that_floods_its_log_dies_at_the_cap(cli, tmp_path):
    """floods_eval_log prints 32 MB a forward outside training (the check process's probes, evaluation's
    model process), where its log is a descriptor the harness cannot watch: the file-size limit of every
    sandboxed process fails the write (EFBIG), the run ends and the reason says so; no log outgrows it."""
    from harness.ranks.confine.logs import FILE_CAP_BYTES

    result = cli("run", str(FIXTURES / "floods_eval_log"), "--track", str(quick_track(tmp_path)), timeout=180)
    assert result.code == 1
    run_dir, record = _record(tmp_path / "runs", "floods_eval_log")
    assert record["status"] in ("invalid", "crashed") and "File too large" in record["reason"], record["reason"]
    logs = [log for log in (run_dir / "logs").rglob("*") if log.is_file()]
    for log in logs:
        assert log.stat().st_size <= FILE_CAP_BYTES, log
    # Each process's log is bounded alone; all of them together, by the run's one log budget (8 MiB on tiny).
    assert sum(log.stat().st_size for log in logs) <= 8 * 2**20 + 200 * len(logs), [(p.name, p.stat().st_size) for p in logs]


def test_reports_are_typed_and_capped_and_the_leaderboard_survives_them(cli, tmp_path):
    """floods_reports sends, through its rank's own channel, a progress report with steps = "many", then 8.8 MB
    of reports. The malformed one is dropped and flags the run; past 4 MiB the connection is cut and the
    job ended, invalid; the leaderboard still builds, the run listed with its reason."""
    result = cli("run", str(FIXTURES / "floods_reports"), "--track", str(one_rank(tmp_path, grace_s=20.0)),
                 timeout=180, leaderboard=True)
    assert result.code == 1
    run_dir, record = _record(tmp_path / "runs", "floods_reports")
    assert record["status"] == "invalid" and "more than 4 MiB of reports" in record["reason"], record["reason"]
    assert record["flagged"] and "step = 'many' is not a count" in record["flag_reason"]
    assert (tmp_path / "leaderboard" / "tiny.csv").read_text().count("floods_reports") == 1


# ----------------------------------------------------------------------------- honest submissions are never caught


@pytest.mark.parametrize("submission", ["submissions/baseline", "submissions/minimal", "tests/fixtures/team_like",
                                        "tests/fixtures/ok_bigram", "tests/fixtures/linear_lm",
                                        "tests/fixtures/two_optimizers"])
def test_an_honest_submission_passes_every_door_unflagged(cli, tmp_path, submission):
    """Every new check on an honest model: the reports fit their schema, the first step is an untrained
    model's, the checkpoint is taken as saved, the weights do not move after the clock, nothing is past
    a cap, the figure is above the floor; and the run is ok and unflagged. (On the budget, the window
    check: test_an_honest_window_ends_within_its_bound; compiled models: test_evaluation_security.py.)"""
    from conftest import ROOT

    result = cli("run", str(ROOT / submission), "--track", str(quick_track(tmp_path)), timeout=240)
    assert result.code == 0, result.err
    (path,) = (tmp_path / "runs" / "tiny").glob("*/*/run.json")
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and not record["flagged"], (record["reason"], record["flag_reason"])
    assert "malformed_reports" not in record and "refused_reports" not in record
    assert not [n for n in record["notes"] if "process(es)" in n or "processes running" in n], record["notes"]
    assert record["first_step"]["knows_tokens_by"] < record["first_step"]["bound"]
    assert record["floor_check"]["below_by"] < record["floor_check"]["margin"]
    assert record["sandbox"]["training"]["namespaces"]["active"] is True
    assert record["checkpoint_write"]["bytes"] == (path.parent / "checkpoint.pt").stat().st_size


def test_without_a_job_namespace_what_the_job_made_in_shared_memory_is_swept():
    """Where the host refuses user namespaces, the launcher removes, after the job, the /dev/shm entries and
    System V objects of its user that appeared meanwhile, and nothing that was there before."""
    import ctypes

    from harness.launcher.control.job_namespace import ShmSweep

    libc = ctypes.CDLL(None, use_errno=True)
    before_file = Path("/dev/shm/harness-test-sweep-before")
    before_file.write_bytes(b"x")
    old = libc.shmget(0x48525301, 4096, 0o1000 | 0o600)
    try:
        sweep = ShmSweep()
        Path("/dev/shm/harness-test-sweep-after").write_bytes(b"y")
        new = libc.shmget(0x48525302, 4096, 0o1000 | 0o600)
        assert old >= 0 and new >= 0
        removed = sweep.sweep()
        assert "harness-test-sweep-after" in removed and f"System V shm {new}" in removed
        assert not Path("/dev/shm/harness-test-sweep-after").exists() and libc.shmget(0x48525302, 0, 0) < 0
        assert before_file.exists() and libc.shmget(0x48525301, 0, 0) == old
    finally:
        before_file.unlink(missing_ok=True)
        Path("/dev/shm/harness-test-sweep-after").unlink(missing_ok=True)
        for key in (0x48525301, 0x48525302):
            ident = libc.shmget(key, 0, 0)
            if ident >= 0:
                libc.shmctl(ident, 0, None)


def test_a_training_rank_can_leave_no_mark_on_files_outside_its_folder(cli, tmp_path):
    """marks_files sets an extended attribute (where a run carried its weights to the next), a mode and a time on
    files its user owns and every rank can name: the harness's package, the Python, the train shard. The job's
    mounts are read-only but its private folder: every attempt fails with EROFS, twice, and no mark is left."""
    import sys

    import harness

    name = "user.harness-door-mark"
    track = quick_track(tmp_path)
    try:
        for seed in (1, 2):
            result = cli("run", str(FIXTURES / "marks_files"), "--track", str(track), "--seed", str(seed), timeout=180)
            assert result.code == 0, result.err
        logs = sorted((tmp_path / "runs" / "tiny" / "marks_files").glob("*/logs/rank0.log"))
        lines = [line for log in logs for line in log.read_text().splitlines() if line.startswith("MARKS-FILES")]
        assert len(lines) == 6, lines
        for line in lines:
            assert "found nothing" in line and "xattr EROFS" in line and "chmod EROFS" in line \
                and "utime EROFS" in line, line
        for path in (harness.__file__, sys.executable):
            assert name not in os.listxattr(path)
    finally:
        for path in (harness.__file__, os.path.realpath(sys.executable)):
            try:
                os.removexattr(path, name)
            except OSError:
                pass


def test_training_again_in_evaluation_is_flagged(cli, tmp_path):
    """trains_in_eval carries training batches in a buffer of its checkpoint and trains on them for 300 steps
    at its first forward in evaluation (the same steps in both model processes, so the causality check
    agrees), that batch held to 8 s at least, past the door's absolute 5 s on any machine. That batch takes
    far longer than the others: the run is flagged for review. An honest model's batches take alike
    (test_an_honest_submission_passes_every_door_unflagged)."""
    result = cli("run", str(FIXTURES / "trains_in_eval"), "--track", str(quick_track(tmp_path, eval__timeout_s=120.0)),
                 timeout=400)
    assert result.code == 0, result.err
    run_dir, record = _record(tmp_path / "runs", "trains_in_eval")
    assert "TRAINS-IN-EVAL trained" in (run_dir / "logs" / "eval-model-rank0.log").read_text()
    assert record["status"] == "ok" and record["flagged"], record["reason"]
    assert "work in evaluation that is not a forward pass" in record["flag_reason"]
    scoring = record["eval"]["model_compute"]["scoring"]
    assert scoring["slowest_s"] > 20 * scoring["median_s"]


def test_the_job_namespace_is_made_where_the_host_has_read_only_mounts_under_proc(tmp_path):
    """Containers and cgroup-v1 hosts mount /proc/sys or /sys/fs/cgroup read-only. The job's namespace makes
    everything read-only but its /dev/shm, the ranks' private folder and /proc, clearing each alone: the
    kernel refuses to clear a read-only flag the host set on a mount beneath, and a recursive clear failed
    there (every run of a track that requires the sandbox would have aborted)."""
    import subprocess
    import sys

    script = tmp_path / "host.sh"
    script.write_text(
        "set -e\nmount -o bind /proc/sys /proc/sys\nmount -o remount,bind,ro /proc/sys\n"
        f"cd {tmp_path} && {sys.executable} -c \""
        "from harness.launcher.control.job_namespace import JobNamespace; import tempfile; "
        "ns = JobNamespace(shm_bytes=1 << 26, writable=tempfile.mkdtemp()); print('ACTIVE', ns.active, ns.why); "
        "ns.close()\"\n")
    proc = subprocess.run(["unshare", "-Urm", "sh", str(script)], capture_output=True, text=True, timeout=60)
    assert "ACTIVE True" in proc.stdout, proc.stdout + proc.stderr


def test_team_code_cannot_change_the_limits_or_priority_of_the_process_that_started_it(cli, tmp_path):
    """prlimit, setpriority and sched_set* on another process are not Landlock's: a rank could have the kernel
    kill its launcher (RLIMIT_CPU), lower what the next team's ranks inherit, or starve it (the red team's
    attack on the queue). The seccomp filter of every sandboxed process refuses them; the check process and
    the ranks both call get_model here, and the run is ok only if every attempt was refused in both."""
    result = cli("run", str(FIXTURES / "reaches_launcher"), "--track", str(quick_track(tmp_path)))
    _, record = only_record(tmp_path / "runs")
    assert result.code == 0 and record["status"] == "ok", record["reason"]
    assert record["sandbox"]["training"]["seccomp"] == "on" and record["sandbox"]["check"]["seccomp"] == "on"


def test_a_file_without_a_name_is_held_to_the_private_folders_cap_and_never_reaches_the_disk(cli, tmp_path):
    """hides_scratch writes an anonymous file (O_TMPFILE) of up to three times the scratch cap into its private
    folder, and appends a forged line to where the launcher's log used to be. The folder is a tmpfs of the job's
    own, of the cap's size (harness/launcher/control/job_namespace.py): the kernel refuses the write past it, so
    the file never held more than the cap, named or not, and nothing of it reached a disk; the team lets it go and
    trains on, `ok`. The record's launcher log is the launcher's alone."""
    result = cli("run", str(FIXTURES / "hides_scratch"), "--track", str(quick_track(tmp_path)), timeout=180)
    assert result.code == 0, result.out + result.err
    run_dir, record = _record(tmp_path / "runs", "hides_scratch")
    assert record["job_namespace"]["scratch"] == "tmpfs", record["job_namespace"]
    assert record["status"] == "ok", record["reason"]
    said = (run_dir / "logs" / "rank0.log").read_text()
    held = re.search(r"HIDDEN held (\d+) MiB, then refused: No space left on device", said)
    assert held and int(held.group(1)) <= 256, said[-2000:]  # tiny's scratch_cap_gib, 0.25 GiB
    assert "FORGED" not in (run_dir / "logs" / "launcher.log").read_text()
