"""`harness check` at a real team's size: a 124M-class GPT at the Paris 2026 sizes, against `paris2026`.

    python benchmarks/check_size.py [--repeat 3] [--submission benchmarks/gpt_event_size] [--json out.json]

Runs the real command (`harness check SUBMISSION --track paris2026 --json`) in a fresh process, as a
team does on a laptop, and prints its wall time with the check process's own phases: the meta-device
pass (shapes, FLOPs), building the model, the forward and backward at batch 1, the causality probe at
the evaluation length. It measures; it does not pass or fail (the issue's target: under 60 s on a
2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def check_once(submission: Path, track: str) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "harness", "check", str(submission), "--track", track, "--json"],
                          capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall_s = time.monotonic() - t0
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"harness check printed no report (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return {"wall_s": wall_s, "accepted": report["accepted"], "params": report.get("params"),
            "timings_s": report.get("check_timings_s", {}), "problems": report.get("problems", [])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--submission", default=str(ROOT / "benchmarks" / "gpt_event_size"))
    ap.add_argument("--track", default="paris2026")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    runs = []
    for i in range(args.repeat):
        r = check_once(Path(args.submission), args.track)
        runs.append(r)
        phases = ", ".join(f"{k.removesuffix('_s')} {v:.1f} s" for k, v in r["timings_s"].items())
        print(f"check {i + 1}/{args.repeat}: {r['wall_s']:.1f} s wall, {'accepted' if r['accepted'] else 'REJECTED'}, "
              f"{r['params'] or 0:,} parameters ({phases})", flush=True)
        for p in r["problems"]:
            print(f"  problem: {p['file']}: {p['problem']}")
    walls = [r["wall_s"] for r in runs]
    spread = f" (min {min(walls):.1f}, max {max(walls):.1f}, n={len(walls)})" if len(walls) > 1 else ""
    print(f"harness check {Path(args.submission).name} --track {args.track}: median {statistics.median(walls):.1f} s"
          f"{spread} on {os.cpu_count()} CPU core(s)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
