import numpy as np
import pytest

from harness.data.shards import inspect_shard, write_shard
from harness.data.stream import EpochOrder, Prefetcher, TokenStream, split_inputs_targets


@pytest.fixture
def shards(tmp_path):
    out = []
    for i, n in enumerate((5000, 3001, 777)):
        path = tmp_path / f"s{i}.bin"
        write_shard(path, (np.arange(n) + 1000 * i) % 256, "llmc_uint16" if i % 2 else "raw_uint16")
        out.append(inspect_shard(path))
    return out


def _stream(shards, rank, world, seed=3, batch=4, seq_len=16):
    return TokenStream(shards, seq_len=seq_len, micro_batch_size=batch, rank=rank, world_size=world, seed=seed,
                       vocab_size=256)


def test_same_seed_gives_the_same_batches(shards):
    a, b = _stream(shards, 0, 2), _stream(shards, 0, 2)
    for step in range(20):
        np.testing.assert_array_equal(a.batch_at(step), b.batch_at(step))
    c = _stream(shards, 0, 2, seed=4)
    assert any(not np.array_equal(a.batch_at(s), c.batch_at(s)) for s in range(5))


def test_ranks_read_disjoint_windows_that_cover_the_epoch(shards):
    world = 3
    streams = [_stream(shards, r, world) for r in range(world)]
    total = sum(streams[0].windows)
    steps = total // (world * 4)
    seen = [set() for _ in range(world)]
    for r, s in enumerate(streams):
        for step in range(steps):
            seen[r].update((shard, w) for epoch, shard, w in s.window_ids(step) if epoch == 0)
    for i in range(world):
        for j in range(i + 1, world):
            assert not seen[i] & seen[j], "two ranks read the same window"
    assert sum(len(s) for s in seen) == steps * world * 4  # no window twice within a rank either


def test_batches_hold_inputs_and_shifted_targets_from_the_shards(shards):
    s = _stream(shards, 1, 2)
    batch = s.batch_at(0)
    assert batch.shape == (4, 17) and batch.dtype == np.int64
    for row, (_, shard, window) in zip(batch, s.window_ids(0)):
        np.testing.assert_array_equal(row, np.asarray(shards[shard].tokens()[window * 16: window * 16 + 17]))


def test_epoch_order_is_a_permutation_with_odd_block_sizes():
    for counts in ([10], [4096 * 2 + 5, 3], [1, 1, 1]):
        order = EpochOrder(counts, seed=1, epoch=2, block=4096)
        seen = {order.locate(i) for i in range(order.total)}
        assert len(seen) == order.total


def test_stream_wraps_into_a_new_epoch_in_a_new_order(shards):
    s = _stream(shards, 0, 1, batch=8)
    total = sum(s.windows)
    ids = [w for step in range(2 * total // 8 + 1) for w in s.window_ids(step)]
    first = [x[1:] for x in ids if x[0] == 0]
    second = [x[1:] for x in ids if x[0] == 1]
    assert sorted(first) == sorted(set(first)) and len(first) == total
    assert second[: len(first)] != first[: len(second)]


def test_prefetcher_delivers_the_stream_in_order_and_reports_errors(shards):
    s = _stream(shards, 0, 2)
    expected = [s.batch_at(i) for i in range(5)]
    p = Prefetcher(_stream(shards, 0, 2), depth=2)
    for want in expected:
        x, y = split_inputs_targets(p.next())
        assert x.is_contiguous() and y.is_contiguous()  # a model may call .view on them
        np.testing.assert_array_equal(x.numpy(), want[:, :-1])
        np.testing.assert_array_equal(y.numpy(), want[:, 1:])
    p.close()
    bad = _stream(shards, 0, 2)
    bad.vocab_size = 10  # every batch now holds out-of-range ids
    p = Prefetcher(bad)
    with pytest.raises(ValueError, match=">= vocab_size 10"):
        p.next()
    p.close()


def test_too_little_data_for_one_step_is_refused(shards):
    with pytest.raises(ValueError, match="fewer than one step"):
        TokenStream(shards[2:], seq_len=256, micro_batch_size=8, rank=0, world_size=2, seed=0, vocab_size=256)
