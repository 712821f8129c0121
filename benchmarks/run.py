"""Measures the harness itself and prints a table (the figures in docs/performance.md).

    python benchmarks/run.py                  # everything, ~4 minutes on 2 CPU cores
    python benchmarks/run.py --smoke          # tiny sizes: checks the benchmarks still run (CI)

Measured, in one invocation:
- overhead: steady-state step time of `harness run` against a bare torch DDP loop (same model,
  data, batch, world size, backend), interleaved A/B/A/B so drift hits both;
- start-up: seconds from launching `harness run` to its first training step, against bare torchrun;
- data loader: tokens/s per rank of the harness's stream against a raw memmap read;
- evaluation: `harness eval`'s wall time at 1 and 2 scorer ranks against one plain process scoring the same
  checkpoint on the same tokens (benchmarks/bare_eval.py);
- leaderboard: seconds to rebuild from 10,000 run records (table only, and with charts);
- with `--eval-against REV`: evaluation's wall time against an earlier commit's, paired on this machine
  (benchmarks/eval_against.py; issue 31 compares with b83273f, the code before issues 30-32).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def steady_step_s(times: list[float], steps: list[int]) -> float:
    """Seconds per step between the point 25% into the window and its end (warm-up left out)."""
    cut = times[-1] * 0.25
    i = next(k for k, t in enumerate(times) if t >= cut)
    if steps[-1] == steps[i]:  # too short a window to leave the warm-up out (smoke runs)
        return times[-1] / max(1, steps[-1])
    return (times[-1] - times[i]) / (steps[-1] - steps[i])


def run_harness(duration_s: float, runs: Path, env: dict, extra: tuple[str, ...] = ()) -> dict:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(ROOT / "submissions" / "baseline"),
                           "--budget-s", str(duration_s), "--runs-dir", str(runs), "--no-leaderboard", *extra],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:  # say why: the run's own words, not just an exit status
        sys.exit(f"harness run of the baseline failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    run_dir = max(runs.glob("local/baseline/*/run.json"), key=os.path.getmtime).parent
    record = json.loads((run_dir / "run.json").read_text())
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    times, steps = [float(r["train_time_s"]) for r in rows], [int(r["step"]) for r in rows]
    return {"step_s": steady_step_s(times, steps), "startup_s": record["timings"]["train_start_unix"] - t0,
            "run_dir": run_dir, "record": record}


def run_bare(duration_s: float, shard: str, env: dict, precision: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bare.json"
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               str(ROOT / "benchmarks" / "bare_ddp.py"), "--shard", shard, "--duration-s",
                               str(duration_s), "--submission", str(ROOT / "submissions" / "baseline"), "--out",
                               str(out), "--precision", precision],
                              env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, cwd=tmp)
        if proc.returncode != 0:  # say why, as run_harness does: torchrun's own words, not just an exit status
            sys.exit(f"the bare DDP loop failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        data = json.loads(out.read_text())
    times = data["step_end_s"]
    return {"step_s": steady_step_s(times, list(range(1, len(times) + 1))), "startup_s": data["first_step_unix"] - t0}


def bench_loader(shard_path: str, seconds: float) -> dict:
    import numpy as np

    from harness.data.shards import inspect_shard
    from harness.data.stream import TokenStream

    info = inspect_shard(shard_path)
    stream = TokenStream([info], seq_len=256, micro_batch_size=8, rank=0, world_size=2, seed=1, vocab_size=256)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        stream.batch_at(n)
        n += 1
    harness_tps = n * 8 * 256 / (time.perf_counter() - t0)
    tokens = info.tokens()
    rng = np.random.default_rng(0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        starts = rng.integers(0, info.num_tokens - 257, size=8)
        np.asarray(tokens[starts[:, None] + np.arange(257)], dtype=np.int64)
        n += 1
    raw_tps = n * 8 * 256 / (time.perf_counter() - t0)
    return {"harness_tokens_per_s": harness_tps, "raw_memmap_tokens_per_s": raw_tps}


def bench_eval(run_dir: Path, env: dict, track, val_shard: str) -> dict:
    """`harness eval` of a run (its wall time, the command's start to its end) at 1 and 2 scorer ranks, beside the
    plainest scoring of the same checkpoint on the same tokens in one fresh process (benchmarks/bare_eval.py): what
    the isolation costs (a sandboxed model process per scorer, the causality check's second one)."""
    out: dict = {}
    for n in (1, 2):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "harness", "eval", str(run_dir), "--nproc-per-node", str(n),
                               "--json"], check=True, env=env, capture_output=True, text=True)
        res = json.loads(proc.stdout)
        out[n] = {"tokens_per_s": res["val_tokens"] / res["eval_time_s"], "wall_s": time.perf_counter() - t0,
                  "val_loss": res["val_loss"], "tokens": res["val_tokens"]}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bare_eval.py"), str(run_dir), "--val-shard",
                           val_shard, "--val-tokens", str(out[1]["tokens"]), "--seq-len", str(track.eval.seq_len),
                           "--batch-size", str(track.eval.batch_size), "--threads", str(os.cpu_count() or 1),
                           "--precision", json.loads((run_dir / "run.json").read_text())["precision"]],
                          check=True, env=env, capture_output=True, text=True)
    out["bare"] = json.loads(proc.stdout)
    return out


