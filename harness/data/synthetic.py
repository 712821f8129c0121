"""The `local` track's corpus: a random sparse Markov source of order 2 with an exactly known floor.

The source: for every token b a sparse distribution Q[b] over `branching` successors, and for
every token a a sparse distribution R[a]; the next token after (a, b) is drawn from

    P(c | a, b) = (1 - mix) * Q[b, c] + mix * R[a, c]

so it depends on the last two tokens (order 2). Everything about it is computed exactly:
the stationary distribution pi over pairs (power iteration on a lazy chain), the entropy rate
h = sum pi(a,b) H(P(.|a,b)), the unigram entropy, and the loss floor of the evaluation: the
cross-entropy the true source itself scores on exactly the val tokens, window by window (the
first target of a window is predicted from one token of context, the rest from two or more).
No model can beat that floor in expectation; records show each run's gap to it.

Built on first use into a cache directory (HARNESS_CACHE_DIR, default ~/.cache/speedrun-harness),
atomically (two runs that build it at once both end with the same complete files: the one that
renames its folder into place first). The source and both samples come from one seed. The track's
table leaves it out: it is drawn when the cache is built (`secrets`), and kept in the cache's
meta.json, which no sandboxed process can read; a seed in the track file would make the validation
tokens a public function of the file (a model could rebuild them in evaluation), so it is allowed
for research but every record of such a track says so. Each machine's cache therefore holds its own
draw of the same family of sources: figures on `local` compare through their gap to the floor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from harness.data.shards import write_shard
from harness.tracks.spec import DataSpec, SyntheticSpec

FORMAT_VERSION = 2  # 2: the seed is drawn at build time unless the track names one
FLOOR_VERSION = 2  # of loss_floor's kept files: raise it when the floor's arithmetic changes (2: with the spread)
TRAIN_CHAINS = 256  # independent stationary chains generated side by side (vectorised)


def cache_root() -> Path:
    return Path(os.environ.get("HARNESS_CACHE_DIR") or Path.home() / ".cache" / "speedrun-harness")


class MarkovSource:
    """The order-2 source: tables, exact stationary distribution and entropies."""

    def __init__(self, spec: SyntheticSpec, vocab_size: int):
        self.spec, self.V = spec, vocab_size
        rng = np.random.default_rng(spec.seed)
        self.q_idx, self.q_w = self._sparse_rows(rng, vocab_size, spec.branching, spec.concentration)
        self.r_idx, self.r_w = self._sparse_rows(rng, vocab_size, spec.branching, spec.concentration)
        self.Q, self.R = self._dense(self.q_idx, self.q_w), self._dense(self.r_idx, self.r_w)
        self.mix = spec.mix
        self.pi = self._stationary()
        self.marginal = self.pi.sum(axis=0)  # distribution of the later token of a pair

    @staticmethod
    def _sparse_rows(rng: np.random.Generator, V: int, k: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
        """Per row: the indices of its k successors and their probabilities."""
        k = min(k, V)
        idx = np.stack([rng.choice(V, size=k, replace=False) for _ in range(V)])
        weights = rng.dirichlet(np.full(k, alpha), size=V)
        return idx, weights

    @staticmethod
    def _dense(idx: np.ndarray, weights: np.ndarray) -> np.ndarray:
        table = np.zeros((idx.shape[0], idx.shape[0]))
        np.put_along_axis(table, idx, weights, axis=1)
        return table

    def conditional(self, a: np.ndarray | slice, b: np.ndarray | slice) -> np.ndarray:
        """P(c | a, b) for index arrays a and b of the same shape: [..., V]."""
        return (1.0 - self.mix) * self.Q[b] + self.mix * self.R[a]

    def _step(self, pi: np.ndarray) -> np.ndarray:
        # pi'[b, c] = sum_a pi[a, b] P(c | a, b) = (1-mix) m[b] Q[b, c] + mix (pi^T R)[b, c]
        m = pi.sum(axis=0)
        return (1.0 - self.mix) * m[:, None] * self.Q + self.mix * (pi.T @ self.R)

    def _stationary(self, tol: float = 1e-15, max_iter: int = 100_000) -> np.ndarray:
        pi = np.full((self.V, self.V), 1.0 / self.V**2)
        for _ in range(max_iter):
            nxt = 0.5 * (pi + self._step(pi))  # lazy chain: same fixed point, never periodic
            if np.abs(nxt - pi).sum() < tol:
                return nxt / nxt.sum()
            pi = nxt
        raise RuntimeError("stationary distribution did not converge; change [data.synthetic] seed or mix")

    def entropy_rate(self) -> float:
        """h = sum over pairs of pi(a,b) * H(P(. | a, b)), in nats; computed row block by row block."""
        total = 0.0
        for a in range(self.V):
            p = self.conditional(np.full(self.V, a), np.arange(self.V))  # [b, c]
            with np.errstate(divide="ignore", invalid="ignore"):
                h_rows = -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)
            total += float(self.pi[a] @ h_rows)
        return total

    def first_order_conditional(self) -> np.ndarray:
        """p(c | b) under stationarity: what the first target of a window can at best be predicted from."""
        m = self.marginal
        joint = self._step(self.pi)  # pi'[b, c] = P(X_t = b, X_t+1 = c), equal to pi at stationarity
        return np.divide(joint, m[:, None], out=np.full_like(joint, 1.0 / self.V), where=m[:, None] > 0)

    def unigram_entropy(self) -> float:
        m = self.marginal[self.marginal > 0]
        return float(-(m * np.log(m)).sum())

    def first_token_entropy(self) -> float:
        p1 = self.first_order_conditional()
        with np.errstate(divide="ignore", invalid="ignore"):
            h_rows = -np.where(p1 > 0, p1 * np.log(p1), 0.0).sum(axis=1)
        return float(self.marginal @ h_rows)

    def _start_pairs(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        flat = rng.choice(self.V * self.V, size=n, p=self.pi.ravel())
        return flat // self.V, flat % self.V

    def sample_chains(self, rng: np.random.Generator, n_chains: int, length: int) -> np.ndarray:
        """n_chains independent stationary chains of `length` tokens, vectorised over chains."""
        # Rows 0..V-1 are Q[b], rows V..2V-1 are R[a]: one gather picks the component per chain.
        idx = np.concatenate([self.q_idx, self.r_idx])
        cdf = np.cumsum(np.concatenate([self.q_w, self.r_w]), axis=1)
        k = idx.shape[1]
        out = np.empty((n_chains, length), dtype=np.int64)
        a, b = self._start_pairs(rng, n_chains)
        out[:, 0], out[:, 1] = a, b
        for t in range(2, length):
            row = np.where(rng.random(n_chains) < self.mix, self.V + a, b)
            j = np.minimum((cdf[row] < rng.random(n_chains)[:, None]).sum(axis=1), k - 1)
            c = idx[row, j]
            out[:, t] = c
            a, b = b, c
        return out

    def window_losses(self, tokens: np.ndarray, seq_len: int) -> np.ndarray:
        """-log p of each target under the true source, evaluation windows of seq_len targets."""
        x = np.asarray(tokens, dtype=np.int64)
        n = (len(x) - 1) // seq_len * seq_len
        targets = x[1 : n + 1]
        prev1 = x[:n]
        prev2 = np.concatenate([[0], x[: n - 1]])
        p = (1.0 - self.mix) * self.Q[prev1, targets] + self.mix * self.R[prev2, targets]
        first = np.arange(n) % seq_len == 0  # first target of a window: one token of context only
        p1 = self.first_order_conditional()
        p = np.where(first, p1[prev1, targets], p)
        return -np.log(p)


def _cache_key(data: DataSpec) -> str:
    """The corpus folder's name: the spec (a drawn seed is no part of it: one draw per spec and cache)."""
    spec = asdict(data.synthetic)
    if spec["seed"] is None:
        spec["seed"] = "drawn"
    blob = json.dumps({"v": FORMAT_VERSION, "vocab": data.vocab_size, "val_tokens": data.val_tokens, **spec},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def built_spec(corpus_dir: Path) -> SyntheticSpec:
    """The spec a corpus was built from, with its seed (drawn or given): what the floor is computed from."""
    return SyntheticSpec(**json.loads((corpus_dir / "meta.json").read_text())["synthetic"])


def build_synthetic(data: DataSpec, root: Path | None = None, progress=None) -> Path:
    """The directory holding train.bin, val.bin and meta.json; built once, atomically."""
    spec = data.synthetic
    assert spec is not None
    root = root or cache_root()
    target = root / f"synthetic-{_cache_key(data)}"
    if (target / "meta.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"building the synthetic corpus into {target} (once)")
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    if spec.seed is None:  # the secret: 63 random bits, never in the track file
        spec = dataclasses.replace(spec, seed=secrets.randbits(63))
    try:
        source = MarkovSource(spec, data.vocab_size)
        rng = np.random.default_rng([spec.seed, 1])
        per_chain = -(-spec.train_tokens // TRAIN_CHAINS)
        train = source.sample_chains(rng, TRAIN_CHAINS, per_chain).ravel()[: spec.train_tokens]
        # The val set is one stationary chain, so the floor formula holds at every window start.
        val = source.sample_chains(np.random.default_rng([spec.seed, 2]), 1, data.val_tokens + 1).ravel()
        write_shard(tmp / "train.bin", train, "llmc_uint16")
        write_shard(tmp / "val.bin", val, "llmc_uint16")
        meta = {
            "format_version": FORMAT_VERSION,
            "vocab_size": data.vocab_size,
            "synthetic": asdict(spec),
            "train_tokens": int(train.size),
            "val_tokens": int(val.size - 1),
            "entropy_rate_nats": source.entropy_rate(),
            "first_token_entropy_nats": source.first_token_entropy(),
            "unigram_entropy_nats": source.unigram_entropy(),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: its draw is the corpus (this one is discarded)
            if not (target / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def loss_floor(data: DataSpec, corpus_dir: Path, seq_len: int) -> float:
    """The true source's cross-entropy on exactly the evaluated val tokens (nats per token)."""
    return loss_floor_and_spread(data, corpus_dir, seq_len)[0]


def loss_floor_and_spread(data: DataSpec, corpus_dir: Path, seq_len: int) -> tuple[float, float]:
    """The floor (loss_floor) and the standard deviation of the true source's per-token losses on the same
    tokens: how far below the floor a model's figure can fall by chance is bounded with it.

    Kept beside the corpus once computed, one file per evaluation length: the stationary
    distribution behind it costs seconds of CPU (3 s at vocab 256 on a 2-core test machine), on
    every run otherwise. The corpus folder's key covers the source and the val tokens, so the
    evaluation length is all the file has to name. A file is taken only if it has this code's
    FLOOR_VERSION, its own length, and a value within sampling error of what the corpus's own
    entropies predict (meta.json); anything else (torn, another version's, planted by a process that
    reached the cache with the sandbox off) is computed again. A cache the user cannot write is only read."""
    path = corpus_dir / f"floor-seq{seq_len}.json"
    try:
        kept = json.loads(path.read_text())
        if (isinstance(kept, dict) and kept.get("floor_version") == FLOOR_VERSION and kept.get("seq_len") == seq_len
                and isinstance(kept.get("loss_floor"), float) and np.isfinite(kept["loss_floor"])
                and isinstance(kept.get("token_std"), float) and 0.0 <= kept["token_std"] < 100.0
                and _plausible(kept["loss_floor"], corpus_dir, seq_len, data.val_tokens)):
            return kept["loss_floor"], kept["token_std"]
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        pass
    floor, token_std = _compute_loss_floor(data, corpus_dir, seq_len)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".floor-", dir=corpus_dir)
        with os.fdopen(fd, "w") as fh:
            json.dump({"floor_version": FLOOR_VERSION, "seq_len": seq_len, "loss_floor": floor,
                       "token_std": token_std}, fh)
        os.replace(tmp, path)  # atomic: a run reading at the same moment sees the whole file or none
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return floor, token_std


def _plausible(floor: float, corpus_dir: Path, seq_len: int, val_tokens: int) -> bool:
    """Within sampling error of the expected floor: the first target of a window costs the first-token
    entropy, the others the entropy rate. The val tokens are one sample of the source (measured:
    0.012 nats off at 8,192 tokens, 0.004 at 131,072); the bound is many times that."""
    meta = json.loads((corpus_dir / "meta.json").read_text())
    expected = ((seq_len - 1) * meta["entropy_rate_nats"] + meta["first_token_entropy_nats"]) / seq_len
    return abs(floor - expected) <= 0.1 + 10.0 / np.sqrt(max(1, val_tokens))


def _compute_loss_floor(data: DataSpec, corpus_dir: Path, seq_len: int) -> tuple[float, float]:
    from harness.data.shards import inspect_shard

    source = MarkovSource(built_spec(corpus_dir), data.vocab_size)  # deterministic from the (kept) seed
    val = np.asarray(inspect_shard(corpus_dir / "val.bin").tokens()[: data.val_tokens + 1])
    losses = source.window_losses(val, seq_len)
    return float(losses.mean()), float(losses.std())
