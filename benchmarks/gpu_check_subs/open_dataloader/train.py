"""scripts/gpu-check's open-division script (benchmarks/gpu_check.py): the starter kit's shape, fed by a
torch DataLoader with worker processes over the shards, as teams bring from their own training code.
The harness runs it in its sandbox; the workers are forked there and hand their batches back through
shared memory. model.py is submissions/open_example's, copied beside it by gpu_check.py.

    harness run <this folder with model.py and submission.toml> --track dev-gpu --max-steps 20

Each batch carries the id of the worker that made it: rank 0 prints which workers served it
(`gpu-check-dataloader {...}` in logs/rank0.log), so a loader that fell back to the main process is seen.
"""

import argparse
import glob
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

from model import get_model

from harness.ranks import open_api as harness

p = argparse.ArgumentParser()
for name in ("data_dir", "checkpoint_path"):
    p.add_argument(f"--{name}", required=True)
for name, default in (("vocab_size", 32000), ("seq_len", 1024), ("n_layer", 2), ("n_head", 4), ("n_embd", 128),
                      ("batch_size", 8), ("max_steps", 20), ("num_workers", 2)):
    p.add_argument(f"--{name}", type=int, default=default)
p.add_argument("--time_limit_min", type=float, default=10.0)
p.add_argument("--learning_rate", type=float, default=3e-3)
args = p.parse_args()


class Windows(Dataset):
    """Every whole (seq_len + 1)-token window of the raw uint16 shards; each worker opens its own memmaps."""

    def __init__(self, paths: list[str], seq_len: int):
        self.paths, self.span = paths, seq_len + 1
        self.starts = np.cumsum([0] + [os.path.getsize(path) // 2 // self.span for path in paths])
        self.shards = None

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int):
        if self.shards is None:  # opened in the worker, after the fork
            self.shards = [np.memmap(path, dtype="<u2", mode="r") for path in self.paths]
        s = int(np.searchsorted(self.starts, i, side="right")) - 1
        first = (i - int(self.starts[s])) * self.span
        worker = get_worker_info()  # None: the main process made this batch
        tokens = torch.from_numpy(self.shards[s][first:first + self.span].astype(np.int64))
        return tokens, -1 if worker is None else worker.id


cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
torch.manual_seed(1)
config = {"vocab_size": args.vocab_size, "n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd,
          "seq_len": args.seq_len}
raw = get_model(config).to(device)
model = DDP(raw)
opt = torch.optim.AdamW(raw.parameters(), lr=args.learning_rate, weight_decay=0.1)
windows = Windows(sorted(glob.glob(os.path.join(args.data_dir, "*.bin"))), args.seq_len)
loader = DataLoader(windows, batch_size=args.batch_size, num_workers=args.num_workers, pin_memory=cuda, drop_last=True,
                    sampler=DistributedSampler(windows, num_replicas=world, rank=rank, seed=1, drop_last=True))
autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cuda)
tokens_per_step = world * args.batch_size * args.seq_len
limit_s, step, loss, served = args.time_limit_min * 60, 0, torch.zeros(()), set()
stop = torch.zeros(1, device=device)

harness.first_forward()
t0 = time.perf_counter()
batches = iter(loader)  # starts the worker processes
for batch, workers in batches:
    stop[0] = float(step >= args.max_steps or time.perf_counter() - t0 >= limit_s)
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops on the same step
    if stop.item():
        break
    served.update(workers.tolist())
    batch = batch.to(device, non_blocking=True)
    with autocast:
        _, loss = model(batch[:, :-1], batch[:, 1:])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    step += 1
    if rank == 0:
        harness.progress(step, step * tokens_per_step, loss.item())
del batches  # its workers end here (the iterator's shutdown), before the process group
if rank == 0:
    report = {"num_workers": args.num_workers, "served_by": sorted(served), "steps": step}
    print("gpu-check-dataloader", json.dumps(report), flush=True)
    harness.training_done(step, step * tokens_per_step, loss.item())
    torch.save({"step": step, "model": raw.state_dict(), "config": config}, args.checkpoint_path)
dist.barrier()
dist.destroy_process_group()
