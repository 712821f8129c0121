"""A track's data made ready for a run: shards found and checked, fingerprinted, floor known."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.data.shards import DataError, ShardInfo, fingerprint, inspect_shard, resolve_shards, sample_check
from harness.tracks.spec import Track, data_root


@dataclass
class PreparedData:
    train: list[ShardInfo]
    val: list[ShardInfo]
    fingerprint: str
    loss_floor: float | None = None  # synthetic data only: the true source's loss on the val tokens
    loss_floor_token_std: float | None = None  # the spread of the source's per-token losses there
    unigram_entropy: float | None = None
    entropy_rate: float | None = None
    location: str = ""

    @property
    def train_tokens(self) -> int:
        return sum(s.num_tokens for s in self.train)


def prepare_data(track: Track, cli_root: str | None = None, say: Callable[[str], None] | None = None) -> PreparedData:
    data = track.data
    if data.source == "synthetic":
        from harness.data.synthetic import build_synthetic, loss_floor_and_spread

        corpus = build_synthetic(data, progress=say)
        meta = json.loads((corpus / "meta.json").read_text())
        train, val = [inspect_shard(corpus / "train.bin")], [inspect_shard(corpus / "val.bin")]
        floor, floor_std = loss_floor_and_spread(data, corpus, track.eval.seq_len)
        prepared = PreparedData(
            train=train, val=val, fingerprint=fingerprint(train + val), loss_floor=floor, loss_floor_token_std=floor_std,
            unigram_entropy=meta["unigram_entropy_nats"], entropy_rate=meta["entropy_rate_nats"],
            location=str(corpus),
        )
    elif data.source == "text":
        from harness.data.text import build_text

        corpus = build_text(data, progress=say)
        meta = json.loads((corpus / "meta.json").read_text())
        train, val = [inspect_shard(corpus / "train.bin")], [inspect_shard(corpus / "val.bin")]
        prepared = PreparedData(train=train, val=val, fingerprint=fingerprint(train + val),
                                unigram_entropy=meta["unigram_entropy_nats"], location=str(corpus))
    else:
        root = data_root(track, cli_root)
        train, val = resolve_shards(root, data.train, data.val, data.format)
        for info in train + val:
            sample_check(info, data.vocab_size)
        prepared = PreparedData(train=train, val=val, fingerprint=fingerprint(train + val), location=str(root))
    val_have = sum(s.num_tokens for s in prepared.val)
    if val_have < data.val_tokens + 1:
        raise DataError(f"the validation shards hold {val_have} tokens; the track scores {data.val_tokens} "
                        f"(+1 for the shift): add validation data or lower val_tokens")
    return prepared


def data_summary(prepared: PreparedData) -> dict:
    return {
        "location": prepared.location,
        "train_shards": [Path(s.path).name for s in prepared.train],
        "val_shards": len(prepared.val),
        "train_tokens": prepared.train_tokens,
        "format": prepared.train[0].format if prepared.train else None,
        "entropy_rate": prepared.entropy_rate,
    }
