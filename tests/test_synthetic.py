import json

import numpy as np
import pytest

from harness.data.shards import inspect_shard
from harness.data.synthetic import MarkovSource, build_synthetic, loss_floor
from harness.tracks.spec import DataSpec, SyntheticSpec

SPEC = SyntheticSpec(seed=11, train_tokens=20000, branching=3)


@pytest.fixture(scope="module")
def source():
    return MarkovSource(SPEC, 32)


def test_stationary_distribution_is_a_fixed_point(source):
    assert source.pi.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(source._step(source.pi), source.pi, atol=1e-12)


@pytest.mark.slow
def test_entropy_rate_matches_the_sources_own_loss_on_a_long_sample(source):
    tokens = source.sample_chains(np.random.default_rng(0), 1, 400_001).ravel()
    losses = source.window_losses(tokens, seq_len=len(tokens) - 1)  # one window: every target has context
    # Sampling error of the mean: std of -log p over sqrt(n); allow 4 of them.
    assert losses[1:].mean() == pytest.approx(source.entropy_rate(), abs=4 * losses.std() / np.sqrt(len(losses)))


def test_floor_sits_between_entropy_rate_and_unigram_entropy(source):
    h, h1, uni = source.entropy_rate(), source.first_token_entropy(), source.unigram_entropy()
    assert h < h1 < uni <= np.log(32) + 1e-9


def test_corpus_is_built_once_deterministically(tmp_path):
    data = DataSpec(source="synthetic", vocab_size=32, val_tokens=2048, synthetic=SPEC)
    a = build_synthetic(data, tmp_path / "a")
    b = build_synthetic(data, tmp_path / "b")
    assert (a / "train.bin").read_bytes() == (b / "train.bin").read_bytes()
    assert (a / "val.bin").read_bytes() == (b / "val.bin").read_bytes()
    meta = json.loads((a / "meta.json").read_text())
    assert meta["entropy_rate_nats"] < meta["unigram_entropy_nats"]
    assert inspect_shard(a / "train.bin").num_tokens == 20000
    assert inspect_shard(a / "val.bin").num_tokens == 2049
    assert build_synthetic(data, tmp_path / "a") == a  # cached: not rebuilt
    assert not list((tmp_path / "a").glob(".building-*"))
    floor = loss_floor(data, a, 64)
    assert meta["entropy_rate_nats"] - 0.3 < floor < meta["unigram_entropy_nats"]


def test_the_floor_is_computed_once_per_evaluation_length_and_a_bad_file_is_not_trusted(tmp_path, monkeypatch):
    import harness.data.synthetic as synthetic

    data = DataSpec(source="synthetic", vocab_size=32, val_tokens=2048, synthetic=SPEC)
    corpus = build_synthetic(data, tmp_path)
    computed = {64: loss_floor(data, corpus, 64), 32: loss_floor(data, corpus, 32)}
    assert computed[64] != computed[32]  # each length its own file: the first targets of windows differ

    def no_source(*_a, **_k):
        raise AssertionError("the floor was computed again")

    with monkeypatch.context() as m:  # kept: a later run reads it back, exactly
        m.setattr(synthetic, "MarkovSource", no_source)
        assert loss_floor(data, corpus, 64) == computed[64] and loss_floor(data, corpus, 32) == computed[32]

    def kept(**fields):
        return json.dumps({"floor_version": synthetic.FLOOR_VERSION, "seq_len": 64, "loss_floor": computed[64],
                           "token_std": 1.0, **fields})

    # torn, not an object, too deep, another length's, another version's, not finite, not the corpus's
    for bad in ("{", "NaN", "[" * 100_000, kept(seq_len=32), kept(floor_version=synthetic.FLOOR_VERSION + 1),
                kept(loss_floor=float("nan")), kept(loss_floor=computed[64] - 1.0), kept(token_std=float("nan"))):
        (corpus / "floor-seq64.json").write_text(bad)
        assert loss_floor(data, corpus, 64) == computed[64]
    assert not list(corpus.glob(".floor-*")), "a temporary file was left behind"


def test_a_track_without_a_seed_draws_one_secretly_when_the_cache_is_built(tmp_path):
    """The validation tokens of the local tracks must not be a function of the public track file (a model
    rebuilt them in evaluation and predicted by prefix lookup). Left out of the track, the seed is drawn
    per cache: two caches of the same track hold different tokens, each keeps its own seed where only
    the launcher reads it, and the floor is the true source's on that cache's tokens."""
    import dataclasses

    spec = dataclasses.replace(SPEC, seed=None)
    data = DataSpec(source="synthetic", vocab_size=32, val_tokens=2048, synthetic=spec)
    a, b = build_synthetic(data, tmp_path / "a"), build_synthetic(data, tmp_path / "b")
    assert a.name == b.name  # one corpus folder per spec and cache
    assert (a / "val.bin").read_bytes() != (b / "val.bin").read_bytes()
    seeds = [json.loads((d / "meta.json").read_text())["synthetic"]["seed"] for d in (a, b)]
    assert all(isinstance(s, int) and s > 2**32 for s in seeds) and seeds[0] != seeds[1]
    assert oct(a.stat().st_mode & 0o777) == "0o700"  # the folder with the seed: its user only
    for corpus, seed in zip((a, b), seeds):
        own = MarkovSource(dataclasses.replace(SPEC, seed=seed), 32)
        val = np.asarray(inspect_shard(corpus / "val.bin").tokens()[:2049])
        assert loss_floor(data, corpus, 64) == pytest.approx(float(own.window_losses(val, 64).mean()))
