"""Evaluation's fixed cost against an earlier commit, paired on this machine (issue 31: evaluation on
`local` at or below the previous wave's).

    python benchmarks/eval_against.py b83273f --pairs 12

Each version (the commit, checked out in a git worktree of its own, and this checkout) trains its own
run of submissions/baseline on `local` for one step. Then `harness eval RUN --nproc-per-node 1 --json`
runs for the two alternately, the order swapped every pair, so that the machine's drift hits both. It
prints each `eval_time_s`, the medians, the mean paired difference (this checkout minus the commit)
with its 95% Student-t interval, and Wilcoxon's signed-rank p. Both versions run in this interpreter
(the same torch), each with its own checkout first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def paired(earlier: list[float], now: list[float]) -> dict:
    """The paired difference now - earlier: its mean, the 95% Student-t interval of the mean, Wilcoxon's p."""
    from scipy import stats

    if len(earlier) != len(now) or len(now) < 2:
        raise ValueError(f"paired samples of equal length, at least 2: got {len(earlier)} and {len(now)}")
    diffs = [b - a for a, b in zip(earlier, now)]
    mean = statistics.mean(diffs)
    half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    wilcoxon = stats.wilcoxon(diffs).pvalue if any(diffs) else 1.0
    return {"pairs": len(diffs), "earlier_median_s": statistics.median(earlier), "now_median_s": statistics.median(now),
            "mean_diff_s": mean, "ci95_s": [mean - half, mean + half], "wilcoxon_p": float(wilcoxon)}


# Written into the earlier checkout: this venv's editable install would otherwise serve any `harness.*` module that
# the earlier tree lacks from this checkout, unseen. Python runs it after the .pth files (the finder) are read.
ONLY_THIS_TREE = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, "__module__", type(f).__module__)).startswith("__editable__")]
sys.path_hooks[:] = [h for h in sys.path_hooks if not str(getattr(h, "__module__", "")).startswith("__editable__")]
"""


def _env(checkout: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["PYTHONPATH"] = str(checkout)
    return env


def _harness(checkout: Path, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    """`harness ARGS` by the code of `checkout`, in a session of its own: on a timeout or an interrupt its whole
    process group goes (launcher, ranks, scorer), so that nothing left running skews the next pair."""
    proc = subprocess.Popen([sys.executable, "-m", "harness", *args], cwd=checkout, env=_env(checkout),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"`harness {' '.join(args)}` in {checkout} exited {proc.returncode}:\n{err[-2000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def train_one_step(checkout: Path, runs: Path) -> Path:
    """A run of submissions/baseline on `local`, one step: what the evaluation then scores."""
    _harness(checkout, "run", "submissions/baseline", "--track", "local", "--max-steps", "1",
             "--runs-dir", str(runs), "--no-leaderboard")
    found = sorted(runs.glob("*/*/*/run.json"))
    if len(found) != 1:
        raise RuntimeError(f"expected one run record under {runs}, found {len(found)}")
    return found[0].parent


def eval_time_s(checkout: Path, run_dir: Path) -> tuple[float, float]:
    """(eval_time_s, val_loss) of one `harness eval` of `run_dir` by the harness of `checkout`."""
    out = json.loads(_harness(checkout, "eval", str(run_dir), "--nproc-per-node", "1", "--json").stdout)
    return float(out["eval_time_s"]), float(out["val_loss"])


def compare(rev: str, pairs: int, log=print) -> dict:
    if pairs < 2:
        raise ValueError(f"--pairs {pairs}: a paired interval needs at least 2")
    with tempfile.TemporaryDirectory(prefix="harness-eval-against-", ignore_cleanup_errors=True) as tmp:
        earlier = Path(tmp) / "checkout"
        added = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(earlier), rev],
                               capture_output=True, text=True)
        if added.returncode != 0:
            raise RuntimeError(f"git could not check out {rev}: {added.stderr.strip()}")
        try:
            (earlier / "sitecustomize.py").write_text(ONLY_THIS_TREE)
            sides = {"earlier": earlier, "now": ROOT}
            runs = {name: train_one_step(checkout, Path(tmp) / f"runs-{name}") for name, checkout in sides.items()}
            times: dict[str, list[float]] = {"earlier": [], "now": []}
            losses: dict[str, set] = {"earlier": set(), "now": set()}
            for i in range(pairs):
                for name in (("earlier", "now") if i % 2 == 0 else ("now", "earlier")):
                    seconds, loss = eval_time_s(sides[name], runs[name])
                    times[name].append(seconds)
                    losses[name].add(round(loss, 6))
                    log(f"pair {i + 1:>2} {name:<8} eval_time_s {seconds:.3f}  val_loss {loss:.6f}")
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(earlier)], capture_output=True)
            subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], capture_output=True)
    for name, seen in losses.items():  # the same checkpoint scored again must give the same figure
        if len(seen) != 1:
            raise RuntimeError(f"{name}: evaluation gave {len(seen)} different val_loss figures: {sorted(seen)}")
    result = paired(times["earlier"], times["now"])
    result.update(rev=rev, eval_time_s=times, val_losses={k: sorted(v) for k, v in losses.items()})
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the earlier commit (for issue 31: b83273f, the code before issues 30-32)")
    ap.add_argument("--pairs", type=int, default=12, help="at least 2; Wilcoxon's p cannot go below 0.0625 at 5 or fewer")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    result = compare(args.rev, args.pairs)  # which refuses fewer than 2 pairs before any work
    lo, hi = result["ci95_s"]
    print(f"{args.rev} median {result['earlier_median_s']:.3f} s, this checkout median {result['now_median_s']:.3f} s")
    print(f"this checkout - {args.rev}: mean {result['mean_diff_s']:+.3f} s, 95% CI [{lo:+.3f}, {hi:+.3f}], "
          f"Wilcoxon p {result['wilcoxon_p']:.3f}, {result['pairs']} pairs; val_loss {result['val_losses']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
