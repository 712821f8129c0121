"""One training rank: the fixed DDP + bfloat16 loop. The harness owns all of it; the submission
supplies the model, and optionally its optimizers and its lr schedule.

Started by torch elastic, never by hand:  python -u -m harness.ranks.train <train_job.json>

Per step: one tiny MAX all-reduce to agree whether the step would end past the budget (the only
host sync), then grad_accum_steps micro-steps (no_sync on all but the last) under bf16 autocast,
the lr set from the time-based schedule, optimizer steps, grads zeroed with set_to_none. The train
loss is accumulated on the device and read only at the log interval.
"""

from __future__ import annotations

import contextlib
import os
import sys

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


class Diverged(RuntimeError):
    harness_status = "diverged"


def _print0(env: RankEnv, *args) -> None:
    if env.rank == 0:
        print(*args, flush=True)


def train(job, env: RankEnv, channel, holders: list) -> dict:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from harness.ranks.clock import CONTINUE, STOP_BUDGET, STOP_DIVERGED, StopRule
    from harness.submission.contract import SubmissionContext, SubmissionError, check_forward_output, load_submission
    from harness.data.stream import Prefetcher, TokenStream, split_inputs_targets
    from harness.submission.defaults import default_lr_schedule, default_optimizers

    # ---------------------------------------------------------------- setup (not on the clock)
    device = setup_device(job.device, env, job.cpu_threads_per_rank)
    init_process_group(job.backend, device, job.collective_timeout_s)
    sub = load_submission(job.submission_dir, job.vocab_size)
    sub_file = str(sub.folder / "submission.py")
    ctx = SubmissionContext(
        rank=env.rank, local_rank=env.local_rank, world_size=env.world_size, device=str(device),
        budget_s=job.budget_s, vocab_size=job.vocab_size, seed=job.seed, track=job.track,
    )
    B, T, accum = sub.micro_batch_size, sub.seq_len, sub.grad_accum_steps
    vocab_out = int(sub.config["vocab_size"])
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
        t0 = perf_counter()
        if env.local_rank == 0:  # each node's launcher watches its own clock: its first rank reports
            channel.send("train_start", clock_start=job.clock_start)

    model = sub.get_model(dict(sub.config))
    if not isinstance(model, torch.nn.Module):
        raise SubmissionError(sub_file, f"get_model returned a {type(model).__name__}, not a torch.nn.Module.",
                              "return the model instance from get_model(config)")
    model.to(device=device, dtype=torch.float32)  # fp32 master weights; autocast does the bf16
    params = sum(p.numel() for p in model.parameters())
    raw_model = model  # what the checkpoint saves: never the compiled or DDP wrapper
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
    schedule = sub.lr_schedule or default_lr_schedule
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=job.dtype == "bfloat16")
    rule = StopRule(job.budget_s)

    flag = torch.zeros(1, dtype=torch.int32, device=device)
    last_loss = torch.zeros((), dtype=torch.float32, device=device)
    loss_sum = torch.zeros((), dtype=torch.float32, device=device)  # since the last log
    loss_count = 0
    step = tokens = 0
    last_log_s = 0.0
    lr_scale = 0.0
    stop_code = CONTINUE
    last_step_start_s = max_step_s = prev_synced = warm_s = 0.0

    # ---------------------------------------------------------------- the clock runs from here
    print(f"[harness] rank {env.rank}: training starts", flush=True)
    if t0 is None:
        t0 = perf_counter()
        if env.local_rank == 0:  # each node's launcher watches its own clock: its first rank reports
            channel.send("train_start", clock_start=job.clock_start)
    while True:
        now = perf_counter() - t0
        vote = rule.decide(now) if not job.max_steps else (STOP_BUDGET if step >= job.max_steps else CONTINUE)
        # A non-finite loss from the previous step votes to stop too: found at once, no extra sync.
        flag.fill_(vote)
        torch.maximum(flag, (~torch.isfinite(last_loss)).to(torch.int32) * STOP_DIVERGED, out=flag)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        stop_code = int(flag.item())  # the one host sync per step
        synced = perf_counter() - t0
        rule.synced(synced)
        if step > 0:
            max_step_s = max(max_step_s, synced - prev_synced)
        prev_synced = synced
        if job.max_steps and step == job.warmup_steps:
            warm_s = synced
        if env.rank == 0 and (stop_code != CONTINUE or synced - last_log_s >= job.log_interval_s):
            loss_value = (loss_sum / max(loss_count, 1)).item() if loss_count else float("nan")
            channel.send("progress", step=step, train_time_s=synced, train_loss=loss_value, lr_scale=lr_scale,
                         tokens=tokens, tokens_per_s=tokens / synced if synced > 0 else 0.0)
            if stop_code == CONTINUE:
                loss_sum.zero_()
                loss_count = 0
            last_log_s = synced
        if stop_code != CONTINUE:
            break
        last_step_start_s = synced

        # Progress through the budget: time, or steps when the run is step-bounded (tests, benchmarks).
        progress = step / job.max_steps if job.max_steps else now / job.budget_s
        lr_scale = float(schedule(min(1.0, progress)))
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * lr_scale
        for micro in range(accum):
            x, y = split_inputs_targets(prefetch.next().to(device, non_blocking=True))
            sync_ctx = ddp.no_sync() if micro < accum - 1 else contextlib.nullcontext()
            with sync_ctx:
                with autocast:
                    out = ddp(x, y)
                if step == 0 and micro == 0:
                    check_forward_output(out, B, T, vocab_out, True, sub_file)
                loss = out[1]
                (loss / accum).backward()
            last_loss = loss.detach().float()
            loss_sum += last_loss
            loss_count += 1
        for opt in optimizers:
            opt.step()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        step += 1
        tokens += tokens_per_step

    train_time_s = synced
    if env.local_rank == 0:
        channel.send("train_end", step=step, tokens=tokens, train_time_s=train_time_s)
    if stop_code == STOP_DIVERGED:
        prefetch.close()
        raise Diverged(f"loss became NaN or inf at step {step}; training stopped")
    probe_batches = [prefetch.next() for _ in range(min(job.scaling_probe_steps, 4))]
    prefetch.close()

    # ---------------------------------------------------------------- after the clock
    final = torch.stack([loss_sum.double(), torch.tensor(float(loss_count), dtype=torch.float64, device=device)])
    dist.all_reduce(final)  # mean train loss over the last log interval, all ranks
    train_loss = float(final[0] / final[1]) if float(final[1]) > 0 else None
    if device.type == "cuda":
        peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        import resource

        peak_mem_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    saved = False
    if env.rank == 0 and job.staging_dir:
        staged = os.path.join(job.staging_dir, "checkpoint.pt")
        state = {k: v.detach().cpu() for k, v in raw_model.state_dict().items()}
        torch.save({"config": sub.config, "model": state, "step": step, "tokens": tokens}, staged + ".tmp")
        os.replace(staged + ".tmp", staged)
        saved = True
    probe: dict = {}
    if job.scaling_probe_steps:  # after the checkpoint: the probe's backward passes touch the grads only
        from harness.results.metrics import summarize_probe
        from harness.ranks.probe import time_sync_vs_compute

        probe = summarize_probe(*time_sync_vs_compute(ddp, probe_batches, device, job.scaling_probe_steps, job.dtype))
    measured_steps = step - job.warmup_steps if job.max_steps else step
    measured_s = train_time_s - warm_s
    return {
        **probe,
        "measured_tokens_per_s": measured_steps * tokens_per_step / measured_s if measured_s > 0 else None,
        "steps": step, "tokens": tokens, "train_time_s": train_time_s, "train_loss": train_loss,
        "params": params, "peak_mem_gib": peak_mem_gib, "data_wait_s": prefetch.wait_s,
        "checkpoint_saved": saved, "config": sub.config, "tokens_per_step": tokens_per_step,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "max_step_s": max_step_s, "last_step_start_s": last_step_start_s,
        "reports_dropped": channel.dropped,  # progress reports the launcher could not take in time
    }


def main(argv: list[str]) -> None:
    from harness.launcher.channel import ChannelClient
    from harness.ranks.jobs import TrainJob

    job = TrainJob.load(argv[1])
    env = RankEnv.from_environ()
    die_with_launcher()
    if job.work_dir:
        os.chdir(job.work_dir)  # the private folder: files a submission writes land there, not in runs/
    redirect_output(f"{job.log_dir}/rank{env.rank}.log")
    channel = ChannelClient(job.channel_path, env.rank)
    channel.send("hello", pid=os.getpid(), local_rank=env.local_rank, group_rank=env.group_rank,
                 world_size=env.world_size)
    holders: list = []
    code = 0
    try:
        result = train(job, env, channel, holders)
        channel.send("result", **result)
    except BaseException as exc:  # every failure becomes a report; SystemExit and Ctrl-C included
        report = describe_failure(exc)
        print(report["traceback"], file=sys.stderr, flush=True)
        channel.send("error", **report)
        code = 1
    release_and_exit(code, holders)


if __name__ == "__main__":
    main(sys.argv)
