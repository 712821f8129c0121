"""The precision a run computes in: bfloat16 autocast, or float32 where bf16 would be emulated.

A track says `dtype = "bfloat16"`, `"float32"` or `"auto"`. GPU tracks use bf16 (every GPU the
harness targets computes it natively). `auto` on a CPU means bf16 autocast only where the CPU
has bf16 instructions, and float32 elsewhere: without them (AVX2-only x86, most laptops) a bf16
matmul is emulated and was measured ~45x slower than float32, so a bf16 run on such a machine
would train a tenth of the steps and say nothing about the submission.

Detection reads the CPU's feature flags, never a timing (which a loaded machine would skew):
Linux x86 `avx512_bf16` or `amx_bf16` in /proc/cpuinfo, Linux arm64 `bf16` in its Features,
macOS arm64 `hw.optional.arm.FEAT_BF16`. Anything else is treated as not native.
The precision used is recorded in every run and shown on the leaderboard.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from functools import lru_cache

PRECISIONS = ("bfloat16", "float32")
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def _cpuinfo_flags(text: str) -> set[str]:
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            flags.update(value.split())
    return flags


@lru_cache(maxsize=1)
def cpu_bf16_evidence() -> str:
    """The feature flag that shows native bf16 on this CPU, or "" when there is none."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as fh:
                flags = _cpuinfo_flags(fh.read())
        except OSError:
            return ""
        for flag in (*X86_BF16_FLAGS, "bf16"):
            if flag in flags:
                return flag
        return ""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        try:
            out = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
        return "FEAT_BF16" if out == "1" else ""
    return ""


def resolve_precision(dtype: str, device: str) -> tuple[str, str]:
    """(precision, why) for a track's dtype on this machine's device kind."""
    if dtype in PRECISIONS:
        return dtype, "set by the track"
    if dtype != "auto":
        raise ValueError(f"dtype must be one of {(*PRECISIONS, 'auto')}, got {dtype!r}")
    if device == "cuda":
        return "bfloat16", "auto: GPUs compute bf16 natively"
    flag = cpu_bf16_evidence()
    if flag:
        return "bfloat16", f"auto: the CPU has native bf16 ({flag})"
    return "float32", "auto: the CPU has no native bf16 instructions (bf16 would be emulated, ~45x slower)"
