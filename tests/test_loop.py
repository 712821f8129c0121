"""The training loop's cost per step: exactly one read of a device value (the stop vote's) per step.

Runs the real loop in one process (world size 1, gloo) on the bigram fixture for N and for 2N steps,
counting every call that reads a tensor's value back to the host; the difference is N: one per step,
whatever happens at start-up and after the clock.
"""

import json
import subprocess
import sys

from conftest import FIXTURES, ROOT

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
from harness.ranks.loop import train
from harness.ranks.process import RankEnv

READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__float__,
         torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.cpu, torch.Tensor.numpy}


class CountReads(TorchFunctionMode):
    reads = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in READS:  # attributed to the optimizer, or to the first caller outside torch
            frame, where = sys._getframe(1), None
            while frame and "/torch/" in frame.f_code.co_filename:
                if "/torch/optim/" in frame.f_code.co_filename:
                    where = "torch.optim"
                frame = frame.f_back
            where = where or (f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}" if frame else "?")
            CountReads.reads[where] = CountReads.reads.get(where, 0) + 1
        return func(*args, **(kwargs or {}))


folder = tempfile.mkdtemp()
write_shard(f"{folder}/train.bin", np.random.default_rng(0).integers(0, 256, 200_000), "raw_uint16")
job = TrainJob(run_id="t", track="t", submission_dir=sys.argv[1], seed=1, budget_s=600.0, clock_start="first_forward",
               backend="gloo", device="cpu", dtype="float32", log_interval_s=1e9, collective_timeout_s=60.0,
               cpu_threads_per_rank=1, vocab_size=256, train_shards=[inspect_shard(f"{folder}/train.bin")],
               max_steps=int(sys.argv[2]), comm_probe_steps=0)
env = RankEnv.from_environ()
with CountReads():
    result = train(job, env, ChannelClient(None, 0), [])
print(json.dumps({"reads": CountReads.reads, "steps": result["steps"]}))
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
    assert extra.pop("loop.py:vote") == 5, (short, long)
    assert extra.pop("torch.optim", 0) <= 5 and not any(extra.values()), (short, long)
