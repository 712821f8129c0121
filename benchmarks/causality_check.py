"""How far honest models move under evaluation's causality check: the measurement behind its tolerance.

    python benchmarks/causality_check.py [--precisions float32,bfloat16] [--ranks 1,2,3]

For each honest model (the example submissions and the honest test models), a short run on the
test track `tiny` in each precision, then `harness eval` at 1, 2 and 3 scorer ranks (each with a
fresh secret seed: other batches checked, other cuts). Prints the largest change of a
log-probability before a cut that each evaluation saw (nats), against the tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HONEST = [ROOT / "submissions" / "baseline", ROOT / "submissions" / "minimal", ROOT / "tests" / "fixtures" / "ok_bigram",
          ROOT / "tests" / "fixtures" / "team_like", ROOT / "tests" / "fixtures" / "compiled_get_model"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="float32,bfloat16")
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="harness-causality-") as tmp:
        tmp = Path(tmp)
        for precision in args.precisions.split(","):
            track = tmp / f"tiny-{precision}.toml"
            text = (ROOT / "tests" / "fixtures" / "tracks" / "tiny.toml").read_text()
            track.write_text(text.replace('name = "tiny"', f'name = "tiny-{precision}"').replace(
                'dtype = "auto"', f'dtype = "{precision}"'))
            for sub in HONEST:
                env = {**os.environ, "HARNESS_RUNS_DIR": str(tmp / "runs")}
                run = subprocess.run([sys.executable, "-m", "harness", "run", str(sub), "--track", str(track),
                                      "--grace-s", "120", "--no-leaderboard"], env=env, capture_output=True, text=True)
                run_dir = max((tmp / "runs").glob(f"tiny-{precision}/*/*/run.json"), key=os.path.getmtime).parent
                record = json.loads((run_dir / "run.json").read_text())
                row = {"submission": sub.name, "precision": precision, "status": record["status"], "evals": {}}
                c = (record.get("eval") or {}).get("causality") or {}
                row["evals"]["run"] = c.get("worst_deviation")
                for n in (int(x) for x in args.ranks.split(",")):
                    e = subprocess.run([sys.executable, "-m", "harness", "eval", str(run_dir), "--nproc-per-node",
                                        str(n), "--json"], env=env, capture_output=True, text=True)
                    out = json.loads(e.stdout) if e.returncode in (0, 1) and e.stdout.strip() else {}
                    row["evals"][n] = (out.get("causality") or {}).get("worst_deviation")
                rows.append(row)
                print(json.dumps(row), flush=True)
    worst = max((v for r in rows for v in r["evals"].values() if v is not None), default=None)
    print(f"largest honest change before a cut, over {len(rows)} runs and their re-scores: {worst}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
