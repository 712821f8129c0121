"""What evaluation scores, in which order, and which batches are checked: pure functions of the
validation tokens, the track's sizes and a secret seed.

- The val stream is cut into windows of `seq_len` targets (each window's inputs are the
  `seq_len` tokens before its targets). The windows are put in a secret random order and cut
  into batches of `batch_size`; the batches are dealt to scorer ranks round-robin. Neighbouring
  rows of a batch are therefore not neighbouring text, and a model cannot know which window
  follows which. The figure is a sum over tokens: it does not depend on the order or on the
  number of ranks (beyond float64 rounding).
- A secret sample of the batches is re-run with every row's tokens after a secret cut replaced
  by other real validation tokens; a causal model gives the same logits up to the cut.
"""

from __future__ import annotations

import math

import numpy as np


def read_val_tokens(shards, val_tokens: int, vocab_size: int) -> np.ndarray:
    """The first val_tokens + 1 tokens of the val shards, in sorted order, range-checked."""
    from harness.data.shards import DataError, check_token_range

    need = val_tokens + 1
    have = sum(s.num_tokens for s in shards)
    if have < need:
        raise DataError(f"the validation shards hold {have} tokens; the track scores {val_tokens} (+1 for the shift)")
    parts, left = [], need
    for s in shards:
        take = min(left, s.num_tokens)
        parts.append(np.asarray(s.tokens()[:take], dtype=np.int64))
        left -= take
        if left == 0:
            break
    tokens = np.concatenate(parts)
    check_token_range(tokens, vocab_size, "validation shards")
    return tokens


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed & (2**63 - 1), *stream]))


def window_order(n_windows: int, seed: int) -> np.ndarray:
    return _rng(seed, 1).permutation(n_windows)


def batch_plan(n_windows: int, batch_size: int) -> list[tuple[int, int]]:
    """Batches as (first position in the window order, number of windows). Independent of world size."""
    return [(w, min(batch_size, n_windows - w)) for w in range(0, n_windows, batch_size)]


def batches_for_rank(n_batches: int, rank: int, world_size: int) -> list[int]:
    return list(range(rank, n_batches, world_size))


def choose_checks(n_batches: int, fraction: float, seed: int, minimum: int = 2) -> set[int]:
    """The batches re-run for causality: at least `minimum` (all, if fewer), else a fraction."""
    k = min(n_batches, max(minimum, math.ceil(fraction * n_batches)))
    return {int(b) for b in _rng(seed, 2).choice(n_batches, size=k, replace=False)}


def window_batch(tokens: np.ndarray, window_ids: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and targets [rows, seq_len] of the given windows."""
    idx = (np.asarray(window_ids)[:, None] * seq_len) + np.arange(seq_len + 1)
    buf = tokens[idx]
    return np.ascontiguousarray(buf[:, :-1]), np.ascontiguousarray(buf[:, 1:])


def perturb(x: np.ndarray, tokens: np.ndarray, seed: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """A copy of the inputs with every row's tokens after a secret cut replaced by real validation
    tokens from elsewhere in the stream; returns (inputs, cuts). The first replaced token always
    differs from the original one, so a look at it cannot go unseen."""
    rng = _rng(seed, 3, batch)
    rows, T = x.shape
    out, cuts = x.copy(), rng.integers(0, T - 1, size=rows)  # cut in [0, T-2]: at least one token replaced
    for r in range(rows):
        c = int(cuts[r])
        n = T - 1 - c
        for _ in range(64):
            start = int(rng.integers(0, len(tokens) - n))
            if tokens[start] != x[r, c + 1]:
                break
        out[r, c + 1:] = tokens[start:start + n]
        if out[r, c + 1] == x[r, c + 1]:  # a stream of one repeated token: change it outright
            out[r, c + 1] = (x[r, c + 1] + 1) % max(2, int(tokens.max()) + 1)
    return out, cuts


def deviation(original, perturbed, cuts) -> tuple[float, int, int]:
    """(largest |log p_original - log p_perturbed| over each row's positions up to its cut and the whole
    vocabulary, its row, its position). Both are float tensors [rows, T, V] on one device."""
    import torch

    rows, T = original.shape[:2]
    keep = torch.arange(T, device=original.device)[None, :] <= torch.as_tensor(cuts, device=original.device)[:, None]
    lo, lp = torch.log_softmax(original.float(), -1), torch.log_softmax(perturbed.float(), -1)
    diff = (lo - lp).abs()
    diff = torch.where(lo.isnan() & lp.isnan(), torch.zeros((), device=diff.device), diff)  # the same non-answer
    diff = torch.nan_to_num(diff, nan=float("inf")).amax(-1)  # NaN on one side only is not agreement
    diff = torch.where(keep, diff, torch.zeros((), device=diff.device))
    flat = int(torch.argmax(diff))
    return float(diff.reshape(-1)[flat]), flat // T, flat % T
