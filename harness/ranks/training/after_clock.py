"""After the clock, on every rank: the weights copied and checked, the checkpoint, the replicas' digest,
the communication probe, this rank's figures.

Nothing of the submission runs between the last agreement point of the loop and rank 0's copy of the
weights (harness/ranks/checkpoint.py module_state: the modules' own dictionaries, no method of the
team's). Rank 0 writes the checkpoint and says so on the channel: the launcher takes the file at that
moment (harness/launcher/run/takeback.py), so whatever happens in staging/ afterwards is not what is
scored, and the time it took is held to the track's checkpoint allowance. Then, outside that
allowance: whether the live weights moved since the copy (work after the clock), the replicas' digest,
the communication probe.
"""

from __future__ import annotations

import hashlib
import os

import torch
import torch.distributed as dist

from harness.ranks.checkpoint import module_state, module_tensors, save_checkpoint
from harness.ranks.training.probe import summarize_probe, time_sync_vs_compute
from harness.ranks.process import perf_counter

_torch_equal = torch.equal  # bound before any submission is imported (one that patches torch.equal changes nothing here)


class Diverged(RuntimeError):
    harness_status = "diverged"


def _same_bits(live, saved) -> bool:
    """Bit for bit (a NaN is equal to itself here, as it is not under torch.equal)."""
    a, b = live.detach().to("cpu").contiguous().reshape(-1), saved.contiguous().reshape(-1)
    return a.shape == b.shape and a.dtype == b.dtype and _torch_equal(a.view(torch.uint8), b.view(torch.uint8))


def weights_digest(named_tensors) -> str:
    """sha256 over (name, dtype, shape, bytes) of each tensor, in the given order."""
    digest = hashlib.sha256()
    for name, t in named_tensors:
        t = t.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # reshape: 0-dim tensors cannot be viewed
    return digest.hexdigest()


def finish(tr, step: int, tokens: int, train_time_s: float, warm_s: float) -> dict:
    """After the clock: the weights copied and checked, the checkpoint, the communication probe, this rank's
    figures. Nothing of the submission runs between the last agreement point and the copy."""
    job, env, device = tr.job, tr.env, tr.device
    t_end = perf_counter()
    # The weights as training left them, read by harness code (module_tensors: the modules' own dictionaries,
    # no state_dict, hook or __getattr__ of the team's): what the checkpoint holds and the replicas compare.
    if device.type == "cuda":  # work a submission queued on a side stream is done before the copy
        torch.cuda.synchronize(device)
    state = module_state(tr.raw_model) if env.rank == 0 else None
    probe_batches = [tr.prefetch.next() for _ in range(min(job.comm_probe_steps, 4))]
    tr.prefetch.close()
    named = list(tr.raw_model.named_parameters(remove_duplicate=False))
    bad = torch.zeros((), dtype=torch.float64, device=device)
    for _, p in named:  # the last optimizer step can break weights after the last finite loss
        if p.requires_grad:  # a frozen tensor is the submission's own business
            bad += (~torch.isfinite(p.detach())).sum()
    dist.all_reduce(bad)  # every rank takes the same decision, so no rank waits in a collective alone
    if bad.item():
        raise Diverged(f"the weights hold NaN or inf values after the last step ({step}; {int(bad.item())} values "
                       "over all ranks); training stopped")
    if device.type == "cuda":
        peak_mem_gib = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        import resource

        peak_mem_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    saved, changed = False, None
    if env.rank == 0 and job.staging_dir:
        path = os.path.join(job.staging_dir, "checkpoint.pt")
        sha256, size = save_checkpoint(path, state, tr.sub.config, step, tokens)
        # The launcher takes the file now: whatever happens to staging/ later is not what is scored.
        tr.channel.send("checkpoint_saved", sha256=sha256, bytes=size, save_s=perf_counter() - t_end)
        saved = True
        # Work after the clock (a thread that trains on) shows as weights that moved since the copy.
        changed = any(not _same_bits(t, state[key]) for key, t in module_tensors(tr.raw_model))
        del state
    # After the checkpoint has left (this costs about a second per GB, outside the checkpoint allowance).
    at_end = weights_digest(module_tensors(tr.raw_model, buffers=False))  # replicas must agree on the parameters
    probe: dict = {}
    if job.comm_probe_steps:  # after the checkpoint: the probe's backward passes touch the grads only
        probe = summarize_probe(*time_sync_vs_compute(tr.ddp, probe_batches, device, job.comm_probe_steps,
                                                      job.dtype))
    measured_steps = step - job.warmup_steps if job.max_steps else step
    measured_s = train_time_s - warm_s
    return {
        **probe,
        "measured_tokens_per_s": measured_steps * tr.tokens_per_step / measured_s if measured_s > 0 else None,
        "steps": step, "tokens": tokens, "train_time_s": train_time_s,
        "params": tr.params, "peak_mem_gib": peak_mem_gib, "data_wait_s": tr.prefetch.wait_s,
        "checkpoint_saved": saved, "config": tr.sub.config, "tokens_per_step": tr.tokens_per_step,
        "weights_sha256": at_end, "weights_changed_after_clock": changed,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "reports_dropped": tr.channel.dropped,  # progress reports the launcher could not take in time
    }
