"""Shards like the event's from a team's or an organiser's own text: `harness data prepare`.

Documents are read in the order given (a .txt or .md file is one document; a .parquet file gives
one document per row of its `text` column, as FineWeb's files do; parquet needs `pyarrow`),
tokenized with a `tokenizers` JSON file, each preceded by the tokenizer's end-of-text token where
it has one, and written to numbered shards (`chunk_0001.bin`, ...) of at most `shard_tokens`
tokens, in `raw_uint16` (Paris 2026) or `llmc_uint16` (llm.c) format. The same inputs in the same
order give the same bytes. Each shard is written under a temporary name and renamed when whole.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from harness.data.shards import DataError, write_shard

OUT_FORMATS = ("raw_uint16", "llmc_uint16")
EOT_NAMES = ("<|endoftext|>", "</s>", "<eos>")
BATCH_DOCS = 256  # documents encoded together (the tokenizer parallelises within a batch)


@dataclass(frozen=True, kw_only=True)
class ShardPlan:
    out_dir: Path
    fmt: str = "raw_uint16"
    shard_tokens: int = 100_000_000  # at most this many tokens per shard (200 MB of uint16)
    prefix: str = "chunk_"

    def __post_init__(self) -> None:
        if self.fmt not in OUT_FORMATS:
            raise DataError(f"--format must be one of {', '.join(OUT_FORMATS)}, got {self.fmt!r}")
        if self.shard_tokens < 1:
            raise DataError(f"--shard-tokens must be >= 1, got {self.shard_tokens}")


def load_tokenizer(path: str | Path):
    """A `tokenizers` JSON file (tokenizer.json); its vocabulary must fit uint16."""
    from tokenizers import Tokenizer

    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such tokenizer file (give the tokenizer.json of a `tokenizers` tokenizer)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise DataError(f"{path}: not a `tokenizers` JSON file ({exc})") from None
    if tok.get_vocab_size() > 65536:
        raise DataError(f"{path}: vocabulary of {tok.get_vocab_size()} does not fit uint16 shards (<= 65536)")
    return tok


def end_of_text_id(tok) -> int | None:
    for name in EOT_NAMES:
        if (i := tok.token_to_id(name)) is not None:
            return i
    return None


def documents(path: Path) -> Iterator[str]:
    """The documents of one input file, in order."""
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{path}: reading parquet needs pyarrow (pip install -e \".[parquet]\", "
                            "or pip install pyarrow)") from None
        table = pq.ParquetFile(path)
        if "text" not in table.schema_arrow.names:
            raise DataError(f"{path}: no `text` column (columns: {', '.join(table.schema_arrow.names)})")
        for batch in table.iter_batches(columns=["text"]):
            yield from (t for t in batch.column(0).to_pylist() if t)
    else:
        yield path.read_text(encoding="utf-8", errors="replace")


def prepare_shards(inputs: Iterable[str | Path], tokenizer: str | Path, plan: ShardPlan,
                   progress: Callable[[int], None] | None = None) -> list[Path]:
    """Tokenize the inputs into shards; `progress(bytes)` after each input file. Returns the shards."""
    paths = [Path(p) for p in inputs]
    for p in paths:
        if not p.is_file():
            raise DataError(f"{p}: no such input file")
    tok = load_tokenizer(tokenizer)
    eot = end_of_text_id(tok)
    plan.out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    pending: list[np.ndarray] = []
    held = 0

    def flush(final: bool) -> None:
        nonlocal pending, held
        tokens = np.concatenate(pending) if pending else np.zeros(0, dtype=np.int64)
        while tokens.size >= plan.shard_tokens or (final and tokens.size):
            shard, tokens = tokens[: plan.shard_tokens], tokens[plan.shard_tokens:]
            out = plan.out_dir / f"{plan.prefix}{len(written) + 1:04d}.bin"
            tmp = out.with_name(f".{out.name}.part")
            write_shard(tmp, shard, plan.fmt)
            os.replace(tmp, out)
            written.append(out)
        pending, held = [tokens], int(tokens.size)

    for path in paths:
        batch: list[str] = []
        for doc in documents(path):
            batch.append(doc)
            if len(batch) == BATCH_DOCS:
                held += _encode_into(tok, batch, eot, pending)
                batch = []
                if held >= plan.shard_tokens:
                    flush(final=False)
        held += _encode_into(tok, batch, eot, pending)
        if held >= plan.shard_tokens:
            flush(final=False)
        if progress:
            progress(path.stat().st_size)
    flush(final=True)
    return written


def _encode_into(tok, docs: list[str], eot: int | None, out: list[np.ndarray]) -> int:
    n = 0
    for enc in tok.encode_batch(docs, add_special_tokens=False) if docs else ():
        ids = np.asarray(([eot] if eot is not None else []) + enc.ids, dtype=np.int64)
        out.append(ids)
        n += ids.size
    return n
