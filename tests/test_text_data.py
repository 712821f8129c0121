"""Real text on a laptop: the `local-text` corpus (built once, under a lock, split by file) and
`harness data prepare` (shards like the event's, read back by the harness's own shard reader)."""

import json
import threading

import numpy as np
import pytest

from harness.data.shards import inspect_shard
from harness.data.text import EOT, build_text, split_files
from harness.tracks.spec import DataSpec, TextSpec, TrackError, load_track

SMALL = TextSpec(train_bytes=150_000, val_bytes=60_000)


def _data(**kw) -> DataSpec:
    return DataSpec(source="text", vocab_size=400, val_tokens=4096, text=TextSpec(**{**SMALL.__dict__, **kw}))


@pytest.mark.slow
def test_the_split_is_by_folder_and_stable_and_the_sandboxes_hide_the_validation_half():
    """Training on the standard library, validation on its test suite: the one folder every sandbox
    hides (a held-out file chosen by a public hash of its path was readable by any model)."""
    import os

    from harness.ranks.confine import sandbox

    root, train, val = split_files()
    assert not set(train) & set(val) and len(val) > 100
    assert all(v.startswith("test/") for v in val) and not any(t.split("/")[0] == "test" for t in train)
    assert split_files() == (root, train, val)
    policy = sandbox.build_policy(submission_dir="/tmp", private_dir="/tmp")
    assert os.path.realpath(root / "test") in policy.hidden


@pytest.mark.slow
def test_the_corpus_is_built_once_deterministically_and_concurrently(tmp_path):
    data = _data()
    built = []
    threads = [threading.Thread(target=lambda: built.append(build_text(data, tmp_path / "a"))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(built) == 2 and built[0] == built[1]
    assert len([p for p in (tmp_path / "a").iterdir() if p.is_dir()]) == 1  # one build, no leftovers
    b = build_text(data, tmp_path / "b")
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (built[0] / name).read_bytes() == (b / name).read_bytes(), name
    meta = json.loads((b / "meta.json").read_text())
    train, val = inspect_shard(b / "train.bin"), inspect_shard(b / "val.bin")
    assert train.format == "raw_uint16" and meta["train_tokens"] == train.num_tokens > 10_000
    assert val.num_tokens > data.val_tokens and int(np.asarray(train.tokens()).max()) < data.vocab_size

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(b / "tokenizer.json"))
    assert tok.get_vocab_size() == data.vocab_size and int(train.tokens()[0]) == tok.token_to_id(EOT)
    text = tok.decode(np.asarray(val.tokens()[1:400]).tolist())
    assert "import " in text or "def " in text or '"""' in text  # real Python source, decoded back


def test_local_text_is_a_builtin_track_and_its_table_is_checked(tmp_path):
    track = load_track("local-text")
    assert track.data.source == "text" and track.data.text.corpus == "python-stdlib"
    with pytest.raises(TypeError, match="val_every"):  # gone: the split is by folder
        TextSpec(val_every=1)
    with pytest.raises(TrackError, match=r"\[data.text\]"):
        DataSpec(source="text", vocab_size=400, val_tokens=64)


def _tokenizer_and_text_files(folder, docs, vocab_size):
    """A BPE trained on `docs` (saved as folder/tokenizer.json) and the docs as one .txt file each."""
    from harness.data.text import train_tokenizer

    tok = train_tokenizer(docs, vocab_size)
    tok.save(str(folder / "tokenizer.json"))
    paths = []
    for i, d in enumerate(docs):
        (folder / f"doc{i:02d}.txt").write_text(d)
        paths.append(str(folder / f"doc{i:02d}.txt"))
    return tok, paths


def test_data_prepare_round_trips_through_the_shard_reader(cli, tmp_path):
    docs = [f"Document {i}: the quick brown fox jumps over {i} lazy dogs.\n" * (1 + i % 3) for i in range(40)]
    tok, inputs = _tokenizer_and_text_files(tmp_path, docs, 300)
    for fmt in ("raw_uint16", "llmc_uint16"):
        out = tmp_path / fmt
        result = cli("data", "prepare", *inputs, "--tokenizer", str(tmp_path / "tokenizer.json"), "--out", str(out),
                     "--format", fmt, "--shard-tokens", "500")
        assert result.code == 0, result.text
        shards = sorted(out.glob("chunk_*.bin"))
        assert [s.name for s in shards][:2] == ["chunk_0001.bin", "chunk_0002.bin"] and "tokenizing" in result.err
        infos = [inspect_shard(s) for s in shards]
        assert {i.format for i in infos} == {fmt} and all(i.num_tokens == 500 for i in infos[:-1])
        tokens = np.concatenate([np.asarray(i.tokens()) for i in infos]).tolist()
        eot = tok.token_to_id(EOT)
        back = []
        for t in tokens:
            if t == eot:
                back.append([])
            else:
                back[-1].append(t)
        assert [tok.decode(ids) for ids in back] == docs
        if fmt == "raw_uint16":
            first = [s.read_bytes() for s in shards]
    again = cli("data", "prepare", *inputs, "--tokenizer", str(tmp_path / "tokenizer.json"), "--out",
                str(tmp_path / "again"), "--shard-tokens", "500")
    assert again.code == 0 and [s.read_bytes() for s in sorted((tmp_path / "again").glob("chunk_*.bin"))] == first


def test_data_prepare_names_the_bad_tokenizer(cli, tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    (tmp_path / "tok.json").write_text("{}")
    result = cli("data", "prepare", str(tmp_path / "a.txt"), "--tokenizer", str(tmp_path / "tok.json"),
                 "--out", str(tmp_path / "out"))
    assert result.code == 2 and "tok.json: not a `tokenizers` JSON file" in result.err


def test_parquet_rows_are_documents_like_text_files(cli, tmp_path):
    """A .parquet input (FineWeb's layout: one document per row of a `text` column, read in row order,
    empty rows skipped, several files in the order given) gives the same shards as the same documents as .txt files; a
    file without a `text` column is refused with its name and its columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [f"Row {i}: a parquet document about {i} foxes.\n" * (1 + i % 2) for i in range(12)]
    _, txt = _tokenizer_and_text_files(tmp_path, docs, 280)
    rows = docs[:3] + ["", None] + docs[3:7]  # an empty and a null row: no document, no end-of-text token
    pq.write_table(pa.table({"id": list(range(9)), "text": rows}), tmp_path / "part0.parquet", row_group_size=3)
    pq.write_table(pa.table({"text": docs[7:]}), tmp_path / "part1.parquet")
    shards = {}
    for name, inputs in (("txt", txt), ("parquet", [str(tmp_path / "part0.parquet"), str(tmp_path / "part1.parquet")])):
        result = cli("data", "prepare", *inputs, "--tokenizer", str(tmp_path / "tokenizer.json"), "--out",
                     str(tmp_path / name), "--shard-tokens", "200")
        assert result.code == 0, result.text
        shards[name] = [s.read_bytes() for s in sorted((tmp_path / name).glob("chunk_*.bin"))]
    assert shards["parquet"] == shards["txt"] and len(shards["txt"]) > 1
    pq.write_table(pa.table({"content": ["x"]}), tmp_path / "bad.parquet")
    bad = cli("data", "prepare", str(tmp_path / "bad.parquet"), "--tokenizer", str(tmp_path / "tokenizer.json"),
              "--out", str(tmp_path / "bad"))
    assert bad.code == 2 and "bad.parquet: no `text` column (columns: content)" in bad.err
