"""MFU, computed one way, in one place, from figures a run recorded.

- mfu = flops_per_token x tokens/s per device / the device's peak dense bf16 FLOP/s. No peak
  known (a CPU): mfu is None, never invented.
- flops_per_token is measured where the model can be built (harness/ranks/flops.py), and the
  communication probe's figures where the ranks run (harness/ranks/training/probe.py).
"""

from __future__ import annotations

import math


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


def raw_mfu(flops_per_token: float | None, tokens_per_s_per_device: float | None, peak: float | None) -> float | None:
    """FLOPs per token x tokens per second per device / the device's peak, as computed; None where a factor is unknown."""
    if not flops_per_token or not tokens_per_s_per_device or not peak:
        return None
    return flops_per_token * tokens_per_s_per_device / peak


def mfu(flops_per_token: float | None, tokens_per_s_per_device: float | None, peak: float | None) -> float | None:
    """Model FLOPs utilisation, or None: unknown, or a share no device reaches (past its peak, or not finite).
    FLOPs per token are counted in the check process beside the team's code, which can make them say
    anything (docs/rules.md): a forged count showed as 1,032% and as inf (not even JSON). The record says why
    (implausible_mfu_note)."""
    value = raw_mfu(flops_per_token, tokens_per_s_per_device, peak)
    return value if value is not None and math.isfinite(value) and 0.0 <= value <= 1.0 else None


def implausible_mfu_note(flops_per_token: float | None, tokens_per_s_per_device: float | None,
                         peak: float | None) -> str | None:
    """The record's note where mfu() refused the computed figure; None where it did not."""
    value = raw_mfu(flops_per_token, tokens_per_s_per_device, peak)
    if value is None or mfu(flops_per_token, tokens_per_s_per_device, peak) is not None:
        return None
    share = f"{value:.0%}" if math.isfinite(value) else str(value)
    return (f"MFU not shown: the FLOPs per token counted in the check process ({flops_per_token:.4g}) at this "
            f"throughput make {share} of the device's peak, which no device reaches; the count is taken beside "
            "the team's code")
