"""The GPU path end to end on one GPU box, in under 8 minutes (run it through scripts/gpu-check).

1. makes a small learnable token set in the event's format (raw uint16 shards, vocabulary
   32,000: an order-1 source with 4 successors per token, entropy ln 4 = 1.386 nats) in a
   temporary folder, laid out as the dev-gpu track expects (chunk_0001.bin ..., chunk_0049.bin);
2. writes a 124M-class copy of the baseline (12 layers x 768, seq_len 1024) twice: COMPILE off
   and COMPILE on;
3. runs each with `harness run --track dev-gpu` (every visible GPU, NCCL, bf16 autocast, pinned
   prefetch) on a short budget, then `harness eval` at 1 rank and at every rank;
4. prints one screen: status, steps, tokens/s, MFU, peak memory, start-up, val_loss, and whether
   the evaluations agree within 1e-5. Exit code 0 only when every check holds.

    scripts/gpu-check [--budget-s 60] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 32000
CONFIG = {"n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 1024, "micro_batch_size": 16,
          "grad_accum_steps": 1, "learning_rate": 1e-3, "weight_decay": 0.1}


def make_data(folder: Path, train_shards: int = 3, shard_tokens: int = 20_000_000, val_tokens: int = 2_000_000) -> None:
    rng = np.random.default_rng(0)
    table = rng.integers(0, VOCAB, size=(VOCAB, 4), dtype=np.int64)  # 4 successors per token

    def chain(n: int, chains: int = 512) -> np.ndarray:
        length = -(-n // chains)
        out = np.empty((chains, length), dtype=np.uint16)
        cur = rng.integers(0, VOCAB, size=chains)
        for t in range(length):
            out[:, t] = cur
            cur = table[cur, rng.integers(0, 4, size=chains)]
        return out.ravel()[:n]

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(1, train_shards + 1):
        chain(shard_tokens).astype("<u2").tofile(folder / f"chunk_{i:04d}.bin")
    chain(val_tokens).astype("<u2").tofile(folder / "chunk_0049.bin")


def make_submission(folder: Path, compiled: bool) -> Path:
    shutil.copytree(ROOT / "submissions" / "baseline", folder)
    text = (folder / "submission.py").read_text()
    start = text.index("CONFIG = {")
    end = text.index("}", start) + 1
    text = text[:start] + f"CONFIG = {json.dumps(CONFIG)}\nCOMPILE = {compiled}\n" + text[end:]
    (folder / "submission.py").write_text(text)
    (folder / "submission.toml").write_text(f'[team]\nname = "gpu-check-{"compile" if compiled else "eager"}"\n')
    return folder


def harness(*args: str, env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-s", type=float, default=60.0)
    ap.add_argument("--keep", default=None, help="keep the data and records in this folder")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device visible: this check needs a GPU box", file=sys.stderr)
        return 2
    work = Path(args.keep or tempfile.mkdtemp(prefix="harness-gpu-check-"))
    t_start = time.monotonic()
    print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; work in {work}", flush=True)
    make_data(work / "data")
    env = {**os.environ, "HARNESS_DATA_ROOT": str(work / "data"), "HARNESS_RUNS_DIR": str(work / "runs")}
    rows, ok = [], True
    for compiled in (False, True):
        sub = make_submission(work / f"sub-{'compile' if compiled else 'eager'}", compiled)
        proc = harness("run", str(sub), "--track", "dev-gpu", "--budget-s", str(args.budget_s), "--no-leaderboard",
                       env=env, timeout=420)
        run_json = sorted((work / "runs" / "dev-gpu").glob(f"{sub.name.replace('sub-', 'gpu-check-')}/*/run.json"))
        if not run_json:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        record = json.loads(run_json[-1].read_text())
        evals = {}
        for n in (1, record["nproc_per_node"]):
            e = harness("eval", str(run_json[-1].parent), "--nproc-per-node", str(n), "--json", env=env, timeout=300)
            evals[n] = json.loads(e.stdout)["val_loss"] if e.returncode == 0 else None
        agree = None not in evals.values() and max(evals.values()) - min(evals.values()) <= 1e-5
        ok &= record["status"] == "ok" and agree and record.get("mfu") is not None
        rows.append((f"COMPILE={compiled}", record, evals, agree))
    print(f"\n{'run':<14}{'status':<9}{'steps':>7}{'tok/s':>12}{'MFU':>8}{'peak GiB':>10}{'start-up s':>11}"
          f"{'val_loss':>10}  eval 1 rank / all ranks")
    for name, r, evals, agree in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        e = " / ".join("-" if v is None else f"{v:.6f}" for v in evals.values())
        print(f"{name:<14}{r['status']:<9}{r.get('steps') or 0:>7}{r.get('tokens_per_s') or 0:>12,.0f}{mfu:>8}"
              f"{r.get('peak_mem_gib') or 0:>10.2f}{r.get('startup_s') or 0:>11.1f}"
              f"{r.get('val_loss') or float('nan'):>10.4f}  {e} {'agree' if agree else 'DISAGREE'}")
        if r["status"] != "ok":
            print(f"  reason: {r['reason']}")
    print(f"\n{'all checks hold' if ok else 'SOME CHECKS FAILED'} in {time.monotonic() - t_start:.0f} s "
          f"(params {rows[0][1].get('params') or 0:,}, precision {rows[0][1].get('precision')})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
