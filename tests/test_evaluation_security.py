"""Scores that cannot be forged: each attack a hostile submission can make on evaluation, through the
real CLI, and honest models that must never be caught (track `tiny`: one scorer, two model processes).

The attacks: looking ahead only in batches of several rows (the check before the run is at batch 1);
walking the stack and gc for the targets; reading the validation file; remembering prefixes to
answer a re-run batch consistently, sharing that memory between model processes; patching the
functions an in-process evaluator would call. Each must end `invalid` or flagged, with what was seen;
the isolation layers it hit are read back from its own logs.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, TINY_TRACK, one_rank, only_record, processes_of_run, quick_track

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def independent_val_loss(run_dir, cache_dir, seq_len=64, val_tokens=8192, bigram=False) -> float:
    """The figure recomputed here, without the harness's evaluator: the checkpoint loaded into the
    submission's model (or, for a bigram, its table read directly: no submission code in this
    process), the first val_tokens + 1 tokens of the tiny corpus's val.bin, windows of seq_len,
    float64 sums of float32 cross-entropy."""
    import importlib.util
    import sys

    import numpy as np

    # The corpus this run trained on (the session's cache may hold several tracks' corpora).
    val = Path(json.loads((run_dir / "run.json").read_text())["data"]["location"]) / "val.bin"
    tokens = np.fromfile(val, dtype=np.uint16)[512:].astype(np.int64)[: val_tokens + 1]  # 1,024-byte llm.c header
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    if bigram:
        table = ckpt["model"]["table.weight"]

        def model(x):
            return (table[x],)
    else:
        spec = importlib.util.spec_from_file_location("independent_sub", run_dir / "submission" / "submission.py")
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(run_dir / "submission"))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(run_dir / "submission"))
        model = module.get_model(dict(ckpt["config"]))
        model = getattr(model, "_orig_mod", model)
        model.load_state_dict(ckpt["model"])
        model.eval()
    total = 0.0
    with torch.no_grad():
        for w in range(val_tokens // seq_len):
            x = torch.from_numpy(tokens[w * seq_len:(w + 1) * seq_len])[None]
            y = torch.from_numpy(tokens[w * seq_len + 1:(w + 1) * seq_len + 1])
            logits = model(x)[0][0].float()
            total += torch.nn.functional.cross_entropy(logits, y, reduction="sum").double().item()
    return total / (val_tokens // seq_len * seq_len)


def _log(run_dir, name) -> str:
    return (run_dir / "logs" / name).read_text(errors="replace")


def _run(cli, tmp_path, fixture, *extra, track=None):
    """The attack on one rank for a few steps (quick_track): what it does to evaluation does not depend on
    how long or on how many ranks it trained."""
    result = cli("run", str(fixture), "--track", str(track or quick_track(tmp_path)), *extra)
    run_dir, record = only_record(tmp_path / "runs")
    assert processes_of_run(record["run_id"]) == []
    return result, run_dir, record


def assert_caught_looking_ahead(record):
    assert record["status"] == "invalid" and record["reason"].startswith("non-causal"), record["reason"]
    c = record["eval"]["causality"]
    assert c["checked_batches"] >= 2 and c["worst_deviation"] > c["tolerance"] and record["val_loss"] is None
    assert "unscored_val_loss" in record["eval"]  # kept for the audit, never ranked
    # it reproduced itself on the unchanged batch: the deviation is its look-ahead (noise: test_causality_verdict.py)
    assert c["verdict"] == "non-causal" and c["causal"] is False and c["reproduced_batches"] == 1
    assert c["reproduction_deviation"] <= c["tolerance"], c


def assert_never_ranked_looking_ahead(record):
    """A model whose answers depend on the batches it saw before (a memory of prefixes) gives other answers
    for the unchanged batch the check process re-runs, which it sees after other batches than the scoring
    process did: its look-ahead is then flagged "inconclusive" (scored, hidden from the ranking until a
    person decides; tests/test_causality_verdict.py), else `invalid`. Never ranked either way."""
    c = record["eval"]["causality"]
    if c["verdict"] != "inconclusive":
        return assert_caught_looking_ahead(record)
    assert c["worst_deviation"] > c["tolerance"] and c["reproduction_deviation"] > c["tolerance"], c
    assert record["flagged"] and "causality inconclusive" in record["flag_reason"], record["flag_reason"]


def test_looking_ahead_only_in_batches_is_caught_on_the_scoring_itself(cli, tmp_path):
    result, _, record = _run(cli, tmp_path, FIXTURES / "batch_peek")
    assert result.code == 1
    assert record["steps"] > 5, "it trained: the check before the run (batch 1) cannot see it"
    assert_caught_looking_ahead(record)


def test_the_targets_are_not_in_the_process_that_runs_the_model(cli, tmp_path):
    result, run_dir, record = _run(cli, tmp_path, FIXTURES / "frame_walk")
    assert result.code == 1
    model_log = _log(run_dir, "eval-model-rank0.log")
    assert "FRAME-WALK targets found: False" in model_log and "targets found: True" not in model_log
    assert_caught_looking_ahead(record)  # its fallback: the next input token
    assert record["eval"]["scorer_clean"] is True
    assert any("introspection" in w for w in record["warnings"]), record["warnings"]


def test_the_validation_file_cannot_be_read_in_training_or_evaluation(cli, tmp_path, cache_dir, monkeypatch):
    from harness.data.prepare import prepare_data
    from harness.tracks.spec import load_track

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(cache_dir))  # the tiny track's corpus, where the run finds it
    val = prepare_data(load_track(str(TINY_TRACK))).val[0].path
    sub = tmp_path / "reads_val"
    shutil.copytree(FIXTURES / "reads_val", sub)
    (sub / "target.json").write_text(json.dumps({"val": str(val)}))
    result, run_dir, record = _run(cli, tmp_path, sub)
    assert result.code == 1
    # Training ranks: Landlock refuses the open. Evaluation's model process: not even in its root.
    for log, why in (("rank0.log", "PermissionError"), ("eval-model-rank0.log", "FileNotFoundError")):
        text = _log(run_dir, log)
        assert f"READ-VAL: could not read ({why})" in text and "READ-VAL training: read" not in text, log
    assert record["sandbox"]["training"]["active"] and record["sandbox"]["evaluation"]["model"]["active"]
    assert_caught_looking_ahead(record)


def test_remembering_prefixes_does_not_survive_the_check(cli, tmp_path):
    """The re-run batch goes to another model process that never saw the original and starts only after
    the first one and everything it started are dead (its private folder removed): nothing to read."""
    result, run_dir, record = _run(cli, tmp_path, FIXTURES / "memo_peek")
    assert result.code == (0 if record["status"] == "ok" else 1), record["reason"]
    seen = []
    for log in ("eval-check-rank0.log", "eval-model-rank0.log"):
        text = _log(run_dir, log)
        assert "read another process's memory" not in text, f"{log}: the model processes reached each other"
        # Its own output's path is its only name for itself: it must not say which of the two it is.
        paths = [line.split(" is ", 1)[1] for line in text.splitlines() if line.startswith("MEMO-PEEK fd ")]
        assert len(paths) == 2, text[-2000:]
        assert not any(role in p for p in paths for role in ("check", "model")), paths
        seen += paths
    assert len(set(seen)) == 2, "each model process writes its own log"
    assert_never_ranked_looking_ahead(record)  # its memory makes it history-dependent: often inconclusive


def test_the_scoring_process_runs_first_and_cannot_learn_which_batches_are_checked(cli, tmp_path):
    """The first model process leaves a message in its own log (the size of its stdout); the second
    looks for the first one's log by its role's name (stat() is not Landlock's) and, if the first was
    the check, looks ahead in every batch the check did not see. The scoring process always runs
    first, and the logs get their names only when both processes are dead: the second finds nothing,
    and neither looks ahead. (When the check could run first, this forged a passing 1.03 against the
    source's floor of 1.66.)"""
    result, run_dir, record = _run(cli, tmp_path, FIXTURES / "log_channel")
    assert result.code == 0, record["reason"]
    model_log, check_log = _log(run_dir, "eval-model-rank0.log"), _log(run_dir, "eval-check-rank0.log")
    assert "LOG-CHANNEL role=first" in model_log and "LOG-CHANNEL role=first" in check_log, check_log[-2000:]
    assert "looked ahead" not in model_log + check_log
    assert record["val_loss"] > record["loss_floor"] and record["eval"]["causality"]["causal"] is True


@pytest.mark.parametrize("fixture", ["sibling_watch", "udp_peek"])
def test_the_scoring_process_is_gone_before_the_check_process_starts(cli, tmp_path, fixture):
    """Two ways a scoring process could learn of the check: watching its sibling in /proc (busy means
    this batch is being re-run: answer honestly) and talking to it (UDP on loopback and unix sockets
    by path are not Landlock's). The check process starts only after the scoring process and all it
    started are dead, on every rank: no forged low score passes the check."""
    result, run_dir, record = _run(cli, tmp_path, FIXTURES / fixture)
    assert result.code == 1
    c = record["eval"]["causality"]
    assert not (c["causal"] is True and record["val_loss"] is not None), "a forged score passed the check"
    assert_caught_looking_ahead(record)
    model_log, check_log = _log(run_dir, "eval-model-rank0.log"), _log(run_dir, "eval-check-rank0.log")
    if fixture == "sibling_watch":
        # It never saw a busy process beside it (in its PID namespace its parent is outside, pid 0: what
        # it calls siblings are the host's kernel threads, never the checker, which is not yet started).
        assert "SIBLING-WATCH siblings" in model_log and "busy True" not in model_log
    else:
        assert "UDP-PEEK heard from 0 other" in check_log and "UDP-PEEK heard from 1" not in check_log + model_log


def test_patching_what_an_evaluator_would_call_changes_nothing(cli, tmp_path, cache_dir):
    """cross_entropy, log_softmax, torch.equal and json.dump(s), patched at import: the score is computed
    in a process that never imports the submission, so it is the honest one. (Patched clocks:
    test_gaming.py's clock_cheat.)"""
    result, run_dir, record = _run(cli, tmp_path, FIXTURES / "patcher", track=one_rank(tmp_path))
    assert record["status"] == "ok", record["reason"]
    assert record["val_loss"] == pytest.approx(independent_val_loss(run_dir, cache_dir, bigram=True), abs=1e-6)
    assert record["val_loss"] > record["loss_floor"] and not record["flagged"]
    assert any("patching" in w for w in record["warnings"])


def test_a_compiled_get_model_is_trained_once_and_evaluated_plain(cli, tmp_path):
    result, run_dir, record = _run(cli, tmp_path, FIXTURES / "compiled_get_model", "--grace-s", "90")
    assert result.code == 0, record["reason"]
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert list(ckpt["model"]) == ["table.weight"], "a compiled wrapper's prefix leaked into the checkpoint"
    assert record["compiled"] is True and record["first_step_s"] > 0  # the step that compiled (extra: flattened)
    assert record["eval"]["causality"]["causal"] is True
    assert "torch._dynamo" not in _log(run_dir, "eval-model-rank0.log")
    assert not record["flagged"], record["flag_reason"]  # an honest compiled model is never caught


def test_a_model_process_holds_only_what_it_was_given_and_draws_like_a_fresh_one(cli, tmp_path):
    """Both model processes are forks of clean copies of the scorer's template (one import of torch
    for the two; the record says how they started). Each holds its stdin (/dev/null), its log, its
    two pipes and its logits buffer, nothing of the template (no socket); its environment is the
    private one; its random generators are seeded afresh, as a new interpreter's are; and the harness
    frames it inherited are shaped alike in both (no history of the first in the second's memory). A training
    rank's PID 1, the job's (a fork of the namespace holder), shows in /proc/1/cmdline no argument of the
    launcher's: not its pid, nor the holder's socket, nor the private folder."""
    import re

    from harness.ranks.confine.sandbox import KEEP_ENV, KEEP_ENV_PREFIXES

    result, run_dir, record = _run(cli, tmp_path, FIXTURES / "fork_probe")
    assert result.code == 0, record["reason"]
    assert record["eval"]["model_processes"] == "forked from a clean template"
    private = {"HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "PYTHONDONTWRITEBYTECODE"}
    draws, frames = [], []
    for name in ("eval-model-rank0.log", "eval-check-rank0.log"):
        text = _log(run_dir, name)
        held = re.findall(r"^FORK-PROBE fd (\d+) (.*)$", text, re.M)
        assert held, text[-2000:]
        kinds = [("null" if t == "/dev/null" else "log" if "/.live/eval-" in t else "pipe" if t.startswith("pipe:")
                  else "buffer" if t.startswith("/memfd:harness-logits") else t) for _, t in held]
        assert sorted(set(kinds)) == ["buffer", "log", "null", "pipe"], (name, held)
        assert kinds.count("pipe") == 2 and kinds.count("null") == 1, (name, held)
        env = re.search(r"^FORK-PROBE env (.*)$", text, re.M).group(1).split()
        odd = {k for k in env if k not in KEEP_ENV and not k.startswith(KEEP_ENV_PREFIXES) and k not in private}
        assert not odd, odd
        cwd, home = re.search(r"^FORK-PROBE cwd (\S+) path0 \S+ home (\S+)$", text, re.M).groups()
        assert cwd == home and "harness-model-" in cwd
        draws.append(re.search(r"^FORK-PROBE draws (.*)$", text, re.M).group(1).split())
        frames.append(json.loads(re.search(r"^FORK-PROBE frames (.*)$", text, re.M).group(1)))
    assert all(a != b for a, b in zip(*draws)), draws  # Python's, numpy's, torch's
    assert any(f[0] == "ranks/models/model_template.py" for f in frames[0]), frames[0]  # what is compared is there
    assert frames[0] == frames[1], frames
    pid1 = json.loads(re.search(r"^FORK-PROBE pid1 (.*)$", _log(run_dir, "rank0.log"), re.M).group(1))
    if record["job_namespace"]["pid_namespace"]:  # the job's own /proc: PID 1 hidden (hidepid=ptraceable), or
        # where that /proc could not be hardened, the interpreter, then its flags and module: nothing else
        assert (pid1[0].startswith("unreadable")
                or pid1[1:] == ["-u", "-P", "-m", "harness.launcher.control.namespace_holder"]), pid1


def test_what_a_model_process_says_once_it_has_seen_validation_tokens_never_reaches_the_record(cli, tmp_path):
    """leaks_in_error raises, on its first scoring batch, an exception whose message is that batch's tokens.
    The run is `crashed` at the team's line and the exception's name; the words (message, traceback) stay in
    the model process's own log, the organisers', and nowhere a team reads: the record, the console, the
    launcher's and the scorer's logs. A failure before any batch (loading the model) keeps its words."""
    import re

    result, run_dir, record = _run(cli, tmp_path, FIXTURES / "leaks_in_error")
    assert record["status"] == "crashed", record["reason"]
    assert re.match(r"evaluation: rank 0: submission\.py:\d+: RuntimeError, after validation tokens were handed out "
                    r"\(its message and traceback are in logs/eval-model-rank0\.log, the organisers'", record["reason"]), \
        record["reason"]
    assert "LEAKED-TOKENS" in _log(run_dir, "eval-model-rank0.log")  # kept where the organisers read it
    assert "LEAKED-TOKENS" not in (run_dir / "run.json").read_text() + result.out + result.err
    for log in (run_dir / "logs").iterdir():
        if not log.name.startswith(("eval-model-", "eval-check-")):
            assert "LEAKED-TOKENS" not in log.read_text(errors="replace"), log.name


def test_a_withheld_failure_names_only_a_file_and_line_the_scorer_writes_from_the_submission(tmp_path):
    """The file:line of a failure after validation tokens are out is the scorer's own writing: a report's path
    that walks through other text to a real file (`<folder>/<tokens>/../submission.py`) is written as the file's
    name, a line the file does not have or a file that is not the submission's is left out, and an exception
    name that is not Python's is "an exception"."""
    from harness.scoring.workers import withheld_reason

    (tmp_path / "submission.py").write_text("a = 1\nb = 2\nc = 3\n")
    (tmp_path / "notes.txt").write_text("x\n")
    tokens = "鐖莂嬻" * 40

    def reason(site, exception="RuntimeError", cause="exception"):
        return withheld_reason({"site": site, "exception": exception, "cause": cause, "reason": tokens}, str(tmp_path),
                               "eval-model-rank0.log")

    assert reason(f"{tmp_path}/submission.py:2").startswith("submission.py:2: RuntimeError, after validation tokens")
    crafted = reason(f"{tmp_path}/{tokens}/../submission.py:1")
    assert crafted.startswith("submission.py:1: RuntimeError,") and tokens[:3] not in crafted, crafted
    for site in (f"{tmp_path}/submission.py:99", f"{tmp_path}/notes.txt:1", "/etc/passwd:1", f"{tmp_path}/submission.py:x",
                 f"{tmp_path}/submission.py:²"):
        assert reason(site).startswith("RuntimeError, after"), site
    assert reason(f"{tmp_path}/submission.py:1", "Tokens_15_14_81").startswith("submission.py:1: an exception, after")
    # torch's OutOfMemoryError is not Python's: the cause, from a closed set, still tells an honest team
    assert reason(f"{tmp_path}/submission.py:1", "OutOfMemoryError", "oom").startswith("submission.py:1: out of memory,")


def test_once_validation_tokens_are_out_no_model_process_of_the_scorer_speaks_in_the_record(tmp_path, monkeypatch):
    """The scorer's end of the wire (ModelWorker._expect): a model process's own words (an error report, the
    figures of a malformed message) reach the record before any model process of the scorer was handed a batch,
    and never after, even from a process started after that one (the check process, which could have learnt
    them from what the scoring process left, cached pages of a file for one) before its own first batch."""
    import os

    from harness.ranks.models import wire
    from harness.scoring import workers
    from harness.scoring.children import WorkerFailed

    (tmp_path / "submission.py").write_text("x = 1\n")

    def fails_with(message: bytes, kind: int = wire.LOGITS) -> str:
        worker = object.__new__(workers.ModelWorker)
        read, write = os.pipe()
        worker.replies, worker.setup = read, {"submission_dir": str(tmp_path)}
        worker.log_path = tmp_path / "eval-check-rank0.log"
        os.write(write, message)
        try:
            with pytest.raises(WorkerFailed) as failed:
                worker._expect(kind)
        finally:
            os.close(read)
            os.close(write)
        return str(failed.value)

    report = json.dumps({"status": "crashed", "reason": "LEAKED 15 14 81", "site": f"{tmp_path}/submission.py:1",
                         "exception": "RuntimeError"}).encode()
    error = wire.HEADER.pack(wire.MAGIC, wire.ERROR, 0, 0, 0, len(report)) + report
    malformed = wire.HEADER.pack(wire.MAGIC, wire.LOGITS, 0, 0, 0, 978281779)
    bad_json = wire.HEADER.pack(wire.MAGIC, wire.READY, 0, 0, 0, 7) + b'{"a": ['  # the check process's `ready`
    monkeypatch.setattr(workers, "_tokens_handed", False)
    assert fails_with(error) == "LEAKED 15 14 81"  # before any batch: its words (a setup error) are kept
    assert "978281779" in fails_with(malformed)
    assert fails_with(bad_json, wire.READY).startswith("the model process sent an unreadable message (Expecting")
    monkeypatch.setattr(workers, "_tokens_handed", True)  # a model process of this scorer was handed a batch
    assert fails_with(error).startswith("submission.py:1: RuntimeError, after validation tokens were handed out")
    assert fails_with(malformed) == "the model process sent a malformed message"
    assert fails_with(bad_json, wire.READY) == "the model process sent an unreadable message"  # no line, column


def test_handing_a_model_process_a_batch_puts_validation_tokens_out_for_every_later_one(monkeypatch):
    """submit() is where tokens go out: after it, a model process never handed a batch (the check process) has
    its words withheld too; harness doctor's probe, whose tokens are its own, keeps them."""
    import os

    import numpy as np

    from harness.scoring import workers

    monkeypatch.setattr(workers, "_tokens_handed", False)
    for validation, out in ((False, False), (True, True)):
        sender = object.__new__(workers.ModelWorker)
        sender._validation = validation
        read, sender.requests = os.pipe()
        try:
            sender.submit(np.zeros((1, 4), dtype=np.int64))
        finally:
            os.close(read)
            os.close(sender.requests)
        later = object.__new__(workers.ModelWorker)  # never handed a batch itself
        assert later._withheld() is out and sender._withheld() is out, validation


PARTIAL_VAL_TOKENS = 125 * 64  # 7 full batches of 16 windows and one of 13


@pytest.fixture(scope="module")
def honest_run(tmp_path_factory, cache_dir):
    """The team-like model (depthwise convolution, rotary attention, dropout, a 0-dim parameter), trained
    once on `tiny` (one rank, to the budget); re-scored below at 1, 2 and 3 ranks. --val-tokens 8000:
    125 windows of 64, so the last batch holds 13 windows, not 16. In float32 whatever the CPU: the
    figure is recomputed below in float32 to 1e-6, and `auto` means bf16 autocast on a CPU with bf16
    instructions (the two figures then differ by 6e-5 nats, seen on an AMX machine)."""
    import os
    import subprocess
    import sys

    work = tmp_path_factory.mktemp("honest")
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(work / "runs")}
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(FIXTURES / "team_like"), "--track",
                           str(one_rank(work, dtype="float32")), "--val-tokens", str(PARTIAL_VAL_TOKENS)], capture_output=True, text=True,
                          env=env, cwd=work, timeout=600)
    run_dir, record = only_record(work / "runs")
    assert proc.returncode == 0, record["reason"]
    return run_dir, record, env, work


