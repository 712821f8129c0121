"""The GPU path end to end on one GPU box, in under 8 minutes, offline: run it through scripts/gpu-check.

    scripts/gpu-check [--keep DIR] [--json PATH]     # a GPU box: the dev-gpu track, every visible GPU
    scripts/gpu-check --cpu-smoke [--keep DIR]       # the same phases on 2 CPU ranks, tiny (the test suite's)

It runs in the interpreter it is started with (scripts/gpu-check: `python3` on PATH, or HARNESS_PYTHON),
the harness imported from this checkout (put first on PYTHONPATH for every `python -P -m harness` it
starts), and reaches no network: first it checks that the interpreter holds every package pyproject.toml
names, and says which is missing and how to carry it as a wheel (`missing_packages`).

It makes a small learnable token set in the event's format (raw uint16 shards, vocabulary 32,000, laid
out as dev-gpu expects), then runs, each with `harness run` as a team would, each evaluated on 262,144
held-out tokens (`--val-tokens`: 8 batches of 32 x 1,024), in this order:

  phase                                                          estimate    cap
  0  the data: 3 x 20M train tokens, 0.5M held out                  10 s       -
  1  124M-class baseline (12 x 768), COMPILE off, 30 s budget      100 s    180 s
  2  compiled code in forward (a small GPT whose MLP calls a        70 s    150 s
     torch.compile'd function), 20 steps
  3  an open-division script fed by a DataLoader with 2 worker      60 s    150 s
     processes, 20 steps
  4  the 124M-class baseline, COMPILE on, 75 s budget (Inductor   160 s    240 s
     compiles in the first step, on the clock)
  5  `harness eval` of phase 4's run at 1 rank (and at every        25 s     90 s
     rank, on a box with several GPUs: 25 s more)
     total on one GPU                                              425 s    460 s

Estimates, not measurements (no GPU has been lent to this project yet): a harness run costs about 50 s
beyond its training (the check before the run ~15 s, ranks up to the first step ~15 s, checkpoint and
communication probe ~5 s, evaluation ~15 s: scorer, model-process template, two model processes that
each start CUDA and load the weights). Each phase stops at its cap and the script at 460 s from its
start, its checks before the phases included (a phase cut short gets SIGTERM, so that the launcher
records it aborted, and SIGKILL 10 s later), so it ends within 8 minutes whatever happens; a phase cut
short, or never started, fails its column. The most uncertain phase (the compile time) runs last, so
that it cannot starve the others. Phase 5 runs on one run only: evaluation unwraps a compiled module
and runs it eagerly, so the eager run's would repeat the same code for two more evaluations.

Where the kernel has no Landlock (gVisor: kernel 4.4, no user namespaces either), every run goes on a
copy of the track with `sandbox = "off"` (gpu_check_parts.the_track), the table's first row says so
("sandbox: Landlock unavailable (...) — measured without it") and the sandbox's rows are unavailable, not
failed: every GPU path is still measured. Found as the harness finds it (gpu_check_parts.host_sandbox),
never chosen by a switch. Where $OUT is set (the lent machine's folder of files that come back), the
figures go there too: gpu-check.json (every cell, the table's text, timings), gpu-check.txt (the table),
gpu-check-records.tar.gz (each run's record and logs, without checkpoints).

What it checks, one table (gpu_check_rows.py): status (ok, not flagged), the 124M runs' MFU (the
record's, and at the median step), precision bf16, backend NCCL, COMPILE in the record, the sandbox
active in training and in evaluation (`record["sandbox"]`), evaluation's model processes forked from
the clean template, the causality check's worst deviation within its tolerance, the run's figure and
`harness eval` at 1 rank and at every rank within 1e-5, no scorer process ever mapping the CUDA driver
(sampled in /proc: gpu_check_parts.ScorerWatch), and, reported from inside evaluation's model processes
by the compiled-forward submission (gpu_check_subs/compiled_forward/probe.py): each sees its rank's GPU
alone, its logits buffer is page-locked with no CUDA error pending, Inductor's deterministic mode is on;
the open-division script's batches came from both DataLoader workers. Exit code 0 only when every check
holds; --cpu-smoke shows what cannot hold on a CPU (NCCL, bf16, MFU, the GPU probes) as skipped.

--cpu-smoke runs the same phases on a CPU track (dev-gpu's file on 2 CPU ranks with gloo:
gpu_check_parts.SMOKE_TRACK), vocabulary 256, 2-layer models, 3 steps each (counted, not timed), and
the compiled run as get_model's own torch.compile on dynamo's eager backend (Inductor's C++ compile
would take 30 s of 2 cores). 63-110 s on the 2-core development machine under a load of 2 to 5: the
harness's own ~10 s per run and 5-10 s per evaluation, not the smoke's work.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]  # the checkout's harness, whatever is installed

# Standard library only, these two (numpy is imported where the data is made): what is missing is said first.
from gpu_check_parts import GPU, SMOKE, ScorerWatch, Sizes, host_sandbox, log_lines, make_data, the_track  # noqa: E402
from gpu_check_parts import big_submission, compiled_forward_submission, open_submission  # noqa: E402
from gpu_check_rows import FAIL, UNAVAILABLE, Column, cells, host_rows, table  # noqa: E402

PHASES = ("eager", "compiled-fwd", "open", "compile")  # --only's names, in the order they run
TOTAL_S = 460.0  # the GPU box's whole run: 8 minutes, less a cut phase's grace and the table
MIN_PHASE_S = 20.0  # a phase is not started with less than this left
STOP_GRACE_S = 10.0  # a phase past its cap: SIGTERM (the launcher aborts its job and writes the record), then SIGKILL


class Clock:
    def __init__(self, total_s: float | None, t0: float):
        self.t0, self.total_s = t0, total_s

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def timeout(self, cap_s: float) -> float | None:
        """The phase's limit: its cap, or what is left of the total; None when too little is left."""
        left = cap_s if self.total_s is None else min(cap_s, self.total_s - self.elapsed())
        return left if left >= MIN_PHASE_S else None


