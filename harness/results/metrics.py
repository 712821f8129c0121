"""Throughput, FLOPs, MFU and scaling efficiency: computed one way, in one place.

- flops_per_token is measured, not guessed: torch's FLOP counter over one training step
  (forward and backward) of the submission's real model at the run's micro-batch and
  sequence length. The model is built on the meta device, so nothing is computed and no
  memory is used; a model that cannot be built there is counted on the CPU at batch 1 and
  scaled (FLOPs are linear in the batch).
- mfu = flops_per_token x tokens/s per device / the device's peak dense bf16 FLOP/s. No peak
  known (a CPU): mfu is None, never invented.
- scaling efficiency = compute-only step time / synchronised step time, on the same batches.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

# Peak dense BF16 FLOP/s per GPU (vendor figures, no sparsity).
PEAK_BF16_FLOPS = {
    "B300": 2.25e15,
    "B200": 2.25e15,
    "H200": 989e12,
    "H100 PCIE": 756e12,
    "H100": 989e12,
    "A100": 312e12,
}


def lookup_peak_flops(device_name: str | None) -> float | None:
    """The peak for a device name as torch reports it ("NVIDIA H100 80GB HBM3"), or None."""
    if not device_name:
        return None
    name = device_name.upper()
    for key in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):  # "H100 PCIE" before "H100"
        if key in name:
            return PEAK_BF16_FLOPS[key]
    return None


def peak_flops_per_device(peak_flops: float, device_peak: str, device_name: str | None) -> float | None:
    """The track's explicit figure, else its named GPU, else ("auto") the device the run saw."""
    if peak_flops > 0:
        return peak_flops
    if device_peak == "auto":
        return lookup_peak_flops(device_name)
    if device_peak:
        key = device_peak.upper()
        if key not in PEAK_BF16_FLOPS:
            raise ValueError(f"unknown device_peak {device_peak!r}; known: {', '.join(PEAK_BF16_FLOPS)} or 'auto'")
        return PEAK_BF16_FLOPS[key]
    return None


def mfu(flops_per_token: float | None, tokens_per_s_per_device: float | None, peak: float | None) -> float | None:
    if not flops_per_token or not tokens_per_s_per_device or not peak:
        return None
    return flops_per_token * tokens_per_s_per_device / peak


def count_training_flops_per_token(build: Callable[[], Any], vocab_size: int, batch: int, seq_len: int) -> dict:
    """FLOPs of one forward + backward at [batch, seq_len], per token, with how they were counted."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    def one_step(device: str, b: int) -> int:
        with torch.device(device):
            model = build()
        model.train()
        if device == "meta":
            idx = torch.empty(b, seq_len, dtype=torch.long, device="meta")
        else:
            idx = torch.randint(0, vocab_size, (b, seq_len))
        with FlopCounterMode(display=False) as counter:
            _, loss = model(idx, idx)
            loss.backward()
        return counter.get_total_flops()

    try:
        total = one_step("meta", batch)
        method = "meta"
    except Exception as exc:  # a model that computes on real values at build or forward time
        total = one_step("cpu", 1) * batch
        method = f"cpu batch 1 x {batch} ({type(exc).__name__} on meta)"
    return {"flops_per_token": total / (batch * seq_len), "flops_method": method}


def summarize_probe(synced_s: list[float], compute_s: list[float]) -> dict:
    """Scaling efficiency from paired step times: medians, their ratio, and the spread of pair ratios."""
    if not synced_s or not compute_s:
        return {}
    ratios = [c / s for c, s in zip(compute_s, synced_s) if s > 0]
    synced, compute = statistics.median(synced_s), statistics.median(compute_s)
    return {
        # Not clamped to 1: a value above 1 is measurement noise, and the record should show it.
        "scaling_efficiency": compute / synced if synced > 0 else None,
        "scaling_probe_steps": len(synced_s),
        "scaling_synced_step_s": synced,
        "scaling_compute_step_s": compute,
        "scaling_efficiency_min": min(ratios) if ratios else None,
        "scaling_efficiency_max": max(ratios) if ratios else None,
        "comm_s": max(0.0, synced - compute),
    }
