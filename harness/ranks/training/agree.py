"""The ranks' agreement, once a step: one tiny all-reduce (SUM), launched before a step is queued and read
after it, so the host never waits on the device inside the loop.

What the ranks agree on:
- whether to run the step after the next: stop if any rank votes so, "diverged" if the loss of any
  micro-batch of any rank so far is not finite (NaN and inf survive the sum);
- the time: the mean of the ranks' clocks when they voted, which drives every rank's lr schedule alike;
- the train loss: every rank's micro-batch losses summed since the start (reports take differences);
- the last step's gradient norm when the harness clips (the same on every rank: the gradients are
  synchronised), read in the same transfer;
- once, the first-step probe (harness/ranks/training/first_step.py), averaged over the ranks.

How it stays off the host's critical path: on a GPU the all-reduce (NCCL: the host does not wait for it)
is followed on the same stream by a copy into pinned host memory and an event; `read` waits for that event
only, which the device reaches before the step queued after the vote. On a CPU the all-reduce runs in
gloo's thread while the host runs the step, and `read` waits for it. Exactly one read of the agreement
per step, and one vote in flight at a time (one buffer is enough).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from harness.ranks.training.clock import CONTINUE, STOP_BUDGET, STOP_DIVERGED

SLOTS = 7  # stop votes, clock, loss sum, grad norm, first-step probe (loss, relabelled mean, spread)


@dataclass(frozen=True)
class Agreed:
    """One agreement, as every rank reads it."""

    stop: int  # CONTINUE, STOP_BUDGET or STOP_DIVERGED
    elapsed_s: float  # the mean of the ranks' clocks when they voted
    loss_sum: float  # all ranks' micro-batch losses summed since the start (not finite: diverged)
    loss_count: int  # micro-batches per rank in that sum (the same on every rank)
    grad_norm: float  # the last step's global gradient norm before clipping, or NaN when the harness does not clip


class Agreement:
    """The buffer every vote is all-reduced in, and the vote in flight."""

    def __init__(self, device: torch.device, world_size: int, clips: bool) -> None:
        self.device, self.world, self.clips = device, world_size, clips
        self.buf = torch.zeros(SLOTS, dtype=torch.float64, device=device)
        self.on_gpu = device.type == "cuda"
        self.host = torch.zeros(SLOTS, dtype=torch.float64, pin_memory=True) if self.on_gpu else None
        # blocking: the read sleeps until the device gets there, rather than spinning a core per rank
        self.event = torch.cuda.Event(blocking=True) if self.on_gpu else None
        self.work = None
        self.pending: tuple[int, bool] | None = None  # (micro-batches in the vote, first-step probe in it)
        self.probe_sent = False

    def launch(self, tr, my_vote: int, now_s: float) -> None:
        """Cast this rank's vote and start the all-reduce; nothing here waits for the device."""
        if self.pending is not None:
            raise RuntimeError("a vote is already in flight: read it first")
        buf = self.buf
        buf[0].fill_(float(my_vote != CONTINUE))
        buf[1].fill_(now_s)
        buf[2].copy_(tr.loss_sum)
        buf[3].copy_(tr.grad_norm)
        probe = tr.first_loss is not None and not self.probe_sent
        if probe:  # the first step's figures, once; the slots are zero before and after
            buf[4].copy_(tr.first_loss)
            buf[5].copy_(tr.first_relabeled)
            buf[6].copy_(tr.first_spread)
            self.probe_sent = True
        if self.on_gpu:
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)  # NCCL: the current stream waits for it, the host does not
            self.host.copy_(buf, non_blocking=True)
            self.event.record()
        else:
            self.work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, async_op=True)  # gloo's thread, beside the step
        self.pending = (tr.loss_count, probe)

    def read(self, tr) -> Agreed:
        """The vote in flight, agreed: the loop's one read of the device per step."""
        if self.pending is None:
            raise RuntimeError("no vote in flight")
        count, probe = self.pending
        self.pending = None
        if self.on_gpu:
            self.event.synchronize()  # the device has reached the copy: not the step queued after the vote
            values = self.host.tolist()
        else:
            self.work.wait()
            self.work = None
            values = self.buf.tolist()
        stops, clock_sum, loss_sum, norm_sum, first_sum, relabeled_sum, spread_sum = values
        if probe:
            tr.first_step_loss, tr.first_step_relabeled_loss = first_sum / self.world, relabeled_sum / self.world
            tr.first_step_relabeled_spread = spread_sum / self.world
            self.buf[4:].zero_()
        stop = STOP_DIVERGED if not math.isfinite(loss_sum) else STOP_BUDGET if stops else CONTINUE
        return Agreed(stop=stop, elapsed_s=clock_sum / self.world, loss_sum=loss_sum, loss_count=count,
                      grad_norm=norm_sum / self.world if self.clips else float("nan"))

    def agree_now(self, tr, my_vote: int, now_s: float) -> Agreed:
        """Launch and read at once: where nothing is queued to overlap (before the first step, after the last)."""
        self.launch(tr, my_vote, now_s)
        return self.read(tr)
