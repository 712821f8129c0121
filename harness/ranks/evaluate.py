"""Evaluation in fresh processes: the checkpoint scored on exactly `val_tokens` held-out tokens.

Started by torch elastic after every training process is gone:
    python -u -m harness.ranks.evaluate <eval_job.json>

Each process imports only `get_model` from the submission, loads the checkpoint with
weights_only=True (after checking its sha256 against the record), and computes the
cross-entropy in float32 from the returned logits (the submission's own loss is ignored).
The val stream is cut into windows of seq_len targets; windows are grouped into fixed batches
and the batches are dealt to ranks round-robin, so every batch is computed identically whatever
the world size; sums are float64. The figure is the same for 1 or N ranks.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from harness.ranks.checkpoint import load_for_eval
from harness.ranks.process import (
    RankEnv,
    describe_failure,
    die_with_launcher,
    init_process_group,
    perf_counter,
    redirect_output,
    release_and_exit,
    setup_device,
)


def read_val_tokens(shards, val_tokens: int, vocab_size: int) -> np.ndarray:
    """The first val_tokens + 1 tokens of the val shards, in sorted order, range-checked."""
    from harness.data.shards import DataError, check_token_range

    need = val_tokens + 1
    have = sum(s.num_tokens for s in shards)
    if have < need:
        raise DataError(f"the validation shards hold {have} tokens; the track scores {val_tokens} (+1 for the shift)")
    parts, left = [], need
    for s in shards:
        take = min(left, s.num_tokens)
        parts.append(np.asarray(s.tokens()[:take], dtype=np.int64))
        left -= take
        if left == 0:
            break
    tokens = np.concatenate(parts)
    check_token_range(tokens, vocab_size, "validation shards")
    return tokens


def batch_plan(val_tokens: int, seq_len: int, batch_size: int) -> list[tuple[int, int]]:
    """Fixed batches of windows: (first window, number of windows). Independent of world size."""
    n_windows = val_tokens // seq_len
    return [(w, min(batch_size, n_windows - w)) for w in range(0, n_windows, batch_size)]


def batches_for_rank(plan: list[tuple[int, int]], rank: int, world_size: int) -> list[tuple[int, int]]:
    return plan[rank::world_size]


def window_batch(tokens: np.ndarray, first: int, count: int, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    starts = (first + np.arange(count)) * seq_len
    idx = starts[:, None] + np.arange(seq_len + 1)
    buf = tokens[idx]
    return np.ascontiguousarray(buf[:, :-1]), np.ascontiguousarray(buf[:, 1:])


def score(model, tokens: np.ndarray, plan, env: RankEnv, seq_len: int, vocab_out: int, device, file: str,
          precision: str = "bfloat16"):
    """(sum of per-token cross-entropy in float64, number of target tokens) over this rank's batches."""
    import torch
    import torch.nn.functional as F

    from harness.submission.contract import check_forward_output

    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16")
    with torch.inference_mode():
        for first, n in batches_for_rank(plan, env.rank, env.world_size):
            x, y = window_batch(tokens, first, n, seq_len)
            x = torch.from_numpy(x).to(device, non_blocking=True)
            y = torch.from_numpy(y).to(device, non_blocking=True)
            with autocast:
                out = model(x)
            check_forward_output(out, n, seq_len, vocab_out, False, file)
            logits = out[0].float()
            losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
            total += losses.double().sum()
            count += losses.numel()
    return total, count


def evaluate(job, env: RankEnv, channel, holders: list) -> dict:
    import torch
    import torch.distributed as dist

    device = setup_device(job.device, env, job.cpu_threads_per_rank)
    if env.world_size > 1:
        init_process_group(job.backend, device, job.collective_timeout_s)
    t_start = perf_counter()
    model, ckpt = load_for_eval(job.checkpoint, job.checkpoint_sha256, job.submission_dir, device)
    holders.append(model)
    vocab_out = int(ckpt["config"].get("vocab_size", job.vocab_size))
    tokens = read_val_tokens(job.val_shards, job.val_tokens, job.vocab_size)
    plan = batch_plan(job.val_tokens, job.seq_len, job.batch_size)
    file = str(Path(job.submission_dir) / "submission.py")
    causality = None
    if job.causality_check:  # on real validation tokens, with the trained weights
        import torch as _torch

        from harness.ranks.causality import probe_causality

        window = _torch.from_numpy(np.ascontiguousarray(tokens[: job.seq_len]))
        causality = probe_causality(model, window, job.vocab_size, device)
    t_score = perf_counter()
    total, count = score(model, tokens, plan, env, job.seq_len, vocab_out, device, file, job.dtype)
    sums = torch.stack([total, torch.tensor(float(count), dtype=torch.float64, device=device)])
    if env.world_size > 1:
        dist.all_reduce(sums)
    n = int(sums[1].item())
    if n != job.val_tokens:
        raise RuntimeError(f"scored {n} tokens, expected exactly {job.val_tokens}")
    elapsed = perf_counter() - t_score
    return {
        "val_loss": float(sums[0].item()) / n, "val_tokens": n, "eval_world_size": env.world_size,
        "eval_time_s": perf_counter() - t_start, "eval_tokens_per_s": n / elapsed if elapsed > 0 else None,
        "causality": causality,
    }


def main(argv: list[str]) -> None:
    from harness.ranks.channel import ChannelClient
    from harness.ranks.jobs import EvalJob

    job = EvalJob.load(argv[1])
    env = RankEnv.from_environ()
    die_with_launcher()
    redirect_output(f"{job.log_dir}/eval-rank{env.rank}.log")
    channel = ChannelClient(job.channel_path, env.rank)
    channel.send("hello", pid=os.getpid(), local_rank=env.local_rank, world_size=env.world_size)
    holders: list = []
    code = 0
    try:
        result = evaluate(job, env, channel, holders)
        channel.send("eval_result", **result)
    except BaseException as exc:
        report = describe_failure(exc)
        print(report["traceback"], file=sys.stderr, flush=True)
        channel.send("error", **report)
        code = 1
    release_and_exit(code, holders)


if __name__ == "__main__":
    main(sys.argv)
