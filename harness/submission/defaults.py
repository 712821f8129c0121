"""What the harness uses when a submission leaves the optimizer or the schedule out."""

from __future__ import annotations

import torch

from harness.submission.contract import SubmissionContext

WARMUP_FRACTION = 0.02  # of the schedule's clock: the time budget after the first step
DECAY_FRACTION = 0.30  # the last part of the budget, decayed linearly to zero


def default_lr_schedule(progress: float) -> float:
    """Warm-up, constant, linear decay to zero, all measured in fractions of the schedule's clock: the time
    budget after the first step (harness/ranks/training/clock.py schedule_progress), so that a compiled model's
    warm-up is not spent compiling.

    Driven by time, not steps: the decay always runs, whatever the step count turns out to be.
    """
    progress = min(max(progress, 0.0), 1.0)
    if progress < WARMUP_FRACTION:
        return max(progress / WARMUP_FRACTION, 0.01)
    if progress < 1.0 - DECAY_FRACTION:
        return 1.0
    return max(0.0, (1.0 - progress) / DECAY_FRACTION)


def default_optimizers(model: torch.nn.Module, ctx: SubmissionContext, config: dict) -> list[torch.optim.Optimizer]:
    """AdamW, weight decay only on tensors of 2 or more dimensions; fused where the device supports it.

    CONFIG may set `learning_rate` (default 1e-3), `weight_decay` (0.1) and `betas` ([0.9, 0.95]).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": float(config.get("weight_decay", 0.1))},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = ctx.device.startswith("cuda")  # the fused kernel is CUDA-only; foreach is the CPU fast path
    return [
        torch.optim.AdamW(
            [g for g in groups if g["params"]],
            lr=float(config.get("learning_rate", 1e-3)),
            betas=tuple(config.get("betas", (0.9, 0.95))),
            fused=fused,
        )
    ]
