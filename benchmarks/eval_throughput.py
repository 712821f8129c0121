"""Evaluation throughput, through the public commands: a run is trained for one step, then re-scored.

    python benchmarks/eval_throughput.py --size local      # the baseline on the local track
    python benchmarks/eval_throughput.py --size 124m       # a 124M-parameter GPT at 1024 tokens, vocab 32,000

`local`: `harness run submissions/baseline --max-steps 1` on the local track, then
`harness eval RUN --nproc-per-node N` for N = 1, 2. `124m`: the baseline's model at 12 layers x
768 (124M parameters with the tied 32,000-token embedding) on a track made here (CPU, one rank,
raw uint16 shards of random tokens, vocabulary 32,000, 16 evaluation windows of 1,024 tokens in
batches of 4), trained for one step, then re-scored at 1 rank. Prints tokens scored per second of
evaluation (model load included, as the record's eval_time_s) and writes JSON with --json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TRACK_124M = """
name = "eval-124m"
description = "benchmark: evaluation of a 124M GPT at 1024 tokens on a CPU"
nnodes = 1
nproc_per_node = 1
backend = "gloo"
device = "cpu"
dtype = "float32"
budget_s = 3600.0
grace_s = 60.0
startup_timeout_s = 1200.0
startup_allowance_s = 1200.0
save_allowance_s = 600.0
scaling_probe_steps = 0
log_interval_s = 1.0
[data]
source = "shards"
root = "{root}"
train = ["chunk_0001.bin"]
val = ["chunk_0049.bin"]
format = "raw_uint16"
vocab_size = 32000
val_tokens = 16384
[eval]
seq_len = 1024
batch_size = 4
timeout_s = 3600.0
"""
CONFIG_124M = {"n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 1024, "micro_batch_size": 1,
               "grad_accum_steps": 1, "learning_rate": 1e-3}


def harness(*args: str, env: dict, timeout: float = 3600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "harness", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode not in (0, 1):
        raise RuntimeError(proc.stderr[-3000:])
    return proc


def setup_124m(work: Path) -> tuple[Path, Path]:
    data = work / "data"
    data.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rng.integers(0, 32000, 200_000, dtype=np.uint16).tofile(data / "chunk_0001.bin")
    rng.integers(0, 32000, 20_000, dtype=np.uint16).tofile(data / "chunk_0049.bin")
    track = work / "eval-124m.toml"
    track.write_text(TRACK_124M.format(root=data))
    sub = work / "gpt124m"
    shutil.copytree(ROOT / "submissions" / "baseline", sub)
    text = (sub / "submission.py").read_text()
    start = text.index("CONFIG = {")
    text = text[:start] + f"CONFIG = {json.dumps(CONFIG_124M)}\n" + text[text.index("}", start) + 1:]
    (sub / "submission.py").write_text(text)
    (sub / "submission.toml").write_text('[team]\nname = "gpt124m"\n')
    return track, sub


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", choices=["local", "124m"], default="local")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="harness-evalbench-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "HARNESS_RUNS_DIR": str(work / "runs")}
        if args.size == "local":
            track, sub, ranks = "local", ROOT / "submissions" / "baseline", (1, 2)
        else:
            track_path, sub = setup_124m(work)
            track, ranks = str(track_path), (1,)
        proc = harness("run", str(sub), "--track", track, "--max-steps", "1", "--no-leaderboard", env=env)
        run_dir = next((work / "runs").glob("*/*/*/run.json")).parent
        record = json.loads((run_dir / "run.json").read_text())
        if record["status"] != "ok":
            raise SystemExit(f"the run ended {record['status']}: {record['reason']}\n{proc.stderr[-2000:]}")
        results = {"size": args.size, "params": record["params"], "val_tokens": record["eval"]["val_tokens"],
                   "run_eval": {"world_size": record["eval"]["eval_world_size"],
                                "tokens_per_s": record["eval"]["val_tokens"] / record["eval"]["eval_time_s"]}}
        for n in ranks:
            out = json.loads(harness("eval", str(run_dir), "--nproc-per-node", str(n), "--json", env=env).stdout)
            results[f"eval_{n}_rank"] = {"tokens_per_s": out["val_tokens"] / out["eval_time_s"],
                                         "eval_time_s": out["eval_time_s"], "val_loss": out["val_loss"]}
        print(json.dumps(results, indent=2))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
