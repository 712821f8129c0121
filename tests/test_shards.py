import numpy as np
import pytest

from harness.data.shards import (
    HEADER_BYTES,
    DataError,
    check_token_range,
    fingerprint,
    inspect_shard,
    resolve_shards,
    sample_check,
    scan_shard,
    write_shard,
)


@pytest.mark.parametrize("fmt, dtype", [("raw_uint16", np.uint16), ("llmc_uint16", np.uint16), ("llmc_uint32", np.uint32)])
def test_each_format_is_detected_and_read_back(tmp_path, fmt, dtype):
    tokens = np.arange(1000, dtype=np.int64) * 7 % (70000 if dtype == np.uint32 else 65000)
    path = tmp_path / "s.bin"
    write_shard(path, tokens, fmt)
    info = inspect_shard(path)
    assert info.format == fmt and info.num_tokens == 1000
    assert info.offset_bytes == (0 if fmt == "raw_uint16" else HEADER_BYTES)
    np.testing.assert_array_equal(np.asarray(info.tokens()), tokens)


def test_header_count_disagreeing_with_file_size_is_refused(tmp_path):
    path = tmp_path / "cut.bin"
    write_shard(path, np.arange(500), "llmc_uint16")
    with open(path, "r+b") as fh:  # truncate: the header still claims 500 tokens
        fh.truncate(HEADER_BYTES + 400 * 2)
    with pytest.raises(DataError, match=r"cut\.bin: header says 500 tokens but the file holds 400"):
        inspect_shard(path)


def test_odd_sized_raw_file_is_refused(tmp_path):
    path = tmp_path / "odd.bin"
    path.write_bytes(b"\x01\x02\x03")
    with pytest.raises(DataError, match="not a whole number of uint16"):
        inspect_shard(path)


def test_unknown_header_version_is_refused(tmp_path):
    path = tmp_path / "v9.bin"
    header = np.zeros(256, dtype="<i4")
    header[:3] = (20240520, 9, 0)
    path.write_bytes(header.tobytes())
    with pytest.raises(DataError, match="unsupported version 9"):
        inspect_shard(path)


def test_format_mismatch_with_the_track_is_refused(tmp_path):
    path = tmp_path / "h.bin"
    write_shard(path, np.arange(10), "llmc_uint16")
    with pytest.raises(DataError, match="track says format 'raw_uint16'"):
        inspect_shard(path, "raw_uint16")


def test_tokens_outside_the_vocabulary_are_refused(tmp_path):
    path = tmp_path / "big.bin"
    tokens = np.zeros(3 << 20, dtype=np.int64)
    tokens[len(tokens) // 2] = 300  # in the middle: only a full scan sees it
    write_shard(path, tokens, "raw_uint16")
    info = inspect_shard(path)
    sample_check(info, 256)
    with pytest.raises(DataError, match="token id 300 >= vocab_size 256"):
        scan_shard(info, 256)
    with pytest.raises(DataError, match="token id 5 >= vocab_size 5"):
        check_token_range(np.array([1, 5]), 5, "x")


def test_train_glob_matching_a_val_file_is_refused(tmp_path):
    for name in ("chunk_0001.bin", "chunk_0002.bin", "chunk_0003.bin"):
        write_shard(tmp_path / name, np.arange(100), "raw_uint16")
    train, val = resolve_shards(tmp_path, ("chunk_000[12].bin",), ("chunk_0003.bin",), "auto")
    assert [t.path.split("/")[-1] for t in train] == ["chunk_0001.bin", "chunk_0002.bin"] and len(val) == 1
    with pytest.raises(DataError, match="train globs match validation file.*chunk_0003.bin"):
        resolve_shards(tmp_path, ("chunk_*.bin",), ("chunk_0003.bin",), "auto")
    with pytest.raises(DataError, match="no validation shards match"):
        resolve_shards(tmp_path, ("chunk_0001.bin",), ("nothing_*.bin",), "auto")


def test_fingerprint_sees_a_changed_shard(tmp_path):
    path = tmp_path / "a.bin"
    write_shard(path, np.arange(5000), "raw_uint16")
    before = fingerprint([inspect_shard(path)])
    assert fingerprint([inspect_shard(path)]) == before
    write_shard(path, np.arange(5000)[::-1], "raw_uint16")
    assert fingerprint([inspect_shard(path)]) != before
