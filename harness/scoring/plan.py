"""What evaluation scores, in which order, and which batches are checked: pure functions of the
validation tokens, the track's sizes and a secret seed.

- The val stream is cut into windows of `seq_len` targets (each window's inputs are the
  `seq_len` tokens before its targets). The windows are put in a secret random order and cut
  into batches of `batch_size`; the batches are dealt to scorer ranks round-robin. Neighbouring
  rows of a batch are therefore not neighbouring text, and a model cannot know which window
  follows which. The figure is a sum over tokens: it does not depend on the order or on the
  number of ranks (beyond float64 rounding).
- A secret sample of the batches is re-run with every row's tokens after a secret cut replaced
  by other real validation tokens; a causal model gives the same logits up to the cut. The re-run
  happens after the process that scored is gone: the scorer keeps, of each checked row, only the
  log-probabilities the comparison needs (`keep_for_check`: positions up to the cut, at most
  `window` of them) and compares them with the re-run's (`deviation_kept`).
- One scoring batch per scorer rank, never perturbed (`reproduction_batches`, drawn before the checks
  and never among them), is re-run unchanged by the check process, at a secret place among the
  perturbed ones: a model that cannot reproduce its own log-probabilities there is not deterministic
  on this machine, and a deviation on the perturbed batches proves nothing (`causality_verdict`).
  It is never a checked batch: the check process would then hold a checked row's own tokens after
  its cut, the very tokens a look-ahead needs to answer the perturbed copy as the scoring process did.
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


def rows_to_detect(fraction: float, confidence: float = 0.95) -> int:
    """Rows to check so that a model that looks ahead at `fraction` of the positions is caught with
    `confidence`. Each checked row has one secret cut, uniform over its positions, and only a look past
    the cut at the cut's own position shows: a row catches such a model with probability `fraction`,
    and n rows with 1 - (1 - fraction)^n."""
    if fraction <= 0:
        return 0
    if fraction >= 1:
        return 1
    return math.ceil(math.log(1.0 - confidence) / math.log(1.0 - fraction))


def detectable_fraction(rows: int, confidence: float = 0.95) -> float | None:
    """The smallest fraction of looking-ahead positions that `rows` checked rows catch with `confidence`:
    the record's statement of the check's power."""
    return None if rows <= 0 else 1.0 - (1.0 - confidence) ** (1.0 / rows)


def choose_checks(n_batches: int, fraction: float, seed: int, minimum: int = 2, rows: list[int] | None = None,
                  min_rows: int = 0) -> set[int]:
    """The batches re-run for causality: at least `minimum` (all, if fewer), else a fraction; and more,
    in the same secret order, until they hold `min_rows` rows (`rows`: each batch's rows)."""
    order = [int(b) for b in _rng(seed, 2).permutation(n_batches)]
    k = min(len(order), max(minimum, math.ceil(fraction * n_batches)))
    chosen = order[:k]
    if rows is not None and min_rows:
        have = sum(rows[b] for b in chosen)
        for b in order[k:]:
            if have >= min_rows:
                break
            chosen.append(b)
            have += rows[b]
    return set(chosen)


def reproduction_batches(n_batches: int, world_size: int, seed: int, checked=frozenset()) -> dict[int, int]:
    """{scorer rank: the one of its batches its check process re-runs unchanged}, drawn in secret among those
    not checked, after the checks (which are drawn exactly as without a reproduction: the check's power is
    the same); a rank all of whose batches are checked, or with none, re-runs none."""
    out = {}
    for rank in range(world_size):
        mine = [b for b in batches_for_rank(n_batches, rank, world_size) if b not in checked]
        if mine:
            out[rank] = mine[int(_rng(seed, 4, rank).integers(len(mine)))]
    return out


def check_order(n_jobs: int, seed: int, rank: int) -> list[int]:
    """The secret order in which a rank's check process gets its batches (the perturbed ones and the
    reproduction): its place says nothing. (Its rows have no splice, which a model could notice; knowing
    which batch is unchanged lets it answer no perturbed one as the scoring process did, so a look-ahead
    ends `non-causal`, or `inconclusive` if it spoils the reproduction: never ranked.)"""
    return [int(i) for i in _rng(seed, 5, rank).permutation(n_jobs)]


# A look-ahead is called only on a deviation this many times what the model shows on an unchanged batch:
# one batch a rank against the largest of several checked ones is no even match (an honest model's
# spread of noise), and a look-ahead moves the log-probabilities by nats, not by its own noise.
NONCAUSAL_OVER_NOISE = 10.0


def causality_verdict(worst: float, reproduction: float | None, tolerance: float) -> str:
    """"causal" when no perturbed batch moved the log-probabilities before the cut by more than the
    tolerance; "non-causal" when one did by more than NONCAUSAL_OVER_NOISE times what the model moved on
    the unchanged batch (its own noise; or there was none to reproduce); "inconclusive" otherwise: a model
    that gives other numbers for the same inputs (nondeterministic kernels, atomics, a kernel autotuned
    differently in the two processes, or noise) shows a deviation that proves nothing."""
    if worst <= tolerance:
        return "causal"
    if reproduction is None or worst > max(tolerance, NONCAUSAL_OVER_NOISE * reproduction):
        return "non-causal"
    return "inconclusive"


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
    # (check_cuts draws the same cuts without the inputs)
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


def check_cuts(seed: int, batch: int, rows: int, seq_len: int) -> np.ndarray:
    """The cuts `perturb` draws for this batch (its first draw), known before the inputs are."""
    return _rng(seed, 3, batch).integers(0, seq_len - 1, size=rows)


def kept_positions(cuts, window: int | None) -> list[tuple[int, int]]:
    """Per row, the positions [start, cut] whose log-probabilities are kept for the comparison: all
    of them up to the cut, or the last `window` (the cut's own position, where any look-ahead
    that reaches past the cut shows, is always kept)."""
    return [(0 if window is None else max(0, int(c) + 1 - window), int(c)) for c in cuts]


def keep_for_check(original, cuts, window: int | None = None) -> list:
    """What the comparison needs of the scoring logits [rows, T, V]: each row's log-probabilities
    (float32, on the CPU) at its kept positions. About half the logits with no window; bounded by
    rows x window x V with one."""
    import torch

    out = []
    for r, (start, cut) in enumerate(kept_positions(cuts, window)):
        out.append(torch.log_softmax(original[r, start:cut + 1].float(), -1).cpu())
    return out


def _logprob_diff(lo, lp):
    """|lo - lp| elementwise over log-probabilities: equal values (-inf on both sides included: a
    masked, padded vocabulary entry, where lo - lp would be NaN) agree, NaN on both sides counts as
    agreement and NaN on one side only as the largest disagreement."""
    import torch

    diff = torch.where(lo == lp, torch.zeros((), device=lo.device), (lo - lp).abs())
    diff = torch.where(lo.isnan() & lp.isnan(), torch.zeros((), device=diff.device), diff)  # the same non-answer
    return torch.nan_to_num(diff, nan=float("inf"))  # NaN on one side only is not agreement


def deviation_kept(kept: list, perturbed, cuts, window: int | None = None) -> tuple[float, int, int]:
    """`deviation`, with the scoring side given by `keep_for_check` (the same cuts and window)."""
    import torch

    worst, at = -1.0, (0, 0)
    for r, (start, cut) in enumerate(kept_positions(cuts, window)):
        lp = torch.log_softmax(perturbed[r, start:cut + 1].float(), -1)
        d = _logprob_diff(kept[r].to(lp.device), lp).amax(-1)
        i = int(torch.argmax(d))
        if float(d[i]) > worst:
            worst, at = float(d[i]), (r, start + i)
    return worst, at[0], at[1]


def deviation(original, perturbed, cuts) -> tuple[float, int, int]:
    """(largest |log p_original - log p_perturbed| over each row's positions up to its cut and the whole
    vocabulary, its row, its position). Both are float tensors [rows, T, V] on one device."""
    import torch

    rows, T = original.shape[:2]
    keep = torch.arange(T, device=original.device)[None, :] <= torch.as_tensor(cuts, device=original.device)[:, None]
    lo, lp = torch.log_softmax(original.float(), -1), torch.log_softmax(perturbed.float(), -1)
    diff = _logprob_diff(lo, lp).amax(-1)
    diff = torch.where(keep, diff, torch.zeros((), device=diff.device))
    flat = int(torch.argmax(diff))
    return float(diff.reshape(-1)[flat]), flat // T, flat % T
