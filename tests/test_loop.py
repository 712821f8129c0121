"""The training loop's cost per step: exactly one read of a device value (the stop vote's) per step, and
never of the step just queued.

Runs the real loop in one process (world size 1, gloo) on the bigram fixture for N and for 2N steps,
counting every call that reads a tensor's value back to the host; the difference is N: one per step,
whatever happens at start-up and after the clock. The same run logs, in order, each vote's all-reduce,
each backward and each read: the read of a vote comes after the next step's backward was queued (on a
GPU the device then has that step to run while the host waits, and prepares the one after).
"""

import pytest
import json
import subprocess
import sys

from conftest import FIXTURES, ROOT

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)

SCRIPT = r"""
import json, os, socket, sys, tempfile
import numpy as np, torch
from torch.overrides import TorchFunctionMode

with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
from harness.data.shards import inspect_shard, write_shard
from harness.ranks.channel import ChannelClient
from harness.ranks.jobs import TrainJob
from harness.ranks.training.loop import train
from harness.ranks.process import RankEnv, release_and_exit

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
         torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}


EVENTS = []  # in order: "vote" (the agreement's all-reduce), "backward", "read" (a read by the harness's code)
_all_reduce = torch.distributed.all_reduce


def logged_all_reduce(tensor, *args, **kwargs):
    if tensor.dtype == torch.float64 and tensor.numel() == 7:  # the vote: harness code calls dist.all_reduce
        EVENTS.append("vote")
    return _all_reduce(tensor, *args, **kwargs)


torch.distributed.all_reduce = logged_all_reduce


class CountReads(TorchFunctionMode):
    reads = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.backward:
            EVENTS.append("backward")
        if func in READS:  # attributed to the optimizer, or to the first caller outside torch
            frame, where = sys._getframe(1), None
            while frame and "/torch/" in frame.f_code.co_filename:
                if "/torch/optim/" in frame.f_code.co_filename:
                    where = "torch.optim"
                frame = frame.f_back
            where = where or (f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}" if frame else "?")
            CountReads.reads[where] = CountReads.reads.get(where, 0) + 1
            if where != "torch.optim" and not where.startswith("submission.py"):  # the harness's own reads
                EVENTS.append("read")
        return func(*args, **(kwargs or {}))


folder = tempfile.mkdtemp()
write_shard(f"{folder}/train.bin", np.random.default_rng(0).integers(0, 256, 200_000), "raw_uint16")
job = TrainJob(run_id="t", track="t", submission_dir=sys.argv[1], seed=1, budget_s=600.0, clock_start="first_forward",
               backend="gloo", device="cpu", dtype="float32", log_interval_s=1e9, collective_timeout_s=60.0,
               cpu_threads_per_rank=1, vocab_size=256, train_shards=[inspect_shard(f"{folder}/train.bin")],
               max_steps=int(sys.argv[2]), comm_probe_steps=0)
env = RankEnv.from_environ()
holders = []
with CountReads():
    result = train(job, env, ChannelClient(None, 0), holders)
print(json.dumps({"reads": CountReads.reads, "steps": result["steps"], "events": EVENTS}), flush=True)
release_and_exit(0, holders)  # as a rank leaves: gloo's threads stopped before the interpreter goes
"""


