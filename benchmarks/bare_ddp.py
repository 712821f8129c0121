"""A bare torch DDP training loop: the reference the harness's overhead is measured against.

Same model (the baseline's get_model), same data (the track's train shard, random windows),
same batch, world size, backend, precision (bf16 autocast or float32, as the harness
resolved it) and AdamW as `harness run`; nothing else but the one agreement every correct DDP
loop needs (a MAX all-reduce of "time is up" per step): no schedule, no prefetch thread, no
reports. Launched with torchrun:

    torchrun --standalone --nproc-per-node 2 benchmarks/bare_ddp.py --shard PATH --duration-s 20 --out OUT.json
"""

import argparse
import json
import os
import sys
import time

T_IMPORT = time.time()  # as close to process start as Python allows

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shard", required=True)
    p.add_argument("--submission", default="submissions/baseline")
    p.add_argument("--duration-s", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--precision", choices=["bfloat16", "float32"], default="bfloat16")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    sys.path.insert(0, args.submission)
    from model import get_model  # the baseline's own model file
    import importlib.util

    spec = importlib.util.spec_from_file_location("sub_config", os.path.join(args.submission, "submission.py"))
    src = open(spec.origin).read().replace("from .model import get_model", "from model import get_model")
    config: dict = {}
    exec(compile(src, spec.origin, "exec"), config)
    cfg = dict(config["CONFIG"], vocab_size=256)
    B, T = cfg["micro_batch_size"], cfg["seq_len"]

    header = np.fromfile(args.shard, dtype="<i4", count=256)
    offset = 1024 if header[0] in (20240520, 20240801) else 0
    tokens = np.memmap(args.shard, dtype=np.uint16, mode="r", offset=offset)
    rng = np.random.default_rng(rank)

    torch.manual_seed(1)
    model = get_model(cfg)
    ddp = DDP(model, gradient_as_bucket_view=True)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.get("learning_rate", 1e-3), betas=(0.9, 0.95))
    times = []
    first_step_unix = time.time()
    t0 = time.perf_counter()
    stop = torch.zeros(1)
    while True:
        # The ranks agree on when to stop (a MAX of "time is up"), as any correct DDP loop must: a rank that
        # decides alone can start one step more than its peer and wait in that step's all-reduce for a peer
        # that has left (gloo then fails the job).
        stop.fill_(float(time.perf_counter() - t0 >= args.duration_s))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item():
            break
        starts = rng.integers(0, len(tokens) - T - 1, size=B)
        buf = torch.from_numpy(np.stack([tokens[s: s + T + 1] for s in starts]).astype(np.int64))
        x, y = buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bfloat16"):
            _, loss = ddp(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"step_end_s": times, "first_step_unix": first_step_unix, "import_unix": T_IMPORT,
                       "tokens_per_step": world * B * T}, fh)
    del ddp, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave as the harness's ranks do (harness/ranks/process.py: release_and_exit): flushed, then os._exit.
    # Interpreter finalisation can meet a gloo worker thread still holding a tensor and abort the process
    # ("terminate called without an active exception", SIGABRT): seen once in CI, and the reference run failed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
