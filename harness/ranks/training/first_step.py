"""The first step's check, on every rank before any optimizer step: does the model arrive trained?

Harness code scores the first micro-batch on the plain module in eval mode without gradients: as it is,
and with its vocabulary relabelled by random permutations (`relabel_probe`). Weights drawn without the
data treat every token alike and score the batch like any relabelling of it; a model that knows which
token is which (shipped weights, training before the clock) loses nats on every relabelled copy. The loop all-reduces
the three figures in its per-step vote; the launcher decides (harness/launcher/run/assemble.py
check_first_step). `token_cross_entropy` is also what the loss of a batch is, computed by harness code
in float32 from the logits (the model's own loss is the team's figure).
"""

from __future__ import annotations

import torch

_cross_entropy = torch.nn.functional.cross_entropy  # bound before any submission is imported


RELABELLINGS = 8  # random permutations of the vocabulary the first micro-batch is scored under


def relabel_probe(tr, x, y):
    """(loss, mean relabelled loss, spread of the relabelled losses) of the first micro-batch before any
    optimizer step, as device scalars: the model in eval mode (no dropout, no buffer updated), in
    inference mode as evaluation calls it, eagerly (no graph of the team's compiled for it, on the
    clock), on the plain module (no DDP hook), scoring the batch as it is and under RELABELLINGS random
    permutations of the vocabulary (every token id replaced through the permutation, inputs and targets).

    A model whose weights were drawn without the data treats every token alike (its initialisation is
    the same under any relabelling: a tied embedding's "the next token is this one" included), so the
    batch as it is scores like one more relabelling: within the relabellings' own spread, which is
    what per-token-id accidents of an initialisation (a large random bias on a few ids) make it. A
    model that arrived trained knows which token is which, and every relabelling costs it nats. The
    launcher compares them (harness/launcher/run/assemble.py check_first_step). A probe that fails (a
    model that cannot run without targets, out of memory) gives NaN: the record says so."""
    nan = torch.full((), float("nan"), dtype=torch.float64, device=tr.device)
    raw, was_training = tr.raw_model, tr.raw_model.training
    gen = torch.Generator().manual_seed((tr.job.seed << 8) + tr.env.rank)
    perms = [torch.randperm(tr.job.vocab_size, generator=gen).to(tr.device) for _ in range(RELABELLINGS)]
    try:
        raw.eval()
        with torch.inference_mode(), tr.autocast, torch.compiler.set_stance("force_eager"):
            first = token_cross_entropy(raw(x)[0], y).double()
            relabeled = torch.stack([token_cross_entropy(raw(p[x])[0], p[y]).double() for p in perms])
        return first, relabeled.mean(), relabeled.std()
    except Exception:  # noqa: BLE001 (the training forward, next, reports the model's own error)
        if tr.device.type == "cuda":
            torch.cuda.empty_cache()
        return nan, nan, nan
    finally:
        raw.train(was_training)


def token_cross_entropy(logits, targets):
    """The mean cross-entropy of the targets under the logits, in float32 (summed in float64), by harness
    code and in slices of rows (a full-vocabulary float copy at once could be gigabytes): the model's own
    loss is the team's figure, this one is what evaluation would compute. A device scalar (no sync)."""
    with torch.no_grad():
        flat = logits.detach().reshape(-1, logits.size(-1))
        tgt = targets.reshape(-1)
        rows = max(1, (16 << 20) // max(1, flat.size(-1)))
        total = torch.zeros((), dtype=torch.float64, device=flat.device)
        for i in range(0, flat.size(0), rows):
            total += _cross_entropy(flat[i:i + rows].float(), tgt[i:i + rows], reduction="sum").double()
        return (total / max(1, flat.size(0))).float()