# --------------------------------------------------------------------------- the interpreter

MODULES = {"py-landlock": "py_landlock"}  # a distribution whose module is not its name with "_" for "-"
# Dependencies no phase of the check imports: the local-text track's BPE and `harness data prepare` alone.
# One missing would stop the single device call before it measured anything.
NOT_ON_THE_GPU_PATH = {"tokenizers"}
WHEEL_PLATFORMS = " ".join(f"--platform {p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
                                                       "manylinux_2_17_x86_64", "manylinux2014_x86_64"))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def missing_packages() -> list[str]:
    """pyproject.toml's dependencies (those this platform needs) that this interpreter lacks, or holds below
    the version named (`>=` only: the one form the file uses), each as its requirement."""
    missing = []
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        spec, _, marker = (part.strip() for part in requirement.partition(";"))
        only_on = re.search(r"sys_platform\s*==\s*['\"](\w+)['\"]", marker)
        if only_on and only_on.group(1) != sys.platform:
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", spec).group(0)
        if name in NOT_ON_THE_GPU_PATH:
            continue
        if importlib.util.find_spec(MODULES.get(name, name.replace("-", "_"))) is None:
            missing.append(spec)
            continue
        least = re.search(r">=\s*([\w.]+)", spec)
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # importable without its metadata: taken as it is
            continue
        if least and _version(have) < _version(least.group(1)):
            missing.append(f"{spec} (this one has {have})")
    return missing


def carry_hint(missing: list[str]) -> str:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    names = " ".join(f"'{m.split(' (')[0]}'" for m in missing)
    if any(m.startswith("torch") for m in missing):  # gigabytes, built for a CUDA: not a wheel to carry
        return (f"{sys.executable} (Python {sys.version.split()[0]}) lacks {', '.join(missing)}: give "
                "scripts/gpu-check an interpreter that holds a CUDA build of torch (--python PY or HARNESS_PYTHON; "
                "on the lent H200 machine, its python3), and carry the rest as wheels (docs/performance.md, "
                "\"The GPU path\").")
    return (f"{sys.executable} (Python {sys.version.split()[0]}) lacks what the harness imports: "
            f"{', '.join(missing)}.\nCarry it as wheels: on a machine with the network, in the repository root,\n"
            f"  python3 -m pip download --no-deps --only-binary=:all: --python-version {py} --implementation cp "
            f"{WHEEL_PLATFORMS} -d .whl {names}\n"
            "(and each of their own requirements: `unzip -p .whl/NAME-*.whl '*/METADATA' | grep ^Requires-Dist`), "
            "then name .whl in the run's carry list: scripts/gpu-check installs .whl/*.whl with pip --no-index "
            "--target before it starts (docs/performance.md, \"The GPU path\").")


