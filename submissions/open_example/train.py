"""An open-division training script in the Paris 2026 starter kit's shape, runnable two ways:

    torchrun --nproc-per-node 2 train.py --data_dir DIR --checkpoint_path ckpt.pt ...   (on your own)
    harness run submissions/open_example --track local                              (scored)

Under the harness the arguments data_dir, checkpoint_path, vocab_size and time_limit_min come
from the track, and the others from submission.toml's [open.args]. The three harness calls are
optional and do nothing outside it: they let the budget start at the first forward pass (not at
process start) and show the loss live.

What it does: random windows from memmapped uint16 shards (raw, or llm.c's 1024-byte header),
DDP, bf16 autocast on a GPU, AdamW, a warm-up / stable / decay schedule driven by the fraction of
the time limit used (a schedule in steps never decays when the scored run takes fewer steps than
the team's test), every rank stopping on the same step, and rank 0 saving
{"step", "model", "config"} at --checkpoint_path.
"""

import argparse
import glob
import os
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from model import get_model

try:  # present under the harness; the script also runs without it
    from harness.ranks import open_api as harness
except ImportError:
    harness = None

LLMC_MAGIC, LLMC_HEADER_BYTES = 20240520, 1024


@dataclass
class ModelConfig:
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    seq_len: int


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--data_dir", required=True)
    p.add_argument("--checkpoint_path", required=True)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--vocab_size", type=int, default=32768)
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--grad_accum_steps", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=5000)
    p.add_argument("--time_limit_min", type=float, default=10.0)
    p.add_argument("--learning_rate", type=float, default=3e-3)
    p.add_argument("--warmup_frac", type=float, default=0.05)
    p.add_argument("--decay_frac", type=float, default=0.4)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args()


def load_shards(data_dir: str) -> list[np.ndarray]:
    shards = []
    for path in sorted(glob.glob(os.path.join(data_dir, "*.bin"))):
        head = np.fromfile(path, dtype="<i4", count=2)
        offset = LLMC_HEADER_BYTES if head.size == 2 and head[0] == LLMC_MAGIC else 0
        shards.append(np.memmap(path, dtype="<u2", mode="r", offset=offset))
    if not shards:
        raise SystemExit(f"no .bin shards in {data_dir}")
    return shards


def random_batch(shards, batch_size: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
    rows = []
    for _ in range(batch_size):
        shard = shards[rng.integers(len(shards))]
        start = rng.integers(0, len(shard) - seq_len - 1)
        rows.append(np.asarray(shard[start:start + seq_len + 1], dtype=np.int64))
    return torch.from_numpy(np.stack(rows))


def lr_multiplier(progress: float, warmup: float, decay: float) -> float:
    """Warm-up, stable, then a linear decay to zero over the last `decay` of the time limit."""
    if progress < warmup:
        return (progress + 1e-3) / warmup
    if progress > 1 - decay:
        return max(0.0, (1 - progress) / decay)
    return 1.0


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu"  # a string, as docs/submission.md says
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    rng = np.random.default_rng(args.seed * 1000 + rank)  # different windows on every rank

    cfg = ModelConfig(args.vocab_size, args.n_layer, args.n_head, args.n_embd, args.seq_len)
    raw_model = get_model(asdict(cfg)).to(device)
    model = DDP(raw_model)
    opt = torch.optim.AdamW(raw_model.parameters(), lr=args.learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    shards = load_shards(args.data_dir)
    autocast = torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda)
    limit_s = args.time_limit_min * 60
    tokens_per_step = world * args.batch_size * args.grad_accum_steps * args.seq_len
    agreed = torch.zeros(2, device=device)  # [elapsed seconds (max over ranks), loss (sum over ranks)]

    if harness:
        harness.first_forward()
    t0 = time.perf_counter()
    step, elapsed, loss_sum = 0, 0.0, 0.0
    while step < args.max_steps and elapsed < limit_s:  # no step starts past the limit, on any rank
        for group in opt.param_groups:
            group["lr"] = args.learning_rate * lr_multiplier(elapsed / limit_s, args.warmup_frac, args.decay_frac)
        loss_sum = 0.0
        for micro in range(args.grad_accum_steps):
            batch = random_batch(shards, args.batch_size, args.seq_len, rng).to(device)
            model.require_backward_grad_sync = micro == args.grad_accum_steps - 1
            with autocast:
                _, loss = model(batch[:, :-1], batch[:, 1:])
            (loss / args.grad_accum_steps).backward()
            loss_sum += loss.item() / args.grad_accum_steps
        torch.nn.utils.clip_grad_norm_(raw_model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        agreed[0], agreed[1] = time.perf_counter() - t0, loss_sum
        dist.all_reduce(agreed[:1], op=dist.ReduceOp.MAX)  # rank-independent stop: the slowest clock decides
        dist.all_reduce(agreed[1:], op=dist.ReduceOp.SUM)
        elapsed, mean_loss = agreed[0].item(), agreed[1].item() / world
        if harness and rank == 0:
            harness.progress(step, step * tokens_per_step, mean_loss)
    if harness and rank == 0:
        harness.training_done(step, step * tokens_per_step, mean_loss)
    if rank == 0:
        torch.save({"step": step, "model": raw_model.state_dict(), "config": asdict(cfg)}, args.checkpoint_path)
        print(f"saved {args.checkpoint_path}: {step} steps, {step * tokens_per_step} tokens, loss {mean_loss:.4f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
