"""The communication probe: how much of a step is exposed gradient synchronisation, on real batches.

After training (off the clock), each of k rounds times one forward + backward with DDP's
gradient all-reduce and one inside `no_sync` (compute only) on the same batch, in alternating
order (ABBA) so drift cancels. Ranks are aligned by a barrier before each timed step, so the
figure is the cost of communication, not of waiting for a slow rank.

Its figure, `comm_overlap_efficiency` = compute-only / synchronised step time, is the share of a
step not spent waiting on communication that the backward did not hide, at this run's world
size. It is not weak-scaling efficiency (tokens/s at N against N x one device: `harness scale`).
"""

from __future__ import annotations

import contextlib
import statistics

from harness.ranks.process import perf_counter


def time_sync_vs_compute(ddp, batches: list, device, steps: int,
                         precision: str = "bfloat16") -> tuple[list[float], list[float]]:
    """(synchronised step times, compute-only step times), seconds, this rank's view."""
    import torch
    import torch.distributed as dist

    from harness.data.stream import split_inputs_targets

    def sync_device() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bfloat16")
    synced, compute = [], []
    for i in range(steps):
        x, y = split_inputs_targets(batches[i % len(batches)].to(device, non_blocking=True))
        order = ("sync", "nosync") if i % 2 == 0 else ("nosync", "sync")
        for mode in order:
            dist.barrier()
            sync_device()
            t0 = perf_counter()
            with ddp.no_sync() if mode == "nosync" else contextlib.nullcontext():
                with autocast:
                    loss = ddp(x, y)[1]
                loss.backward()
            sync_device()
            (synced if mode == "sync" else compute).append(perf_counter() - t0)
            ddp.zero_grad(set_to_none=True)
    return synced, compute


def summarize_probe(synced_s: list[float], compute_s: list[float]) -> dict:
    """The comm overlap efficiency from paired step times: medians, their ratio, and the spread of pair ratios."""
    if not synced_s or not compute_s:
        return {}
    ratios = [c / s for c, s in zip(compute_s, synced_s) if s > 0]
    synced, compute = statistics.median(synced_s), statistics.median(compute_s)
    return {
        # Not clamped to 1: a value above 1 is measurement noise, and the record should show it.
        "comm_overlap_efficiency": compute / synced if synced > 0 else None,
        "comm_probe_steps": len(synced_s),
        "comm_probe_synced_step_s": synced,
        "comm_probe_compute_step_s": compute,
        "comm_overlap_efficiency_min": min(ratios) if ratios else None,
        "comm_overlap_efficiency_max": max(ratios) if ratios else None,
        "comm_s": max(0.0, synced - compute),
    }