def child_env(**extra: str) -> dict:
    """This environment, the checkout first on PYTHONPATH: `python -P -m harness` imports this harness
    (harness/ranks/interpreter.py does the same for the harness's own children)."""
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *parts]), **extra}


# --------------------------------------------------------------------------- the phases


def harness(args: list[str], env: dict, timeout_s: float | None) -> tuple[int | None, str, str, dict]:
    """`harness ...` in a fresh process, its scorers watched; (exit code or None if cut, stdout, stderr, scorers)."""
    if timeout_s is None:
        return None, "", f"not started: less than {MIN_PHASE_S:.0f} s left of the {TOTAL_S:.0f} s", {}
    proc = subprocess.Popen([sys.executable, "-P", "-m", "harness", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    with ScorerWatch(proc.pid) as watch:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its ranks, scorers and model processes die with it (PDEATHSIG)
                out, err = proc.communicate()
            return None, out, err + f"\ncut at the phase's limit of {timeout_s:.0f} s", watch.scorers
    return proc.returncode, out, err, watch.scorers


def last_lines(text: str, n: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-n:])


def run(col: Column, submission: Path, extra: list[str], *, track: str, track_name: str, team: str, env: dict,
        runs: Path, sizes: Sizes, timeout_s: float | None) -> Column:
    t0, before = time.monotonic(), set((runs / track_name / team).glob("*/run.json"))
    code, _, err, seen = harness(["run", str(submission), "--track", track, "--no-leaderboard",
                                  "--val-tokens", str(sizes.val_tokens), *extra], env, timeout_s)
    col.seconds["run"] = round(time.monotonic() - t0, 1)
    print(f"[{col.name}] harness run {submission.name} {' '.join(extra)}: {col.seconds['run']:.0f} s", flush=True)
    col.scorers.update(seen)
    found = sorted(set((runs / track_name / team).glob("*/run.json")) - before)  # this run's, not a kept folder's
    if code is None or not found:
        col.error = last_lines(err) if code is None else f"exit code {code}: {last_lines(err)}"
    if not found:
        return col
    col.run_dir, col.record = found[-1].parent, json.loads(found[-1].read_text())
    if col.kind == "small":
        col.probes = log_lines(col.run_dir, "eval-*-rank*.log", "gpu-check-probe")
    if col.kind == "open":
        col.dataloader = next(iter(log_lines(col.run_dir, "rank0.log", "gpu-check-dataloader")), None)
    return col


def evaluate(col: Column, env: dict, clock: Clock, cap_s: float) -> None:
    """`harness eval` at 1 rank and at every rank of the run: the figure must not move (gpu_check_rows.agree)."""
    if col.record is None or col.record.get("status") != "ok":
        return
    for n in sorted({1, int(col.record["nproc_per_node"])}):
        t0 = time.monotonic()
        code, out, err, seen = harness(["eval", str(col.run_dir), "--nproc-per-node", str(n), "--json"], env,
                                       clock.timeout(cap_s))
        col.seconds[f"eval at {n}"] = round(time.monotonic() - t0, 1)
        print(f"[{col.name}] harness eval at {n} rank(s): {col.seconds[f'eval at {n}']:.0f} s", flush=True)
        col.scorers.update(seen)
        try:
            result = json.loads(out)
            ok = result.get("status") == "ok"
            col.evals[n] = result["val_loss"] if ok else f"{result.get('status')}: {result.get('reason')}"
        except (ValueError, KeyError, TypeError):
            col.evals[n] = f"exit code {code}: {last_lines(err)}"


def describe_machine(gpu: bool) -> str:
    import torch

    if not gpu:
        return f"CPU smoke: {os.cpu_count()} cores, torch {torch.__version__}"
    try:  # nvidia-smi, not torch: this process must hold no CUDA context (a GPU may allow only one)
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30).stdout.split("\n")
        names = [n.strip() for n in names if n.strip()]
    except (OSError, subprocess.SubprocessError):
        names = []
    name = f"{len(names)} x {names[0]}" if names else f"{torch.cuda.device_count()} GPU(s)"
    return (f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
            f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}")


