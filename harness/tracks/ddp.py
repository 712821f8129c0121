"""A track's `[ddp]` table: how DistributedDataParallel wraps every team's model.

The settings are the event's, the same for every team (a team never sets them): the harness
passes them to DDP's constructor (harness/ranks/training/loop.py), each rank reads them back from the DDP
object and the run record keeps what it read (`ddp`). The defaults are what the harness did
before the table existed: torch's buckets, no static graph, gradients as views of the buckets,
no communication hook.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMM_HOOKS = ("none", "bf16_compress")  # bf16_compress: torch.distributed.algorithms.ddp_comm_hooks.default_hooks
MAX_BUCKET_CAP_MB = 4096.0  # past this a bucket is the whole model of any event: a typo more likely than intent


class DdpError(ValueError):
    """A `[ddp]` value is wrong; spec.py adds the file's name (it is a TrackError there)."""


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class DdpSpec:
    """DDP's constructor arguments and communication hook, as the track sets them."""

    # MiB of gradients per all-reduce bucket. None (the key left out): torch's default, 25 MiB buckets after a
    # first one of 1 MiB (any value given here sizes the first bucket alike: DDP has no separate knob for it).
    bucket_cap_mb: float | None = None
    # DDP told the graph is the same every step: buckets and hooks fixed after the first step, reentrant
    # activation checkpointing allowed; a model whose graph changes from step to step is then wrong.
    static_graph: bool = False
    # param.grad are views into the all-reduce buckets: no copy between them, one gradient's memory saved.
    gradient_as_bucket_view: bool = True
    # "bf16_compress": gradients cast to bfloat16 for the all-reduce (half the bytes; the sum is rounded to
    # bf16's 8 bits of mantissa), back to fp32 after. Needs NCCL: torch refuses it on gloo.
    comm_hook: str = "none"

    def __post_init__(self) -> None:
        where = "[ddp]"
        cap = self.bucket_cap_mb
        if cap is not None and (_is_bool(cap) or not isinstance(cap, (int, float)) or not 0 < cap <= MAX_BUCKET_CAP_MB):
            raise DdpError(f"{where}: `bucket_cap_mb` must be a number of MiB in (0, {MAX_BUCKET_CAP_MB:g}], or left "
                           f"out for torch's default (25 MiB, the first bucket 1 MiB), got {cap!r}")
        for name in ("static_graph", "gradient_as_bucket_view"):
            if not _is_bool(getattr(self, name)):
                raise DdpError(f"{where}: `{name}` must be true or false, got {getattr(self, name)!r}")
        if self.comm_hook not in COMM_HOOKS:
            raise DdpError(f"{where}: `comm_hook` must be one of {', '.join(repr(h) for h in COMM_HOOKS)}, "
                           f"got {self.comm_hook!r}")

    def check_backend(self, backend: str) -> None:
        """What DDP itself would refuse at the first step on this backend, refused when the track loads."""
        if self.comm_hook == "bf16_compress" and backend != "nccl":
            raise DdpError(f"[ddp]: `comm_hook = \"bf16_compress\"` needs backend 'nccl' (torch registers its bf16 "
                           f"compression hook only with CUDA and NCCL 2.10+), got backend {backend!r}; use "
                           "comm_hook = \"none\" on this track")
