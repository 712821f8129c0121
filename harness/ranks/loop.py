"""The fixed DDP training loop of one rank. The harness owns all of it; the submission supplies
the model, and optionally its optimizers and its lr schedule. The process around it (start-up,
reports, failures, exit) is harness/ranks/train.py.

Three parts, read top to bottom:
- `build_training`: everything before the clock (device, process group, submission, model,
  DDP, optimizers, data stream), and the device-side scalars the loop reuses;
- per step, `vote`: one tiny MAX all-reduce to agree whether to run the next step (the budget,
  or a non-finite loss) and its read-back, the only host sync; then `train_step`:
  grad_accum_steps micro-steps (no_sync on all but the last) under the run's precision, the lr
  from the time-based schedule, optimizer steps, grads zeroed with set_to_none. The train loss
  is accumulated on the device and read only at the log interval;
- `finish`: after the clock, the final train loss, the checkpoint, the scaling probe.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.data.stream import Prefetcher, TokenStream, split_inputs_targets
from harness.ranks.checkpoint import save_checkpoint
from harness.ranks.clock import CONTINUE, STOP_BUDGET, STOP_DIVERGED, StopRule
from harness.ranks.probe import summarize_probe, time_sync_vs_compute
from harness.ranks.process import RankEnv, init_process_group, perf_counter, setup_device
from harness.submission.contract import SubmissionContext, SubmissionError, check_forward_output, load_submission
from harness.submission.defaults import default_lr_schedule, default_optimizers


class Diverged(RuntimeError):
    harness_status = "diverged"


def _print0(env: RankEnv, *args) -> None:
    if env.rank == 0:
        print(*args, flush=True)


@dataclass
class Training:
    """What the loop needs, built once before the clock starts."""

    job: Any
    env: RankEnv
    channel: Any
    device: Any
    sub: Any  # the checked Submission
    ddp: Any
    raw_model: Any  # what the checkpoint saves: never the compiled or DDP wrapper
    optimizers: list
    schedule: Any
    autocast: Any
    prefetch: Any
    params: int
    tokens_per_step: int
    t0: float | None = None  # set here when the clock starts at model build
    # Device-side scalars, allocated once and reused by every step.
    flag: Any = None  # the stop vote, all-reduced (MAX)
    last_loss: Any = None  # the last micro-batch's loss
    loss_sum: Any = None  # since the last log
    loss_count: int = 0
    lr_scale: float = 0.0

    @property
    def file(self) -> str:
        return str(self.sub.folder / "submission.py")


def build_training(job, env: RankEnv, channel, holders: list) -> Training:
    """Device, process group, submission, model, DDP, optimizers and data: not on the clock
    (unless the track starts it at model build)."""
    device = setup_device(job.device, env, job.cpu_threads_per_rank)
    init_process_group(job.backend, device, job.collective_timeout_s)
    sub = load_submission(job.submission_dir, job.vocab_size)
    sub_file = str(sub.folder / "submission.py")
    ctx = SubmissionContext(
        rank=env.rank, local_rank=env.local_rank, world_size=env.world_size, device=str(device),
        budget_s=job.budget_s, vocab_size=job.vocab_size, seed=job.seed, track=job.track,
    )
    B, T, accum = sub.micro_batch_size, sub.seq_len, sub.grad_accum_steps
    tokens_per_step = env.world_size * B * T * accum
    stream = TokenStream(job.train_shards, seq_len=T, micro_batch_size=B, rank=env.rank,
                         world_size=env.world_size, seed=job.seed, vocab_size=job.vocab_size)
    prefetch = Prefetcher(stream, pin_memory=device.type == "cuda")
    _print0(env, f"[harness] world {env.world_size} on {device}, {B}x{T} x{accum} accum per rank, "
                 f"{tokens_per_step} tokens/step, budget {job.budget_s:.1f}s")

    torch.manual_seed(job.seed)  # the same init on every rank; DDP also broadcasts rank 0's weights
    np.random.seed(job.seed % 2**32)

    t0 = None
    if job.clock_start == "model_build":
        t0 = start_clock(job, env, channel)

    model = sub.get_model(dict(sub.config))
    if not isinstance(model, torch.nn.Module):
        raise SubmissionError(sub_file, f"get_model returned a {type(model).__name__}, not a torch.nn.Module.",
                              "return the model instance from get_model(config)")
    model.to(device=device, dtype=torch.float32)  # fp32 master weights; autocast does the bf16
    params = sum(p.numel() for p in model.parameters())
    raw_model = model
    if sub.compile:
        model = torch.compile(model)
    ddp = DDP(model, device_ids=[env.local_rank] if device.type == "cuda" else None,
              gradient_as_bucket_view=True)
    optimizers = sub.build_optimizers(raw_model, ctx) if sub.build_optimizers else default_optimizers(raw_model, ctx, sub.config)
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    if not isinstance(optimizers, (list, tuple)) or not optimizers or not all(
            isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise SubmissionError(sub_file, "build_optimizers must return an Optimizer or a non-empty list of them.",
                              "return torch.optim optimizers built over model.parameters()")
    holders.extend([ddp, optimizers, model, raw_model])  # released before the process group at exit
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = float(group["lr"])
    return Training(
        job=job, env=env, channel=channel, device=device, sub=sub, ddp=ddp, raw_model=raw_model,
        optimizers=list(optimizers), schedule=sub.lr_schedule or default_lr_schedule,
        autocast=torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=job.dtype == "bfloat16"),
        prefetch=prefetch, params=params, tokens_per_step=tokens_per_step, t0=t0,
        flag=torch.zeros(1, dtype=torch.int32, device=device),
        last_loss=torch.zeros((), dtype=torch.float32, device=device),
        loss_sum=torch.zeros((), dtype=torch.float32, device=device),
    )


def start_clock(job, env: RankEnv, channel) -> float:
    t0 = perf_counter()
    if env.local_rank == 0:  # each node's launcher watches its own clock: its first rank reports
        channel.send("train_start", clock_start=job.clock_start)
    return t0


def vote(tr: Training, my_vote: int) -> int:
    """The ranks agree on the next step: this rank's vote, raised to "diverged" if its last loss was
    not finite (found at once, no extra sync), MAX over ranks. One tiny all-reduce, one read-back."""
    tr.flag.fill_(my_vote)
    torch.maximum(tr.flag, (~torch.isfinite(tr.last_loss)).to(torch.int32) * STOP_DIVERGED, out=tr.flag)
    dist.all_reduce(tr.flag, op=dist.ReduceOp.MAX)
    return int(tr.flag.item())  # the one host sync per step


def train_step(tr: Training, step: int, progress: float) -> None:
    """One optimizer step: grad_accum_steps micro-steps, gradients synchronised on the last."""
    sub = tr.sub
    B, T, accum = sub.micro_batch_size, sub.seq_len, sub.grad_accum_steps
    tr.lr_scale = float(tr.schedule(min(1.0, progress)))
    for opt in tr.optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * tr.lr_scale
    for micro in range(accum):
        x, y = split_inputs_targets(tr.prefetch.next().to(tr.device, non_blocking=True))
        sync_ctx = tr.ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext()
        with sync_ctx:
            with tr.autocast:
                out = tr.ddp(x, y)
            if step == 0 and micro == 0:
                check_forward_output(out, B, T, int(sub.config["vocab_size"]), True, tr.file)
            loss = out[1]
            (loss / accum).backward()
        tr.last_loss = loss.detach().float()
        tr.loss_sum += tr.last_loss
        tr.loss_count += 1
    for opt in tr.optimizers:
        opt.step()
    for opt in tr.optimizers:
        opt.zero_grad(set_to_none=True)


def report_progress(tr: Training, step: int, tokens: int, synced_s: float, final: bool) -> None:
    """Rank 0, at the log interval: the mean train loss since the last report (a host read)."""
    loss_value = (tr.loss_sum / max(tr.loss_count, 1)).item() if tr.loss_count else float("nan")
    tr.channel.send("progress", step=step, train_time_s=synced_s, train_loss=loss_value, lr_scale=tr.lr_scale,
                    tokens=tokens, tokens_per_s=tokens / synced_s if synced_s > 0 else 0.0)
    if not final:
        tr.loss_sum.zero_()
        tr.loss_count = 0


def train(job, env: RankEnv, channel, holders: list) -> dict:
    tr = build_training(job, env, channel, holders)
    rule = StopRule(job.budget_s)
    step = tokens = 0
    last_log_s = last_step_start_s = max_step_s = prev_synced = warm_s = synced = 0.0
    stop_code = CONTINUE

    # ---------------------------------------------------------------- the clock runs from here
    print(f"[harness] rank {env.rank}: training starts", flush=True)
    t0 = tr.t0 if tr.t0 is not None else start_clock(job, env, channel)
    while True:
        now = perf_counter() - t0
        my_vote = rule.decide(now) if not job.max_steps else (STOP_BUDGET if step >= job.max_steps else CONTINUE)
        stop_code = vote(tr, my_vote)
        synced = perf_counter() - t0
        rule.synced(synced)
        if step > 0:
            max_step_s = max(max_step_s, synced - prev_synced)
        prev_synced = synced
        if job.max_steps and step == job.warmup_steps:
            warm_s = synced
        if env.rank == 0 and (stop_code != CONTINUE or synced - last_log_s >= job.log_interval_s):
            report_progress(tr, step, tokens, synced, final=stop_code != CONTINUE)
            last_log_s = synced
        if stop_code != CONTINUE:
            break
        last_step_start_s = synced
        # Progress through the budget: time, or steps when the run is step-bounded (tests, benchmarks).
        train_step(tr, step, step / job.max_steps if job.max_steps else now / job.budget_s)
        step += 1
        tokens += tr.tokens_per_step

    if env.local_rank == 0:
        channel.send("train_end", step=step, tokens=tokens, train_time_s=synced)
    if stop_code == STOP_DIVERGED:
        tr.prefetch.close()
        raise Diverged(f"loss became NaN or inf at step {step}; training stopped")
    result = finish(tr, step, tokens, synced, warm_s)
    return {**result, "max_step_s": max_step_s, "last_step_start_s": last_step_start_s}


def finish(tr: Training, step: int, tokens: int, train_time_s: float, warm_s: float) -> dict:
    """After the clock: the final train loss over all ranks, the checkpoint, the scaling probe."""
    job, env, device = tr.job, tr.env, tr.device
    probe_batches = [tr.prefetch.next() for _ in range(min(job.scaling_probe_steps, 4))]
    tr.prefetch.close()
    final = torch.stack([tr.loss_sum.double(), torch.tensor(float(tr.loss_count), dtype=torch.float64, device=device)])
    dist.all_reduce(final)  # mean train loss over the last log interval, all ranks
    train_loss = float(final[0] / final[1]) if float(final[1]) > 0 else None
    if device.type == "cuda":
        peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        import resource

        peak_mem_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    saved = False
    if env.rank == 0 and job.staging_dir:
        save_checkpoint(os.path.join(job.staging_dir, "checkpoint.pt"), tr.raw_model, tr.sub.config, step, tokens)
        saved = True
    probe: dict = {}
    if job.scaling_probe_steps:  # after the checkpoint: the probe's backward passes touch the grads only
        probe = summarize_probe(*time_sync_vs_compute(tr.ddp, probe_batches, device, job.scaling_probe_steps,
                                                      job.dtype))
    measured_steps = step - job.warmup_steps if job.max_steps else step
    measured_s = train_time_s - warm_s
    return {
        **probe,
        "measured_tokens_per_s": measured_steps * tr.tokens_per_step / measured_s if measured_s > 0 else None,
        "steps": step, "tokens": tokens, "train_time_s": train_time_s, "train_loss": train_loss,
        "params": tr.params, "peak_mem_gib": peak_mem_gib, "data_wait_s": tr.prefetch.wait_s,
        "checkpoint_saved": saved, "config": tr.sub.config, "tokens_per_step": tr.tokens_per_step,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "reports_dropped": tr.channel.dropped,  # progress reports the launcher could not take in time
    }