FIGURES = ("status", "reason", "steps", "tokens_per_s", "mfu", "flops_per_token", "tokens_per_step", "median_step_s",
           "max_step_s", "first_step_s", "peak_flops_per_device", "world_size", "peak_mem_gib", "startup_s",
           "train_time_s", "val_loss", "loss_floor", "precision", "compiled", "device_name", "versions", "timings",
           "warnings")


def figures(record: dict | None) -> dict:
    """The record's figures the docs quote (the whole record is in gpu-check-records.tar.gz)."""
    r = record or {}
    return {k: r[k] for k in FIGURES if k in r} | {"eval": {k: v for k, v in (r.get("eval") or {}).items()
                                                            if not isinstance(v, (dict, list))}}


def records_archive(path: Path, columns: list[Column]) -> None:
    """Each run's record, metrics and logs (the last MiB of each log), without its checkpoint or submission:
    what explains a failed cell once the machine that ran it is gone."""
    with tarfile.open(path, "w:gz") as tar:
        for col in columns:
            if col.run_dir is None:
                continue
            logs = sorted((col.run_dir / "logs").glob("*.log"))
            for f in [col.run_dir / "run.json", col.run_dir / "metrics.csv", *logs]:
                if not f.is_file():
                    continue
                data = f.read_bytes()[-(1 << 20):]
                info = tarfile.TarInfo(f"{col.run_dir.parent.name}/{f.relative_to(col.run_dir)}")
                info.size, info.mtime = len(data), int(f.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))


