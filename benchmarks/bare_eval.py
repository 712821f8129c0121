"""The reference for evaluation's time: the plainest scoring of a run's checkpoint, in one fresh process.

    python benchmarks/bare_eval.py RUN_DIR --val-shard PATH --val-tokens N --seq-len T --batch-size B

Imports torch and the submission, loads the checkpoint, and scores the first N validation tokens in windows of T
targets, B windows a forward, in the run's precision, with no sandbox, no second process, no causality check: what a team's own script
would do. Prints JSON: the loss and the seconds from the start of the process (imports included), which
`harness eval`'s wall time is compared with (benchmarks/run.py).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

T_START = time.time()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir")
    ap.add_argument("--val-shard", required=True)
    ap.add_argument("--val-tokens", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision", default="float32", help="the run's (its record's `precision`): bfloat16 autocasts")
    args = ap.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F

    from harness.data.shards import inspect_shard
    from harness.submission.contract import import_submission_module

    torch.set_num_threads(args.threads)
    module = import_submission_module(Path(args.run_dir) / "submission")  # as a package: its relative imports work
    ckpt = torch.load(f"{args.run_dir}/checkpoint.pt", map_location="cpu", weights_only=True)
    model = module.get_model(dict(ckpt["config"]))
    model.load_state_dict(ckpt["model"])
    model.eval()
    tokens = np.asarray(inspect_shard(args.val_shard).tokens()[: args.val_tokens + 1], dtype=np.int64)
    windows = args.val_tokens // args.seq_len
    total, count = 0.0, 0
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bfloat16")
    with torch.inference_mode(), autocast:
        for w in range(0, windows, args.batch_size):
            rows = range(w, min(windows, w + args.batch_size))
            idx = torch.from_numpy(np.stack([tokens[r * args.seq_len:(r + 1) * args.seq_len] for r in rows]))
            tgt = torch.from_numpy(np.stack([tokens[r * args.seq_len + 1:(r + 1) * args.seq_len + 1] for r in rows]))
            logits, _ = model(idx)
            total += float(F.cross_entropy(logits.float().flatten(0, 1), tgt.flatten(), reduction="sum"))
            count += tgt.numel()
    print(json.dumps({"val_loss": total / count, "tokens": count, "wall_s": time.time() - T_START}))


if __name__ == "__main__":
    main()
