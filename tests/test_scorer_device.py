"""Evaluation on a GPU track, proven on a CPU (issue 23, items 3, 16 and 18).

The scorer never touches CUDA (a GPU in EXCLUSIVE_PROCESS mode holds one context, its model process's);
each model process sees only its rank's GPU; and the logits are read out of the shared buffer once, into
a private float32 buffer reused from batch to batch, never cloned again or copied to a device.
The scorer's own loop runs here in this process with a stand-in for the model process: what it asks of
CUDA is recorded, whatever the build (a CPU build would answer without a driver)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from harness.ranks.jobs import EvalJob
from harness.ranks.process import RankEnv
from harness.scoring import scorer

QUERIES = ("is_available", "device_count", "init", "current_device", "get_device_name", "get_device_properties",
           "get_device_capability", "set_device", "mem_get_info", "synchronize", "_lazy_init", "is_initialized")
VOCAB, SEQ = 16, 8


class StandIn:
    """The model process, as the scorer sees it: uniform logits for every batch."""

    made: list["StandIn"] = []

    def __init__(self, *, setup, buffer_bytes, log_dir, protected, template=None, scratch_dir=None):
        self.setup, self.exposed, self.log_path, self.rows, self.left_running = setup, [], None, 0, 0
        self.returned: list[torch.Tensor] = []
        StandIn.made.append(self)

    def wait_ready(self):
        return {"sandbox": {"active": True}}

    def submit(self, x):
        self.rows = int(x.shape[0])

    def logits(self, vocab):
        out = torch.zeros(self.rows, SEQ, vocab)
        self.returned.append(out)
        return out

    def close(self):
        pass


@pytest.fixture
def cuda_calls(monkeypatch):
    called: list[str] = []
    for name in QUERIES:
        if hasattr(torch.cuda, name):
            real = getattr(torch.cuda, name)
            monkeypatch.setattr(torch.cuda, name,
                                lambda *a, _n=name, _r=real, **k: called.append(_n) or _r(*a, **k))
    return called


def _gpu_job(tmp_path) -> EvalJob:
    checkpoint = tmp_path / "checkpoint.pt"
    checkpoint.write_bytes(b"weights")
    return EvalJob(checkpoint=str(checkpoint), checkpoint_sha256="", submission_dir=str(tmp_path), val_shards=[],
                   val_tokens=SEQ * 6, seq_len=SEQ, batch_size=2, vocab_size=VOCAB, device="cuda",
                   dtype="bfloat16", collective_timeout_s=10.0, cpu_threads_per_rank=1, causality_fraction=0.5,
                   sandbox="auto", log_dir=str(tmp_path / "logs"))


def test_the_scorer_of_a_gpu_track_asks_nothing_of_cuda_and_pins_its_model_process(tmp_path, monkeypatch,
                                                                                      cuda_calls):
    import harness.scoring.template as template
    import harness.scoring.workers as workers
    from harness.scoring import plan

    StandIn.made = []
    monkeypatch.setattr(workers, "ModelWorker", StandIn)
    monkeypatch.setattr(workers, "become_subreaper", lambda: True)
    monkeypatch.setattr(template, "model_template", lambda: None)
    monkeypatch.setattr(plan, "read_val_tokens", lambda shards, n, v: np.arange(n + 1, dtype=np.int64) % v)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aaaa, GPU-bbbb")
    # The batches a rank scores follow its global rank; its GPU follows its local rank (here node 1's first rank).
    env = RankEnv(rank=0, local_rank=1, world_size=1, local_world_size=2, group_rank=0)
    result = scorer.evaluate(_gpu_job(tmp_path), env, [], [])
    assert cuda_calls == [], f"the scorer asked CUDA: {cuda_calls}"
    assert result["val_loss"] == pytest.approx(math.log(VOCAB))  # uniform logits, scored on the CPU
    scoring, check = StandIn.made
    for made in (scoring, check):
        assert (made.setup["device"], made.setup["cuda_visible_devices"]) == ("cuda:0", "GPU-bbbb")
    assert result["causality"]["checked_batches"] >= 1


@pytest.mark.parametrize("visible, rank, expected", [
    (None, 3, "3"),  # all visible: index 3 under the same CUDA_DEVICE_ORDER is cuda:3's device
    ("4,5,6", 2, "6"),
    ("GPU-1b2c, MIG-9f", 1, "MIG-9f"),
])
def test_a_model_process_is_shown_the_gpu_its_rank_names(visible, rank, expected):
    assert scorer.one_visible_device(visible, rank) == expected


def test_a_rank_beyond_the_visible_gpus_is_told_how_many_there_are():
    with pytest.raises(RuntimeError, match=r"lists 2; give `harness eval` --nproc 2 or fewer"):
        scorer.one_visible_device("0,1", 2)


def test_the_logits_are_read_once_into_a_reused_private_buffer(tmp_path):
    """bf16 logits in the shared buffer become float32 in the worker's own buffer, the same one each batch
    (no clone per batch, no second conversion); a later write to the shared buffer changes nothing read."""
    import mmap

    from harness.ranks.models.wire import DTYPES
    from harness.scoring.workers import ModelWorker

    code = {v: k for k, v in DTYPES.items()}["bfloat16"]
    worker = object.__new__(ModelWorker)
    worker.buffer = mmap.mmap(-1, 2 * 3 * VOCAB * 2)
    worker._private = None
    shared = torch.frombuffer(worker.buffer, dtype=torch.bfloat16, count=2 * 3 * VOCAB).view(2, 3, VOCAB)
    firsts = []
    for value in (1.5, -2.25):
        shared.fill_(value)
        worker._shape = (2, 3)
        worker._expect = lambda kind: ((2, 3, code), {})
        got = worker.logits(VOCAB)
        assert got.dtype == torch.float32 and bool((got == value).all())
        firsts.append(got.data_ptr())
        shared.fill_(99.0)  # the model process writes again: what was read stays what it was
        assert bool((got == value).all())
    assert firsts[0] == firsts[1]


@pytest.mark.slow
def test_every_process_that_scores_or_checks_a_model_compiles_deterministically(cli, tmp_path):
    """Inductor's deterministic mode in the check process, the scoring process and the check's model process
    (issue 23, item 17): the fixture's evaluation forward fails anywhere it is off (on the old code, in the
    check before training)."""
    from conftest import FIXTURES, only_record, quick_track

    result = cli("run", str(FIXTURES / "compiles_in_eval"), "--track", str(quick_track(tmp_path)))
    _, record = only_record(tmp_path / "runs")
    assert (result.code, record["status"]) == (0, "ok"), record["reason"]
    assert record["eval"]["causality"]["checked_batches"] >= 1  # the check's model process ran forward too


def _slow_to_die(monkeypatch, dying: bool, gone_after_s: float):
    """A killed model process that the kernel takes `gone_after_s` to remove (a GPU driver's teardown)."""
    import time

    import harness.scoring.workers as workers

    t0 = time.monotonic()
    monkeypatch.setattr(workers, "descendants", lambda root: {})
    monkeypatch.setattr(workers, "_proc_stat", lambda pid: None)
    monkeypatch.setattr(workers, "_kill_if_still", lambda pid, parents: time.monotonic() - t0 < gone_after_s)
    monkeypatch.setattr(workers, "_dying", lambda pid: dying)
    return workers


def test_a_model_process_still_tearing_its_gpu_down_is_waited_for(monkeypatch):
    """Past the kill's 10 s, a process that is only exiting (it runs nothing of its own) is given its teardown;
    on the old code the evaluation failed (issue 23, item 19)."""
    workers = _slow_to_die(monkeypatch, dying=True, gone_after_s=0.5)
    workers.kill_tree(999_999_999, timeout_s=0.1, teardown_s=5.0)


def test_a_process_that_still_runs_after_the_kill_fails_the_evaluation_at_once(monkeypatch):
    workers = _slow_to_die(monkeypatch, dying=False, gone_after_s=60)
    with pytest.raises(RuntimeError, match="could not be ended"):
        workers.kill_tree(999_999_999, timeout_s=0.1, teardown_s=5.0)


def test_a_teardown_that_never_ends_is_bounded(monkeypatch):
    workers = _slow_to_die(monkeypatch, dying=True, gone_after_s=60)
    with pytest.raises(RuntimeError, match="still exiting"):
        workers.kill_tree(999_999_999, timeout_s=0.1, teardown_s=0.3)


def test_a_sleeping_process_is_not_dying_and_a_finished_one_is():
    import subprocess

    from harness.scoring.workers import _dying

    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert not _dying(proc.pid)
        proc.kill()
        import time

        for _ in range(200):  # killed and not yet reaped: a zombie, past the kernel's exit path
            if open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.01)
        assert _dying(proc.pid)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("given, runs, device, gpus, expected", [
    (None, 8, "cuda", 2, 2),  # the run's 8 ranks per node, rescored on a 2-GPU box: 2 (the old code asked for 8)
    (None, 8, "cuda", 8, 8),
    (1, 8, "cuda", 2, 1),
    (None, 2, "cpu", None, 2),
    (3, 2, "cpu", None, 3),
])
def test_harness_eval_uses_at_most_the_gpus_the_machine_shows(given, runs, device, gpus, expected):
    from harness.launcher.run.rescore import eval_ranks

    nproc, note = eval_ranks(given, runs, device, gpus)
    assert nproc == expected
    assert ("the figure does not depend on it" in note) == (expected < runs and given is None)


def test_harness_eval_refuses_more_ranks_than_gpus_with_the_number_there_is():
    from harness.launcher.run.rescore import eval_ranks

    with pytest.raises(ValueError, match=r"shows 2 GPU\(s\); give 2 or fewer"):
        eval_ranks(4, 8, "cuda", 2)
    with pytest.raises(ValueError, match="shows none"):
        eval_ranks(None, 8, "cuda", 0)
