"""What an open-division training script may tell the harness: one line each, all optional.

    from harness.ranks import open_api as harness

    harness.first_forward()                       # the start-up is over: the budget starts now
    harness.progress(step, tokens, train_loss)    # shown live and kept in metrics.csv (rank 0's)
    harness.training_done(step, tokens)           # the clock stops; saving the checkpoint follows

Outside the harness (a team's own `torchrun train.py`) every call does nothing, so a script runs
unchanged either way. These are claims, not measurements: the launcher stamps each with its own
clock, the recorded window starts no later than the ranks' start plus the track's start-up
allowance, and the hard kill (ranks' start + allowance + budget + grace) holds whatever a script
says (docs/submission.md, open division).
"""

from __future__ import annotations

import time
from typing import Any

_channel = None  # set by harness/ranks/open_rank.py before the script runs
_started_at: float | None = None
_ended = False
_last_progress_s = 0.0
PROGRESS_EVERY_S = 0.5  # reports are rate-limited: a script may call progress() every step
OWN_KEYS = {"kind", "rank", "step", "tokens", "train_loss", "train_time_s", "tokens_per_s", "reported"}


def in_harness() -> bool:
    return _channel is not None


def first_forward() -> None:
    """Call once, just before the first training forward pass (after model build, compile, data)."""
    global _started_at
    if _channel is None or _started_at is not None:
        return
    _started_at = time.perf_counter()
    _channel.send("train_start", clock_start="first_forward")


def _elapsed() -> float:
    return time.perf_counter() - _started_at if _started_at is not None else 0.0


def progress(step: int, tokens: int | None = None, train_loss: float | None = None, **extra: Any) -> None:
    """The script's own figures (rank 0's are kept): step, tokens trained on over all ranks, loss."""
    global _last_progress_s
    if _channel is None or _ended:
        return
    now = time.perf_counter()
    if now - _last_progress_s < PROGRESS_EVERY_S:
        return
    _last_progress_s = now
    elapsed = _elapsed()
    _channel.send("progress", step=int(step), tokens=None if tokens is None else int(tokens),
                  train_loss=None if train_loss is None else float(train_loss), train_time_s=elapsed,
                  tokens_per_s=(tokens / elapsed) if tokens and elapsed > 0 else None, reported=True,
                  **{k: v for k, v in extra.items() if isinstance(v, (int, float, str, bool)) and k not in OWN_KEYS})


def training_done(step: int, tokens: int | None = None, train_loss: float | None = None) -> None:
    """Call once when the last optimizer step is done, before saving the checkpoint."""
    global _ended, _last_progress_s
    if _channel is None or _ended:
        return
    _last_progress_s = 0.0
    progress(step, tokens, train_loss)
    _ended = True
    _channel.send("train_end", step=int(step), tokens=None if tokens is None else int(tokens),
                  train_time_s=_elapsed())