def main() -> int:
    clock_started = time.monotonic()  # the 460 s count from here: the checks before the phases included
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu-smoke", action="store_true", help="the same phases on a CPU at tiny sizes, steps not time")
    ap.add_argument("--keep", default=None, help="keep the data, submissions and records in this folder")
    ap.add_argument("--json", default=None, help="also write every cell of the table to this file")
    ap.add_argument("--only", default=None, metavar="PHASE[,PHASE]",
                    help=f"run these phases alone ({', '.join(PHASES)}): a re-run of what failed, in the device time "
                         "left; the verdict names them, so that a part is never read as the whole")
    args = ap.parse_args()
    only = set(PHASES) if not args.only else {p.strip() for p in args.only.split(",") if p.strip()}
    if not only or only - set(PHASES):
        ap.error(f"--only takes phases among {', '.join(PHASES)}; got {args.only!r}")
    missing = missing_packages()
    if missing:
        print(carry_hint(missing), file=sys.stderr)
        return 2
    import torch

    sizes = SMOKE if args.cpu_smoke else GPU
    if sizes.gpu and not torch.cuda.is_available():  # the driver's device count: no context is made
        print("no CUDA device visible: this check needs a GPU box (or --cpu-smoke, its plumbing on a CPU)",
              file=sys.stderr)
        return 2
    clock = Clock(TOTAL_S if sizes.gpu else None, clock_started)  # the smoke: bounded by steps and caps, not a clock
    work = Path(args.keep or tempfile.mkdtemp(prefix="harness-gpu-check-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None  # the lent machine's files that come back
    import harness

    machine = describe_machine(sizes.gpu)
    print(f"{machine}; python {sys.executable} {sys.version.split()[0]}; harness from "
          f"{Path(harness.__file__).resolve().parent.parent}; work in {work}", flush=True)
    host = host_sandbox()
    print("\n".join(host_rows(host)), flush=True)
    if sizes.gpu:  # Triton builds each kernel's launcher with a C compiler against Python.h; the smoke never does
        lacking = [what for what, ok in (("a C compiler (cc, gcc)", shutil.which("cc") or shutil.which("gcc")),
                                         ("Python.h", (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()))
                   if not ok]
        if lacking:
            print(f"WARNING: this interpreter's machine lacks {' and '.join(lacking)}: Triton (torch.compile on a GPU) "
                  "cannot build its launchers, and the compiled phases will fail", flush=True)

    # 0. the data, and the track: dev-gpu itself, or its CPU copy, or a copy without the sandbox
    t0 = time.monotonic()
    make_data(work / "data", sizes)
    data_s = round(time.monotonic() - t0, 1)
    print(f"[data] {data_s:.0f} s", flush=True)
    track, track_name = the_track(work, sizes, host)
    runs = work / "runs"
    env = child_env(HARNESS_DATA_ROOT=str(work / "data"), HARNESS_RUNS_DIR=str(runs))
    caps = sizes.caps_s

    def bounded(budget_s: float) -> list[str]:
        return ["--budget-s", str(budget_s)] if sizes.gpu else ["--max-steps", str(sizes.big_steps)]

    def phase(col: Column, team: str, submission: Path, extra: list[str], cap: str) -> Column:
        return run(col, submission, extra, track=track, track_name=track_name, team=team, env=env, runs=runs,
                   sizes=sizes, timeout_s=clock.timeout(caps[cap]))

    for old in work.glob("sub-*"):  # --keep DIR used again: fresh copies, the earlier records stay
        shutil.rmtree(old)
    columns = []
    # 1. the 124M-class baseline, COMPILE off
    if "eager" in only:
        columns.append(phase(Column("124M eager", "big", compiled=False), "gpu-check-eager",
                             big_submission(work / "sub-eager", sizes, False, "gpu-check-eager"),
                             bounded(sizes.eager_budget_s), "run_eager"))
    # 2. compiled code in the model's forward, in training and in evaluation
    if "compiled-fwd" in only:
        columns.append(phase(Column("compiled fwd", "small"), "gpu-check-compiled-forward",
                             compiled_forward_submission(work / "sub-compiled-forward", sizes,
                                                         "gpu-check-compiled-forward"),
                             ["--max-steps", str(sizes.small_steps)], "run_small"))
    # 3. the open division: a team's script with DataLoader workers
    if "open" in only:
        columns.append(phase(Column("open+DataLoader", "open"), "gpu-check-open-dataloader",
                             open_submission(work / "sub-open-dataloader", sizes, "gpu-check-open-dataloader"),
                             ["--max-steps", str(sizes.small_steps)], "run_small"))
    # 4. the 124M-class baseline, COMPILE on (last: its compile time is the least known)
    if "compile" in only:
        compiled = phase(Column("124M compile", "big", compiled=True), "gpu-check-compile",
                         big_submission(work / "sub-compile", sizes, True, "gpu-check-compile"),
                         bounded(sizes.compile_budget_s), "run_compile")
        # 5. its evaluation again, at 1 rank and at every rank
        evaluate(compiled, env, clock, caps["eval"])
        columns.insert(1 if "eager" in only else 0, compiled)  # the table's order: the two 124M runs first

    grid = cells(columns, sizes, host)
    ok = not any(cell.state == FAIL for col in grid.values() for cell in col.values())
    without = any(cell.state == UNAVAILABLE for col in grid.values() for cell in col.values())
    text = table(columns, grid, host)
    part = "" if only == set(PHASES) else f" (these phases only: {', '.join(p for p in PHASES if p in only)})"
    verdict = (f"{'all checks hold' if ok else 'SOME CHECKS FAILED'}{part}"
               f"{' (the sandbox not measured: this host has no Landlock)' if without else ''} in "
               f"{clock.elapsed():.0f} s ({track_name}; records under {runs})")
    print("\n" + text + "\n\n" + verdict)
    result = {"mode": "gpu" if sizes.gpu else "cpu-smoke", "ok": ok, "elapsed_s": round(clock.elapsed(), 1),
              "machine": machine, "python": sys.executable, "python_version": sys.version.split()[0],
              "track": track_name, "host_sandbox": host.to_dict(), "sandbox_rows": host_rows(host),
              "data_s": data_s, "verdict": verdict, "table": text,
              "columns": {c.name: {"run_dir": str(c.run_dir) if c.run_dir else None, "evals": c.evals,
                                   "seconds": c.seconds, "record": figures(c.record),
                                   "cells": {label: vars(cell) for label, cell in grid[c.name].items()}}
                          for c in columns}}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "gpu-check.json").write_text(json.dumps(result, indent=1))
        (out_dir / "gpu-check.txt").write_text(text + "\n\n" + verdict + "\n")
        records_archive(out_dir / "gpu-check-records.tar.gz", columns)
        print(f"figures in {out_dir}: gpu-check.json, gpu-check.txt, gpu-check-records.tar.gz")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
