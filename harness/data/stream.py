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

import bisect
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
    """Maps a position in one epoch's order to (shard index, window index). Pure integer work per call."""

    def __init__(self, windows_per_shard: list[int], seed: int, epoch: int, block: int = BLOCK_WINDOWS):
        self.seed, self.epoch, self.block = seed, epoch, block
        self.shard_order = [int(i) for i in _rng(seed, epoch, 0x5EED).permutation(len(windows_per_shard))]
        self.counts = [int(windows_per_shard[i]) for i in self.shard_order]
        self.starts = [0]
        for c in self.counts:
            self.starts.append(self.starts[-1] + c)
        self.total = self.starts[-1]
        self._slots: dict[int, tuple[list[int], int, int]] = {}
        self._inner_key: tuple[int, int] | None = None
        self._inner: list[int] = []

    def _slot(self, shard: int, n_windows: int) -> tuple[list[int], int, int]:
        """(visit order of the shard's blocks, where its short last block is visited, that block's size)."""
        if shard not in self._slots:
            n_blocks = -(-n_windows // self.block)
            order = [int(b) for b in _rng(self.seed, self.epoch, shard, 0xB10C).permutation(n_blocks)]
            self._slots[shard] = (order, order.index(n_blocks - 1), n_windows - (n_blocks - 1) * self.block)
        return self._slots[shard]

    def locate(self, position: int) -> tuple[int, int]:
        slot = bisect.bisect_right(self.starts, position) - 1
        shard, n_windows = self.shard_order[slot], self.counts[slot]
        k = position - self.starts[slot]
        blocks, p, short_len = self._slot(shard, n_windows)
        # Every block is full except the last block id, which may be short; it is visited at
        # position p of the permuted order, so positions after it shift by its shortfall.
        if k < p * self.block:
            b, offset = divmod(k, self.block)
        elif k < p * self.block + short_len:
            b, offset = p, k - p * self.block
        else:
            b, offset = divmod(k - p * self.block - short_len, self.block)
            b += p + 1
        block_id = blocks[b]
        if self._inner_key != (shard, block_id):
            length = min(self.block, n_windows - block_id * self.block)
            self._inner = _rng(self.seed, self.epoch, shard, block_id, 0x1AAE).permutation(length).tolist()
            self._inner_key = (shard, block_id)
        return shard, block_id * self.block + self._inner[offset]


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
        self.tokens = [np.asarray(s.tokens()) for s in shards]  # plain views of the maps: cheaper slicing
        self.seq_len, self.batch, self.rank, self.world = seq_len, micro_batch_size, rank, world_size
        self.seed, self.vocab_size = seed, vocab_size
        self.windows = [max(0, (s.num_tokens - 1) // seq_len) for s in shards]
        if sum(self.windows) < micro_batch_size * world_size:
            total = sum(s.num_tokens for s in shards)
            raise ValueError(
                f"the train shards hold {total} tokens: fewer than one step of "
                f"{world_size} ranks x {micro_batch_size} sequences x {seq_len + 1} tokens"
            )
        self.total_windows = sum(self.windows)
        self.micro_step = 0
        self._orders: dict[int, EpochOrder] = {}

    def _order(self, epoch: int) -> EpochOrder:
        if epoch not in self._orders:
            self._orders = {epoch: EpochOrder(self.windows, self.seed, epoch)}  # keep only the live epoch
        return self._orders[epoch]

    def window_ids(self, micro_step: int) -> list[tuple[int, int, int]]:
        """(epoch, shard, window) of each sequence of this rank's micro-batch `micro_step`."""
        total = self.total_windows
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
