"""Token shards on disk: detect the format, check it, and map the tokens without copying.

Two formats are read:
- raw: little-endian uint16 tokens, no header (Paris 2026, nanoGPT's train.bin);
- llm.c / modded-nanogpt: 256 int32 of header (magic, version, token count), then the tokens:
  magic 20240520 / version 1 for uint16 tokens, magic 20240801 / version 7 for uint32 tokens.
"""

from __future__ import annotations

import glob
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
LLMC_MAGIC_U16, LLMC_VERSION_U16 = 20240520, 1
LLMC_MAGIC_U32, LLMC_VERSION_U32 = 20240801, 7

FORMAT_DTYPES = {"raw_uint16": np.dtype("<u2"), "llmc_uint16": np.dtype("<u2"), "llmc_uint32": np.dtype("<u4")}


class DataError(ValueError):
    """A shard or a shard set is unusable; the message names the file and what is wrong."""


@dataclass(frozen=True)
class ShardInfo:
    path: str
    format: str  # raw_uint16 | llmc_uint16 | llmc_uint32
    offset_bytes: int  # where the tokens start
    num_tokens: int
    size_bytes: int

    @property
    def dtype(self) -> np.dtype:
        return FORMAT_DTYPES[self.format]

    def tokens(self) -> np.memmap:
        """The shard's tokens, memory-mapped read-only (no copy, page cache shared across ranks)."""
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset_bytes, shape=(self.num_tokens,))


def inspect_shard(path: str | Path, expected_format: str = "auto") -> ShardInfo:
    """Detect a shard's format from its first bytes and check its size against what it claims."""
    path = str(path)
    size = Path(path).stat().st_size
    header = np.fromfile(path, dtype="<i4", count=HEADER_INTS) if size >= HEADER_BYTES else np.zeros(0, "<i4")
    detected = "raw_uint16"
    if header.size == HEADER_INTS:
        magic, version = int(header[0]), int(header[1])
        if (magic, version) == (LLMC_MAGIC_U16, LLMC_VERSION_U16):
            detected = "llmc_uint16"
        elif (magic, version) == (LLMC_MAGIC_U32, LLMC_VERSION_U32):
            detected = "llmc_uint32"
        elif magic in (LLMC_MAGIC_U16, LLMC_MAGIC_U32):
            raise DataError(
                f"{path}: llm.c header magic {magic} with unsupported version {version} "
                f"(expected {LLMC_VERSION_U16} for magic {LLMC_MAGIC_U16}, {LLMC_VERSION_U32} for {LLMC_MAGIC_U32})"
            )
    if expected_format not in ("auto", detected):
        raise DataError(f"{path}: the track says format {expected_format!r} but the file is {detected!r}")

    if detected == "raw_uint16":
        if size % 2:
            raise DataError(f"{path}: {size} bytes is not a whole number of uint16 tokens (raw format)")
        return ShardInfo(path, detected, 0, size // 2, size)
    itemsize = FORMAT_DTYPES[detected].itemsize
    claimed = int(header[2])
    actual = (size - HEADER_BYTES) // itemsize
    if claimed < 0 or HEADER_BYTES + claimed * itemsize != size:
        raise DataError(
            f"{path}: header says {claimed} tokens but the file holds {actual} "
            f"({size} bytes = {HEADER_BYTES} header + {size - HEADER_BYTES} of {itemsize}-byte tokens); "
            "the shard is truncated or was written with another tool"
        )
    return ShardInfo(path, detected, HEADER_BYTES, claimed, size)


def expand_globs(root: Path, patterns: tuple[str, ...], what: str) -> list[str]:
    """Sorted, de-duplicated files matching the patterns under root; an empty match is an error."""
    files: set[str] = set()
    for pattern in patterns:
        full = pattern if Path(pattern).is_absolute() else str(root / pattern)
        files.update(str(Path(p).resolve()) for p in glob.glob(full) if Path(p).is_file())
    if not files:
        shown = ", ".join(patterns)
        raise DataError(f"no {what} shards match {shown} under {root} (set HARNESS_DATA_ROOT or --data-root)")
    return sorted(files)


def resolve_shards(
    root: Path, train: tuple[str, ...], val: tuple[str, ...], fmt: str
) -> tuple[list[ShardInfo], list[ShardInfo]]:
    """Inspect the train and val shard sets; refuse a train glob that reaches a val file."""
    train_files = expand_globs(root, train, "train")
    val_files = expand_globs(root, val, "validation")
    overlap = sorted(set(train_files) & set(val_files))
    if overlap:
        raise DataError(
            f"the train globs match validation file(s): {', '.join(overlap)}; "
            "narrow the track's [data] train patterns so no validation shard is trained on"
        )
    return [inspect_shard(p, fmt) for p in train_files], [inspect_shard(p, fmt) for p in val_files]


def check_token_range(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    """Refuse tokens outside the vocabulary (an embedding lookup would fail later, far from the cause)."""
    if tokens.size and int(tokens.max()) >= vocab_size:
        bad = int(tokens.max())
        raise DataError(f"{where}: token id {bad} >= vocab_size {vocab_size}; wrong tokenizer or wrong track?")


def scan_shard(info: ShardInfo, vocab_size: int, chunk_tokens: int = 1 << 24) -> None:
    """Read a whole shard once and check every token id (organisers run this when staging data)."""
    tokens = info.tokens()
    for start in range(0, info.num_tokens, chunk_tokens):
        check_token_range(np.asarray(tokens[start : start + chunk_tokens]), vocab_size, info.path)


def sample_check(info: ShardInfo, vocab_size: int, window: int = 1 << 20) -> None:
    """The cheap check done before every run: the first and last window of the shard."""
    tokens = info.tokens()
    check_token_range(np.asarray(tokens[:window]), vocab_size, info.path)
    check_token_range(np.asarray(tokens[-window:]), vocab_size, info.path)


def fingerprint(shards: list[ShardInfo], block_bytes: int = 1 << 16, blocks: int = 8) -> str:
    """A short, cheap identity of a shard set: names, sizes and evenly spaced blocks of bytes.

    Hashing 92 GiB on every run is too slow; sampled blocks catch a different, truncated or
    regenerated shard, which is what a record needs to show.
    """
    digest = hashlib.sha256()
    for info in shards:
        digest.update(f"{Path(info.path).name}:{info.size_bytes}:{info.format}\n".encode())
        with open(info.path, "rb") as fh:
            for i in range(blocks):
                fh.seek(max(0, (info.size_bytes - block_bytes) * i // max(1, blocks - 1)))
                digest.update(fh.read(block_bytes))
    return digest.hexdigest()[:16]


def write_shard(path: str | Path, tokens: np.ndarray, fmt: str = "llmc_uint16") -> None:
    """Write tokens in one of the readable formats (used by the synthetic data and by tests)."""
    dtype = FORMAT_DTYPES[fmt]
    tokens = np.asarray(tokens)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(dtype).max):
        raise DataError(f"{path}: tokens do not fit {dtype}")
    with open(path, "wb") as fh:
        if fmt != "raw_uint16":
            header = np.zeros(HEADER_INTS, dtype="<i4")
            magic, version = (
                (LLMC_MAGIC_U16, LLMC_VERSION_U16) if fmt == "llmc_uint16" else (LLMC_MAGIC_U32, LLMC_VERSION_U32)
            )
            header[:3] = (magic, version, tokens.size)
            fh.write(header.tobytes())
        fh.write(tokens.astype(dtype).tobytes())