def test_an_honest_model_is_scored_as_computed_independently(honest_run, cache_dir):
    run_dir, record, _, _ = honest_run
    assert record["status"] == "ok" and not record["flagged"]
    c = record["eval"]["causality"]
    assert c["causal"] is True and c["worst_deviation"] <= c["tolerance"] and c["checked_batches"] >= 2
    assert c["verdict"] == "causal" and c["reproduction_deviation"] <= c["tolerance"] and c["reproduced_batches"] == 1
    assert record["track"]["data"]["val_tokens"] == PARTIAL_VAL_TOKENS
    assert record["precision"] == "float32"
    assert record["val_loss"] == pytest.approx(independent_val_loss(run_dir, cache_dir, val_tokens=PARTIAL_VAL_TOKENS),
                                               abs=1e-6)
    assert record["eval"]["scorer_clean"] is True


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_an_honest_model_is_never_caught_at_any_number_of_ranks(honest_run, ranks):
    """The same figure (within 1e-6) and a passed causality check at 1, 2 and 3 scorer ranks (3 ranks
    with a partial last round: 8 batches over 3 ranks, the last of them partial), and each equal to the
    figure computed here without the harness."""
    import subprocess
    import sys

    run_dir, record, env, work = honest_run
    proc = subprocess.run([sys.executable, "-m", "harness", "eval", str(run_dir), "--nproc-per-node", str(ranks),
                           "--json"], capture_output=True, text=True, env=env, cwd=work, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "ok" and out["world_size"] == ranks
    assert out["val_loss"] == pytest.approx(record["val_loss"], abs=1e-6)
    assert out["val_tokens"] == PARTIAL_VAL_TOKENS
    assert out["causality"]["causal"] is True and out["causality"]["worst_deviation"] <= out["causality"]["tolerance"]
    # one a rank, but for a rank all of whose batches the secret draw checked (8 batches over 3 ranks: one has 2)
    assert out["causality"]["verdict"] == "causal" and 1 <= out["causality"]["reproduced_batches"] <= ranks


def test_masked_vocabulary_entries_at_minus_infinity_agree():
    """An honest model that masks a padded vocabulary with -inf gives -inf log-probabilities on both
    runs: -inf - -inf is NaN, which must count as agreement, not as an infinite deviation; a NaN or
    -inf on one side only is still the largest disagreement."""
    from harness.scoring import plan

    logits = torch.randn(2, 8, 16)
    logits[..., 12:] = float("-inf")
    cuts = [3, 5]
    assert plan.deviation(logits, logits.clone(), cuts)[0] == 0.0
    assert plan.deviation_kept(plan.keep_for_check(logits, cuts), logits.clone(), cuts)[0] == 0.0
    other = logits.clone()
    other[0, 2, 12] = 0.0  # a masked entry unmasked before the cut: a real difference
    assert plan.deviation(logits, other, cuts)[0] > 1e30
    other = logits.clone()
    other[1, 4, 0] = float("nan")
    assert plan.deviation_kept(plan.keep_for_check(logits, cuts), other, cuts)[0] > 1e30
    assert plan.deviation(logits, other, cuts)[1] == 1


@pytest.mark.parametrize("claimed, status", [("invalid", "invalid"), ("crashed", "crashed"), ("ok", "crashed"),
                                             ("timeout", "crashed"), ("oom", "crashed"), (None, "crashed"),
                                             (["ok"], "crashed")])
def test_a_model_process_cannot_choose_its_own_status(claimed, status):
    """The model process runs team code, so its error report is the team's word: only `invalid` or
    `crashed` is taken from it; anything else (ok, timeout, a list...) is a crash."""
    import os

    from harness.ranks.models.wire import ERROR, send
    from harness.scoring.workers import ModelWorker, WorkerFailed

    worker = object.__new__(ModelWorker)
    worker.replies, w = os.pipe()
    try:
        send(w, ERROR, payload=json.dumps({"status": claimed, "reason": "because"}).encode())
        with pytest.raises(WorkerFailed) as caught:
            worker.wait_ready()
        assert caught.value.harness_status == status
    finally:
        os.close(worker.replies)
        os.close(w)


def test_the_sandbox_report_recorded_is_the_one_sent_before_team_code():
    """The sandbox report travels in its own message right after the sandbox is entered, before any team
    code is imported; a `ready` that claims another report (rewritten by the submission through frames
    or gc) is not what is recorded, and a `ready` without the early report is refused."""
    import os

    from harness.ranks.models.wire import READY, SANDBOX, send
    from harness.scoring.workers import ModelWorker, WorkerFailed

    def worker(*messages, required=False):
        w = object.__new__(ModelWorker)
        w.setup = {"sandbox": "required" if required else "auto"}
        w.replies, end = os.pipe()
        for kind, body in messages:
            send(end, kind, payload=json.dumps(body).encode())
        os.close(end)
        return w

    honest = {"active": False, "why": "no Landlock here"}
    forged = {"active": True, "why": "Landlock ABI 7"}
    w = worker((SANDBOX, honest), (READY, {"sandbox": forged, "params": 3}))
    assert w.wait_ready() == {"sandbox": honest, "params": 3}
    with pytest.raises(WorkerFailed, match=r"^the model process answered message \d+, expected \d+$"):
        worker((READY, {"sandbox": forged, "params": 3})).wait_ready()
    with pytest.raises(WorkerFailed) as caught:
        worker((SANDBOX, honest), (READY, {"sandbox": forged}), required=True).wait_ready()
    assert str(caught.value) == "the track requires the sandbox and it is not active: no Landlock here"


def test_logits_that_are_not_the_batchs_shape_are_refused():
    """The model process names the shape of the logits it wrote; a patched one could name any. The scorer
    takes only logits for exactly the batch it sent (rows x seq_len), and only in a dtype it knows."""
    import os

    from harness.ranks.models import wire
    from harness.scoring.workers import ModelWorker, WorkerFailed

    for (rows, seq_len, code), status in (((3, 8, 1), "invalid"), ((2, 16, 1), "invalid"), ((1, 16, 1), "invalid"),
                                          ((2, 8, 77), "crashed")):
        worker = object.__new__(ModelWorker)
        worker._shape = (2, 8)
        worker.replies, w = os.pipe()
        wire.send(w, wire.LOGITS, rows, seq_len, code)
        os.close(w)
        with pytest.raises(WorkerFailed) as caught:
            worker.logits(16)
        assert caught.value.harness_status == status, (rows, seq_len, code)
        # Not its figures: it chose them, having seen validation tokens (they would carry 64 bits a run).
        assert str(caught.value) == ("the model process answered a batch of (2, 8) tokens with logits of another shape"
                                     if status == "invalid" else "the model process named an unknown logits dtype")
        os.close(worker.replies)


def test_a_process_is_killed_only_while_it_is_the_one_that_was_found():
    """kill_tree finds processes by pid in /proc and then signals them; a pid freed and reused by an
    unrelated process in between must not be signalled. The process is pinned (pidfd) and its parent
    checked after the pin: a wrong parent leaves it alone, the right one kills it."""
    import os
    import subprocess

    from harness.scoring.workers import _kill_if_still

    child = subprocess.Popen(["sleep", "60"])
    try:
        assert _kill_if_still(child.pid, {os.getpid() + 1_000_000}) is False
        assert child.poll() is None, "a process whose parent is not the one found was signalled"
        assert _kill_if_still(child.pid, {os.getpid()}) is True
        assert child.wait(timeout=10) == -9
    finally:
        child.kill()
        child.wait()


def test_a_model_process_cannot_announce_a_payload_of_any_size():
    """A header from the model process names the payload's size; the scorer would have read (and held)
    whatever it said. Each kind of message has a cap, checked before a byte of the payload is read."""
    import os

    from harness.ranks.models import wire
    from harness.scoring.workers import ModelWorker, WorkerFailed

    for kind, size in ((wire.READY, 1 << 40), (wire.ERROR, 1 << 30), (wire.LOGITS, 1), (wire.SANDBOX, 1 << 24), (99, 0)):
        r, w = os.pipe()
        os.write(w, wire.HEADER.pack(wire.MAGIC, kind, 0, 0, 0, size) + b"x" * min(size, 16))
        os.close(w)
        with pytest.raises(ValueError, match="message"):
            wire.receive(r)
        os.close(r)
    r, w = os.pipe()
    wire.send(w, wire.READY, payload=json.dumps({"params": 3}).encode())
    os.close(w)
    assert wire.receive(r)[0] == wire.READY
    os.close(r)

    worker = object.__new__(ModelWorker)
    worker.setup, worker.log_path = {}, __import__("pathlib").Path("eval-model-rank0.log")
    worker.replies, w = os.pipe()
    os.write(w, wire.HEADER.pack(wire.MAGIC, wire.SANDBOX, 0, 0, 0, 1 << 40))
    os.close(w)
    with pytest.raises(WorkerFailed) as caught:
        worker.wait_ready()
    assert caught.value.harness_status == "crashed"
    assert str(caught.value).startswith("the model process sent "), str(caught.value)
    os.close(worker.replies)