# What a real record holds beyond the fields the factory sets (the sandbox's report, timings, notes, the track):
# 12-20 kB measured on runs of the `tiny` track, whose parsing is most of a cold rebuild.
RECORD_PADDING = {"timings": {f"phase_{k}_s": 1.0 + k / 7 for k in range(40)},
                  "sandbox": {f"door_{k}": {"active": True, "why": "x" * 120, "abi": 6} for k in range(40)},
                  "notes": ["a note the launcher wrote about the run, as long as real ones are " * 2] * 30,
                  "config": {f"knob_{k}": k for k in range(120)}}


def bench_leaderboard(n_records: int) -> dict:
    """Rebuilds of a board from n_records records of a real record's size: cold (no row index: every run.json
    parsed, as the first rebuild of a folder) and warm (the index holds every record but the newest, as after each
    run of an event), each table only and with the five charts."""
    import shutil

    from harness.results.views import rebuild
    from records_factory import make_run

    def add(root: Path, i: int, teams: int) -> Path:
        status = "ok" if i % 10 else "crashed"
        return make_run(root, f"team{i % teams:03d}", 2.0 + (i % teams) * 0.01 + (i % 7) * 0.001 if status == "ok" else None,
                        status=status, seed=i, run_id=f"20261129T100000-{i:06x}", reason="" if status == "ok" else "boom",
                        extra=RECORD_PADDING)

    with tempfile.TemporaryDirectory() as tmp:
        root, board, plots = Path(tmp) / "runs", Path(tmp) / "lb", Path(tmp) / "plots"
        teams = max(1, n_records // 100)
        for i in range(n_records - 2):
            add(root, i, teams)
        record_bytes = (next(root.glob("*/*/*/run.json"))).stat().st_size
        out: dict = {"records": n_records, "record_bytes": record_bytes}
        for charts, key in ((False, "table"), (True, "with_charts")):
            shutil.rmtree(board / ".rows", ignore_errors=True)
            t0 = time.perf_counter()
            rebuild(root, "local", board, plots, charts=charts)
            out[f"{key}_cold_s"] = time.perf_counter() - t0
        for charts, key in ((False, "table"), (True, "with_charts")):
            add(root, n_records - 2 + (key == "with_charts"), teams)  # one new run since the last rebuild
            t0 = time.perf_counter()
            rebuild(root, "local", board, plots, charts=charts)
            out[f"{key}_warm_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, to check that the benchmarks run")
    ap.add_argument("--pairs", type=int, default=2, help="A/B pairs for the overhead")
    ap.add_argument("--duration-s", type=float, default=20.0)
    ap.add_argument("--json", dest="json_out", default=None)
    ap.add_argument("--eval-against", default=None, metavar="REV",
                    help="also compare evaluation's wall time with this earlier commit's, in --eval-pairs pairs")
    ap.add_argument("--eval-pairs", type=int, default=12)
    args = ap.parse_args()
    if args.eval_against and args.eval_pairs < 2:
        ap.error("--eval-pairs: a paired interval needs at least 2")
    pairs, duration, n_records, loader_s = (1, 2.0, 200, 0.3) if args.smoke else (args.pairs, args.duration_s, 10_000, 3.0)

    from harness.data.prepare import prepare_data
    from harness.tracks.spec import load_track

    from harness.tracks.precision import resolve_precision

    track = load_track("local")
    data = prepare_data(track)
    precision, _ = resolve_precision(track.dtype, track.device)  # the bare loop computes as the harness does
    shard = data.train[0].path
    env = dict(os.environ)
    results: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
                     "precision": precision, "overhead": []}
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        for _ in range(pairs):  # A/B/A/B: machine drift affects both sides alike
            bare = run_bare(duration, shard, env, precision)
            # smoke: evaluation on 16,384 tokens, not the track's 131,072 (its figures mean nothing at this size)
            harness = run_harness(duration, runs, env, ("--val-tokens", "16384") if args.smoke else ())
            results["overhead"].append({"bare_step_s": bare["step_s"], "harness_step_s": harness["step_s"],
                                        "ratio": harness["step_s"] / bare["step_s"],
                                        "bare_startup_s": bare["startup_s"], "harness_startup_s": harness["startup_s"],
                                        "harness_timings": harness["record"]["timings"]})
        # The run's own data (an override such as the smoke's --val-tokens makes data of its own), the same file name
        val_shard = str(Path(harness["record"]["data"]["location"]) / Path(data.val[0].path).name)
        results["eval"] = bench_eval(harness["run_dir"], env, track, val_shard)
    if args.eval_against:
        from eval_against import compare

        results["eval_against"] = compare(args.eval_against, args.eval_pairs,
                                          log=lambda line: print(f"eval against {args.eval_against}: {line}",
                                                                 file=sys.stderr, flush=True))
    results["loader"] = bench_loader(shard, loader_s)
    results["leaderboard"] = bench_leaderboard(n_records)

    ov = results["overhead"]
    ratios = [o["ratio"] for o in ov]
    print(f"machine: {results['machine']}; torch {__import__('torch').__version__}; precision {precision}")
    print(f"{'measure':<44}{'harness':>14}{'reference':>14}{'ratio':>10}")
    print(f"{'step time, 2-rank gloo, baseline (ms)':<44}{1000 * statistics.mean(o['harness_step_s'] for o in ov):>14.1f}"
          f"{1000 * statistics.mean(o['bare_step_s'] for o in ov):>14.1f}{statistics.mean(ratios):>10.3f}")
    print(f"{'  per pair (A/B)':<44}{'':>14}{'':>14}{', '.join(f'{r:.3f}' for r in ratios):>10}")
    startup = statistics.mean(o['harness_startup_s'] for o in ov)
    bare_startup = statistics.mean(o['bare_startup_s'] for o in ov)
    print(f"{'start-up to first step (s)':<44}{startup:>14.2f}{bare_startup:>14.2f}{startup - bare_startup:>+10.2f}"
          "  (target: +1 s at most)")
    pairs_text = ", ".join("%.2f/%.2f" % (o["harness_startup_s"], o["bare_startup_s"]) for o in ov)
    print(f"{'  per pair (harness / bare)':<44}{pairs_text}")
    timings = [o["harness_timings"] for o in ov]
    print(f"{'  the check from its release (s)':<44}{statistics.mean(t.get('preflight_s', 0.0) for t in timings):>14.2f}")
    print(f"{'  launch to the first step (s)':<44}{statistics.mean(t.get('launch_to_train_s', 0.0) for t in timings):>14.2f}")
    ld = results["loader"]
    print(f"{'data loader, tokens/s per rank':<44}{ld['harness_tokens_per_s']:>14,.0f}{ld['raw_memmap_tokens_per_s']:>14,.0f}"
          f"{ld['harness_tokens_per_s'] / ld['raw_memmap_tokens_per_s']:>10.3f}")
    ev = results["eval"]
    print(f"{'evaluation wall s, %d tokens' % ev[1]['tokens']:<44}{ev[1]['wall_s']:>14.2f}"
          f"{ev['bare']['wall_s']:>14.2f}{ev[1]['wall_s'] / ev['bare']['wall_s']:>10.2f}  (reference: one plain process)")
    print(f"{'  at 2 scorer ranks':<44}{ev[2]['wall_s']:>14.2f}")
    print(f"{'  val_loss, harness / plain':<44}{ev[1]['val_loss']:>14.6f}{ev['bare']['val_loss']:>14.6f}")
    if "eval_against" in results:
        ea = results["eval_against"]
        lo, hi = ea["ci95_s"]
        print(f"{'  eval_time_s against %s, medians' % ea['rev']:<44}{ea['now_median_s']:>14.2f}{ea['earlier_median_s']:>14.2f}"
              f"{ea['mean_diff_s']:>+10.3f}  (paired mean, 95% CI [{lo:+.3f}, {hi:+.3f}], {ea['pairs']} pairs)")
    lb = results["leaderboard"]
    print(f"{'leaderboard, %d records of %.0f kB (s)' % (lb['records'], lb['record_bytes'] / 1e3):<44}"
          f"{'cold':>14}{'warm':>14}{'target':>10}")
    print(f"{'  table only':<44}{lb['table_cold_s']:>14.2f}{lb['table_warm_s']:>14.2f}")
    print(f"{'  with the five charts':<44}{lb['with_charts_cold_s']:>14.2f}{lb['with_charts_warm_s']:>14.2f}{'< 2':>10}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
