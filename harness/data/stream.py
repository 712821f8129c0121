"""The training token stream: each rank reads a disjoint part, in an order fixed by the seed.

The stream is a sequence of windows of `seq_len + 1` tokens (inputs and shifted targets).
Window j of a shard covers tokens [j*seq_len, j*seq_len + seq_len + 1). An epoch visits every
window of every shard once, in an order that depends only on (seed, epoch):
shards in a permuted order, and inside a shard, blocks of windows in a permuted order with a
permutation inside each block (good locality on disk, no array the size of the corpus).

Micro-batch i of rank r takes the global positions [(i*W + r)*B, (i*W + r + 1)*B): ranks
interleave, so no window is read by two ranks and the union over ranks is the global order.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator

import numpy as np
import torch

from harness.data.shards import ShardInfo, check_token_range

BLOCK_WINDOWS = 4096


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]))


class EpochOrder:
    """Maps a position in one epoch's order to (shard index, window index)."""

    def __init__(self, windows_per_shard: list[int], seed: int, epoch: int, block: int = BLOCK_WINDOWS):
        self.seed, self.epoch, self.block = seed, epoch, block
        self.shard_order = _rng(seed, epoch, 0x5EED).permutation(len(windows_per_shard))
        self.counts = np.asarray(windows_per_shard, dtype=np.int64)[self.shard_order]
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])
        self.total = int(self.starts[-1])
        self._block_perm: dict[int, np.ndarray] = {}
        self._inner_cache: tuple[tuple[int, int], np.ndarray] | None = None

    def _blocks(self, shard: int, n_windows: int) -> np.ndarray:
        if shard not in self._block_perm:
            n_blocks = -(-n_windows // self.block)
            self._block_perm[shard] = _rng(self.seed, self.epoch, shard, 0xB10C).permutation(n_blocks)
        return self._block_perm[shard]

    def _inner(self, shard: int, block_id: int, length: int) -> np.ndarray:
        key = (shard, block_id)
        if self._inner_cache is None or self._inner_cache[0] != key:
            self._inner_cache = (key, _rng(self.seed, self.epoch, shard, block_id, 0x1AAE).permutation(length))
        return self._inner_cache[1]

    def locate(self, position: int) -> tuple[int, int]:
        slot = int(np.searchsorted(self.starts, position, side="right")) - 1
        shard = int(self.shard_order[slot])
        n_windows = int(self.counts[slot])
        k = position - int(self.starts[slot])
        blocks = self._blocks(shard, n_windows)
        # Every block is full except the last block id, which may be short; it is visited at
        # position p of the permuted order, so positions after it shift by its shortfall.
        short_len = n_windows - (len(blocks) - 1) * self.block
        p = int(np.flatnonzero(blocks == len(blocks) - 1)[0])
        if k < p * self.block:
            b, offset = divmod(k, self.block)
        elif k < p * self.block + short_len:
            b, offset = p, k - p * self.block
        else:
            b, offset = divmod(k - p * self.block - short_len, self.block)
            b += p + 1
        block_id = int(blocks[b])
        length = min(self.block, n_windows - block_id * self.block)
        return shard, block_id * self.block + int(self._inner(shard, block_id, length)[offset])


class TokenStream:
    """Batches [B, T+1] of int64 token ids for one rank; deterministic for (seed, rank, world_size)."""

    def __init__(
        self,
        shards: list[ShardInfo],
        *,
        seq_len: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        vocab_size: int,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world of {world_size}")
        self.shards = shards
        self.tokens = [s.tokens() for s in shards]
        self.seq_len, self.batch, self.rank, self.world = seq_len, micro_batch_size, rank, world_size
        self.seed, self.vocab_size = seed, vocab_size
        self.windows = [max(0, (s.num_tokens - 1) // seq_len) for s in shards]
        if sum(self.windows) < micro_batch_size * world_size:
            total = sum(s.num_tokens for s in shards)
            raise ValueError(
                f"the train shards hold {total} tokens: fewer than one step of "
                f"{world_size} ranks x {micro_batch_size} sequences x {seq_len + 1} tokens"
            )
        self.micro_step = 0
        self._orders: dict[int, EpochOrder] = {}

    def _order(self, epoch: int) -> EpochOrder:
        if epoch not in self._orders:
            self._orders = {epoch: EpochOrder(self.windows, self.seed, epoch)}  # keep only the live epoch
        return self._orders[epoch]

    def window_ids(self, micro_step: int) -> list[tuple[int, int, int]]:
        """(epoch, shard, window) of each sequence of this rank's micro-batch `micro_step`."""
        total = sum(self.windows)
        first = (micro_step * self.world + self.rank) * self.batch
        out = []
        for g in range(first, first + self.batch):
            epoch, pos = divmod(g, total)
            shard, window = self._order(epoch).locate(pos)
            out.append((epoch, shard, window))
        return out

    def batch_at(self, micro_step: int) -> np.ndarray:
        T = self.seq_len
        out = np.empty((self.batch, T + 1), dtype=np.int64)
        for row, (_, shard, window) in enumerate(self.window_ids(micro_step)):
            start = window * T
            out[row] = self.tokens[shard][start : start + T + 1]
        check_token_range(out, self.vocab_size, f"train shard batch {micro_step} (rank {self.rank})")
        return out

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            batch = self.batch_at(self.micro_step)
            self.micro_step += 1
            yield batch

    @property
    def epoch(self) -> int:
        return (self.micro_step * self.world * self.batch) // max(1, sum(self.windows))


class Prefetcher:
    """Keeps the next batches ready in a background thread so a step never waits on disk.

    On CUDA the batches are put in pinned memory, so the copy to the device can be non-blocking.
    An error in the thread is raised in the consumer, at the batch where it happened.
    """

    def __init__(self, stream: TokenStream, *, depth: int = 4, pin_memory: bool = False):
        self.stream, self.pin = stream, pin_memory
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.wait_s = 0.0  # time the consumer spent waiting: should stay near zero
        self.thread = threading.Thread(target=self._fill, name="harness-prefetch", daemon=True)
        self.thread.start()

    def _fill(self) -> None:
        try:
            for batch in self.stream:
                tensor = torch.from_numpy(batch)
                if self.pin:
                    tensor = tensor.pin_memory()
                while not self.stop.is_set():
                    try:
                        self.queue.put(tensor, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
        except BaseException as exc:  # handed to the consumer, which raises it
            self.queue.put(exc)

    def next(self) -> torch.Tensor:
        """The next [B, T+1] batch (pinned on CUDA): copy it to the device whole, then split it."""
        t0 = time.perf_counter()
        item = self.queue.get()
        self.wait_s += time.perf_counter() - t0
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self.stop.set()


def split_inputs_targets(buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and shifted targets, each contiguous (a model may call .view on them)."""
    return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