def reads_for(steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(FIXTURES / "ok_bigram"), str(steps)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_host_read_per_step():
    """The harness's own code reads one value per step (the vote); torch's AdamW reads its step count
    once per step on a CPU (not capturable), which is the optimizer's, not the loop's."""
    short, long = reads_for(5), reads_for(10)
    assert (short["steps"], long["steps"]) == (5, 10)
    extra = {k: long["reads"].get(k, 0) - short["reads"].get(k, 0) for k in {*short["reads"], *long["reads"]}}
    assert extra.pop("agree.py:read") == 5, (short, long)
    assert extra.pop("torch.optim", 0) <= 5 and not any(extra.values()), (short, long)


def test_each_vote_is_read_after_the_next_step_is_queued():
    """The host never waits for a vote before the step after it is queued: between each vote's all-reduce and
    the read of it lies a step's backward, for every step; only the vote before the first step (nothing to
    overlap) and the one after the last (the clock stops when the last step is done) are read at once.
    A loop that reads each vote before queuing the step (one blocking sync per step) fails here."""
    run = reads_for(6)
    events = run["events"]
    votes = [i for i, e in enumerate(events) if e == "vote"]
    overlapped = 0
    for i in votes:
        read = events.index("read", i)
        assert "vote" not in events[i + 1:read], "two votes in flight at once"
        overlapped += "backward" in events[i + 1:read]
    assert run["steps"] == 6 and len(votes) == 8 and overlapped == 6, events


ACCUM_SUBMISSION = '''
import torch, torch.nn as nn, torch.nn.functional as F

CONFIG = {"micro_batch_size": MICRO, "seq_len": 32, "grad_accum_steps": ACCUM}


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.table(idx)
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def get_model(config):
    return Bigram(config["vocab_size"])


def build_optimizers(model, ctx):  # plain SGD: the step is the gradient itself, its scale included
    return torch.optim.SGD(model.parameters(), lr=10.0)


def lr_schedule(progress):
    return 1.0
'''

ONE_STEP = r"""
import os, socket, sys, tempfile
import numpy as np
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
from harness.data.shards import inspect_shard, write_shard
from harness.ranks.channel import ChannelClient
from harness.ranks.jobs import TrainJob
from harness.ranks.training.loop import train
from harness.ranks.process import RankEnv, release_and_exit

folder = tempfile.mkdtemp()
write_shard(f"{folder}/train.bin", np.random.default_rng(0).integers(0, 256, 50_000), "raw_uint16")
job = TrainJob(run_id="t", track="t", submission_dir=sys.argv[1], seed=1, budget_s=600.0, clock_start="first_forward",
               backend="gloo", device="cpu", dtype="float32", log_interval_s=1e9, collective_timeout_s=60.0,
               cpu_threads_per_rank=1, vocab_size=256, train_shards=[inspect_shard(f"{folder}/train.bin")],
               max_steps=1, comm_probe_steps=0, staging_dir=sys.argv[2])
holders = []
train(job, RankEnv.from_environ(), ChannelClient(None, 0), holders)
release_and_exit(0, holders)  # as a rank leaves (see SCRIPT)
"""


def test_accumulated_gradients_equal_one_large_batch(tmp_path):
    """One optimizer step over 8 sequences, as 1 x 8 or as 4 x 2 micro-batches (the same windows of the
    stream): the update is the same; accumulation averages, it does not sum."""
    import torch

    weights = {}
    for micro, accum in ((8, 1), (2, 4)):
        sub, out = tmp_path / f"sub{accum}", tmp_path / f"out{accum}"
        sub.mkdir()
        out.mkdir()
        (sub / "submission.py").write_text(ACCUM_SUBMISSION.replace("MICRO", str(micro)).replace("ACCUM", str(accum)))
        proc = subprocess.run([sys.executable, "-c", ONE_STEP, str(sub), str(out)], capture_output=True, text=True,
                              timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
        assert ckpt["step"] == 1 and ckpt["tokens"] == 8 * 32
        weights[accum] = ckpt["model"]["table.weight"]
    torch.manual_seed(1)  # the initial weights: every rank builds the model from the run's seed
    start = torch.nn.Embedding(256, 256).weight.detach()
    step = weights[1] - start
    assert step.abs().max() > 1e-3, "the step did not move the weights: nothing was compared"
    torch.testing.assert_close(weights[4] - start, step, rtol=1e-4, atol=1e-6)


UNWRAP = """
import sys, torch
from torch.nn.parallel import DistributedDataParallel
from harness.ranks.checkpoint import unwrap

model = torch.nn.Linear(4, 4)
plain = unwrap(model)
imported_for_a_plain_model = "torch._dynamo" in sys.modules
compiled = torch.compile(model)  # wrapped, not compiled: nothing has called it
print(plain is model, imported_for_a_plain_model, unwrap(compiled) is model, type(compiled).__name__)
"""


def test_unwrap_opens_torch_compiles_wrapper_and_imports_no_dynamo_for_a_plain_model():
    # Each model process of an evaluation unwraps what get_model returns: importing torch._dynamo there
    # for a plain model costs seconds of CPU per process; a compiled one must still be opened.
    out = subprocess.run([sys.executable, "-c", UNWRAP], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "False", "True", "OptimizedModule"]
