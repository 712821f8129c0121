"""The `local-text` track's corpus: real text on every machine, without a download.

The text is the running Python's own: training on its standard library's .py files (code,
comments and English docstrings; test folders excluded), validation on its test suite's .py files
(`<stdlib>/test`). The split is by folder, not by a public hash of paths, because the validation
text must be unreadable where team code runs: every sandbox hides the Python test suites
(harness/ranks/confine/sandbox.py HIDDEN_GLOBS), while the rest of the standard library, which Python
and torch need, stays readable. So no validation text was ever seen in training, and no model can
look it up in evaluation. (The test suite is public: teams can carry it in their weights, as with
any public validation set; local-text compares models on a laptop, it is not for prizes.) A
byte-level BPE tokenizer (the `tokenizers` library) is trained on the training files only, to the
track's `vocab_size`, and both splits are written in the Paris 2026 shard format (raw
little-endian uint16), each file's tokens preceded by `<|endoftext|>`.

Built once into the cache (HARNESS_CACHE_DIR, default ~/.cache/speedrun-harness), under a file
lock so that two runs starting together build it once; the output is a pure function of the
track's [data.text] table and the standard library's files (the cache key includes the Python
version and the files' names and sizes: two machines with the same Python get the same tokens,
and every record carries the data's fingerprint).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from harness.data.shards import write_shard
from harness.data.synthetic import cache_root
from harness.tracks.spec import DataSpec

FORMAT_VERSION = 2  # 2: validation from the test suite (hidden from every sandbox), not from hashed paths
EOT = "<|endoftext|>"
SKIP_PARTS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
TEST_SUITE = "test"  # <stdlib>/test: the validation text, matched by sandbox.HIDDEN_GLOBS


def stdlib_files() -> tuple[Path, list[str]]:
    """The standard library's folder and its .py files (relative paths, sorted), tests excluded."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                   if not SKIP_PARTS & set(p.relative_to(root).parts))
    if not files:
        raise FileNotFoundError(f"no .py files under {root}: this Python ships without its standard library's "
                                "sources; use a track with shards instead")
    return root, files


def test_suite_files() -> tuple[Path, list[str]]:
    """The standard library's folder and its test suite's .py files (relative paths, sorted)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p.relative_to(root)) for p in (root / TEST_SUITE).rglob("*.py") if "__pycache__" not in p.parts)
    if len(files) < 100:
        raise FileNotFoundError(
            f"{root / TEST_SUITE} holds {len(files)} .py files: the local-text track validates on this Python's test "
            "suite, which this installation leaves out (Debian and Ubuntu ship it as libpython3.X-testsuite). "
            "Install it, run the harness with a Python built from source (pyenv, python.org), or use --track local")
    return root, files


def _path_hash(rel: str) -> int:
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little")


def in_spread_order(files: list[str]) -> list[str]:
    """A fixed pseudo-random order (a hash of the path), so that the byte caps take a spread of the
    library, not the first letters of the alphabet."""
    return sorted(files, key=lambda rel: (_path_hash("order:" + rel), rel))


def split_files() -> tuple[Path, list[str], list[str]]:
    """(stdlib folder, train files, val files): the library for training, its test suite for validation."""
    root, train = stdlib_files()
    _, val = test_suite_files()
    return root, in_spread_order(train), in_spread_order(val)


def _take(root: Path, files: list[str], max_bytes: int) -> list[str]:
    texts, total = [], 0
    for rel in files:
        if total >= max_bytes:
            break
        text = (root / rel).read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text.encode())
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenization: every string encodes, nothing is unknown)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_documents(tok, texts: list[str], eot_id: int | None) -> np.ndarray:
    """All documents' tokens in order, each preceded by the end-of-text token (GPT-2's convention)."""
    parts = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        if eot_id is not None:
            parts.append(np.array([eot_id], dtype=np.int64))
        parts.append(np.asarray(enc.ids, dtype=np.int64))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _cache_key(data: DataSpec, files: list[str], root: Path) -> str:
    listing = hashlib.sha256("\n".join(f"{f}:{(root / f).stat().st_size}" for f in files).encode()).hexdigest()
    blob = json.dumps({"v": FORMAT_VERSION, "vocab": data.vocab_size, "val_tokens": data.val_tokens,
                       "python": list(sys.version_info[:2]), "files": listing, **asdict(data.text)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock held for the block (released by the kernel if the process dies)."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_text(data: DataSpec, root: Path | None = None, progress: Callable[[str], None] | None = None) -> Path:
    """The directory holding train.bin, val.bin, tokenizer.json and meta.json; built once."""
    spec = data.text
    assert spec is not None
    lib, train_files, val_files = split_files()
    root = root or cache_root()
    target = root / f"text-{_cache_key(data, train_files + val_files, lib)}"
    if (target / "meta.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{target.name}.lock"):
        if (target / "meta.json").is_file():  # another run built it while this one waited
            return target
        if progress:
            progress(f"building the text corpus into {target} (once): BPE to {data.vocab_size} tokens on "
                     f"{spec.train_bytes / 1e6:.1f} MB of {lib}")
        tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        try:
            train_texts, val_texts = _take(lib, train_files, spec.train_bytes), _take(lib, val_files, spec.val_bytes)
            tok = train_tokenizer(train_texts, data.vocab_size)
            eot = tok.token_to_id(EOT)
            train, val = encode_documents(tok, train_texts, eot), encode_documents(tok, val_texts, eot)
            if val.size < data.val_tokens + 1:
                raise ValueError(f"[data.text]: the held-out files give {val.size} tokens, fewer than val_tokens + 1 "
                                 f"({data.val_tokens + 1}); raise val_bytes or lower val_tokens")
            write_shard(tmp / "train.bin", train, "raw_uint16")
            write_shard(tmp / "val.bin", val, "raw_uint16")
            tok.save(str(tmp / "tokenizer.json"))
            counts = np.bincount(val[: data.val_tokens + 1], minlength=data.vocab_size)
            p = counts[counts > 0] / counts.sum()
            meta = {"format_version": FORMAT_VERSION, "vocab_size": data.vocab_size, "text": asdict(spec),
                    "stdlib": str(lib), "python": ".".join(map(str, sys.version_info[:3])),
                    "train_files": len(train_texts), "val_files": len(val_texts),
                    "train_tokens": int(train.size), "val_tokens": int(val.size),
                    "unigram_entropy_nats": float(-(p * np.log(p)).sum())}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
