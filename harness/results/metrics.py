"""MFU, computed one way, in one place, from figures a run recorded.

- mfu = flops_per_token x tokens/s per device / the device's peak dense bf16 FLOP/s. No peak
  known (a CPU): mfu is None, never invented.
- flops_per_token is measured where the model can be built (harness/ranks/flops.py), and the
  communication probe's figures where the ranks run (harness/ranks/probe.py).
"""

from __future__ import annotations


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
