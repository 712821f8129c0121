"""DistributedDataParallel as the track sets it (its `[ddp]` table, harness/tracks/ddp.py), and read back.

The job carries the track's settings as a plain dict (the rank side imports nothing of the launcher's);
`wrap` builds DDP with them and registers the communication hook; `applied` reads what the DDP object
holds, for the record: the settings every team trained under, as DDP has them, not as the track asked.
"""

from __future__ import annotations

import inspect

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# torch >= 2.13 names it forward_sync_buffers (and deprecates broadcast_buffers); older versions only know the latter.
NO_BUFFER_BROADCAST = ({"forward_sync_buffers": False}
                       if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters else {"broadcast_buffers": False})

DEFAULTS = {"bucket_cap_mb": None, "static_graph": False, "gradient_as_bucket_view": True, "comm_hook": "none"}


def settings(job_ddp: dict | None) -> dict:
    """The job's [ddp] settings over the defaults (a job written before the table existed has none)."""
    unknown = set(job_ddp or {}) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"the job's ddp settings hold unknown keys: {', '.join(sorted(unknown))}")
    return {**DEFAULTS, **(job_ddp or {})}


def _comm_hook(name: str):
    if name == "none":
        return None
    if name == "bf16_compress":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

        return bf16_compress_hook
    raise ValueError(f"unknown DDP communication hook {name!r}")


def wrap(model, device, local_rank: int, job_ddp: dict | None) -> DDP:
    """The model in DDP, under the track's settings. The harness owns the loop: buffers are synced from rank 0
    once, at construction, not before every forward (a causal mask buffer would cost every team a broadcast
    per micro-step)."""
    s = settings(job_ddp)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None,
              bucket_cap_mb=s["bucket_cap_mb"], static_graph=s["static_graph"],
              gradient_as_bucket_view=s["gradient_as_bucket_view"], **NO_BUFFER_BROADCAST)
    hook = _comm_hook(s["comm_hook"])
    if hook is not None:
        ddp.register_comm_hook(dist.group.WORLD, hook)
    return ddp


def applied(ddp: DDP) -> dict:
    """What the DDP object holds: bucket size in MiB, whether the first bucket is torch's smaller default,
    static graph, gradients as bucket views, the communication hooks registered (by name)."""
    hooks = [getattr(hook, "__name__", type(hook).__name__) for hook, _ in getattr(ddp, "_comm_hooks", [])]
    first_small = getattr(ddp, "bucket_bytes_cap_default", None)
    return {"bucket_cap_mb": ddp.bucket_bytes_cap / 2**20,
            "first_bucket_default": bool(first_small) if first_small is not None else None,
            "static_graph": bool(ddp.static_graph), "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view),
            "comm_hooks": hooks}
