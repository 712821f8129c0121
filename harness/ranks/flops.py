"""FLOPs per training token, measured, not guessed, in the process that builds the submission's model.

torch's FLOP counter over one training step (forward and backward) of the submission's real
model at the run's micro-batch and sequence length. The model is built on the meta device, so
nothing is computed and no memory is used; a model that cannot be built there is counted on
the CPU at batch 1 and scaled (FLOPs are linear in the batch).
"""

from __future__ import annotations

from typing import Any, Callable


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
