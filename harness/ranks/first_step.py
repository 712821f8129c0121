"""The first step's check, on every rank before any optimizer step: does the model arrive trained?

Harness code scores the first micro-batch twice, on the plain module in eval mode without gradients:
as it is, and with its vocabulary relabelled by a random permutation (`relabel_probe`). Weights drawn
without the data treat every token alike and score both alike; a model that knows which token is which
(shipped weights, training before the clock) loses nats on the relabelled copy. The loop all-reduces
the three figures in its per-step vote; the launcher decides (harness/launcher/assemble.py
check_first_step). `token_cross_entropy` is also what the loss of a batch is, computed by harness code
in float32 from the logits (the model's own loss is the team's figure).
"""

from __future__ import annotations

import torch

_cross_entropy = torch.nn.functional.cross_entropy  # bound before any submission is imported


def relabel_probe(tr, x, y):
    """(loss, relabelled loss, the variance of their difference) of the first micro-batch before any
    optimizer step, as device scalars: the
    model in eval mode (no dropout, no buffer updated), without gradients, on the plain module (no DDP
    hook, no compiled graph to recompile), scoring the batch as it is and with every token id replaced by
    a random permutation of the vocabulary. A model whose weights were drawn without the data treats
    every token alike (its initialisation is the same under any relabelling: a tied embedding's "the
    next token is this one" included), so both scores agree to noise; a model that arrived trained knows
    which token is which, and the relabelled batch costs it nats. The launcher compares them
    (harness/launcher/assemble.py check_first_step). A probe that fails (a model that cannot run
    without targets, out of memory) is left out: NaN, and the training step says what is wrong."""
    nan = torch.full((), float("nan"), dtype=torch.float64, device=tr.device)
    raw, was_training = tr.raw_model, tr.raw_model.training
    gen = torch.Generator().manual_seed((tr.job.seed << 8) + tr.env.rank)
    perm = torch.randperm(tr.job.vocab_size, generator=gen).to(tr.device)
    try:
        raw.eval()
        with torch.no_grad(), tr.autocast:
            first, var_a = token_cross_entropy(raw(x)[0], y, with_variance=True)
            relabeled, var_b = token_cross_entropy(raw(perm[x])[0], perm[y], with_variance=True)
        return first, relabeled, (var_a + var_b) / y.numel()  # the two halves' tokens are scored independently
    except Exception:  # noqa: BLE001 (the training forward, next, reports the model's own error)
        if tr.device.type == "cuda":
            torch.cuda.empty_cache()
        return nan, nan, nan
    finally:
        raw.train(was_training)


def token_cross_entropy(logits, targets, with_variance: bool = False):
    """The mean cross-entropy of the targets under the logits, in float32 (summed in float64), by harness
    code and in slices of rows (a full-vocabulary float copy at once could be gigabytes): the model's own
    loss is the team's figure, this one is what evaluation would compute. Device scalars (no sync): the
    mean, and with `with_variance` the per-token variance too."""
    with torch.no_grad():
        flat = logits.detach().reshape(-1, logits.size(-1))
        tgt = targets.reshape(-1)
        rows = max(1, (16 << 20) // max(1, flat.size(-1)))
        total = torch.zeros((), dtype=torch.float64, device=flat.device)
        squares = torch.zeros((), dtype=torch.float64, device=flat.device)
        for i in range(0, flat.size(0), rows):
            per_token = _cross_entropy(flat[i:i + rows].float(), tgt[i:i + rows], reduction="none").double()
            total += per_token.sum()
            squares += per_token.square().sum()
        n = max(1, flat.size(0))
        mean = total / n
        return (mean, (squares / n - mean * mean).clamp_min(0.0)) if with_variance else mean.float()
