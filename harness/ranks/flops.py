"""FLOPs per training token, measured, not guessed, in the process that builds the submission's model.

torch's FLOP counter over one training step (forward and backward) of the submission's real
model at the run's micro-batch and sequence length. The model is built on the meta device, so
nothing is computed and no memory is used; a model that cannot be built there is counted on
the CPU at batch 1 and scaled (FLOPs are linear in the batch).

One correction to torch's formulas: its convolution backward counts the weight gradient as if
`groups` were 1 (every input channel against every output channel), which overcounts a
depthwise convolution by its channel count (a real team model read 8.1 MFLOP/token against 3.3
for a plain GPT of its shape). Here the weight gradient of a grouped convolution is counted as
executed: each output channel meets only in_channels / groups input channels.
"""

from __future__ import annotations

from typing import Any, Callable


def conv_backward_flop(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                       _output_padding, groups, output_mask, out_shape=None, **kwargs) -> int:
    """torch's convolution backward formula (input gradient as a transposed convolution, weight
    gradient as a convolution of the input with the output gradient), with the weight gradient
    divided by `groups`: each output channel meets only in_channels / groups input channels."""
    from torch.utils.flop_counter import conv_flop_count, get_shape

    def swap(shape):  # batch and channel dimensions exchanged
        return [shape[1], shape[0], *shape[2:]]

    total = 0
    if output_mask[0]:
        total += conv_flop_count(grad_out_shape, w_shape, get_shape(out_shape[0]), not transposed)
    if output_mask[1]:
        grad_weight_shape = get_shape(out_shape[1])
        if transposed:
            full = conv_flop_count(swap(grad_out_shape), swap(x_shape), swap(grad_weight_shape), transposed=False)
        else:
            full = conv_flop_count(swap(x_shape), swap(grad_out_shape), swap(grad_weight_shape), transposed=False)
        total += full // max(1, int(groups))
    return total


def flop_counter():
    """torch's FLOP counter with the grouped-convolution correction above (a context manager)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flop})


def count_training_flops_per_token(build: Callable[[], Any], vocab_size: int, batch: int, seq_len: int) -> dict:
    """FLOPs of one forward + backward at [batch, seq_len], per token, with how they were counted."""
    import torch

    def one_step(device: str, b: int) -> int:
        with torch.device(device):
            model = build()
        model.train()
        if device == "meta":
            idx = torch.empty(b, seq_len, dtype=torch.long, device="meta")
        else:
            idx = torch.randint(0, vocab_size, (b, seq_len))
        with flop_counter() as counter:
            _, loss = model(idx, idx)
            loss.backward()
        return counter.get_total_flops()

    try:
        total = one_step("meta", batch)
        return {"flops_per_token": total / (batch * seq_len), "flops_method": "meta",
                "flops_note": f"counted on the meta device at batch {batch} (no compute, no memory)"}
    except Exception as exc:  # a model that computes on real values at build or forward time
        failed = _one_line(exc)
    total = one_step("cpu", 1) * batch
    return {"flops_per_token": total / (batch * seq_len), "flops_method": f"cpu batch 1 x {batch}",
            "flops_note": (f"the model could not be counted on the meta device ({failed}), so it was counted on "
                           f"the CPU at batch 1 and scaled by the micro-batch ({batch}); FLOPs are linear in the "
                           "batch, so the figure is the same")}


def _one_line(exc: BaseException, limit: int = 160) -> str:
    """What failed, short enough for a report line: the type and the first line of the message."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
