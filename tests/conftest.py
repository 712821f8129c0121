"""Shared test helpers: the real CLI in a subprocess, a per-session data cache, process checks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
TINY_TRACK = FIXTURES / "tracks" / "tiny.toml"
# The console script pip wrote beside this interpreter: what a user types, whatever their working folder holds.
HARNESS_SCRIPT = Path(sys.executable).with_name("harness")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One data cache for the whole session (each corpus is built once). Under pytest-xdist the workers
    share it: building a corpus is safe when several processes do it at once (test_text_data.py)."""
    if os.environ.get("HARNESS_TEST_CACHE_DIR"):
        return Path(os.environ["HARNESS_TEST_CACHE_DIR"])
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's base temp is a folder of the session's
        path = tmp_path_factory.getbasetemp().parent / "cache"
        path.mkdir(exist_ok=True)
        return path
    return tmp_path_factory.mktemp("cache")


@dataclass
class CliResult:
    code: int
    out: str
    err: str
    seconds: float

    @property
    def text(self) -> str:
        return self.out + self.err


@pytest.fixture
def cli(cache_dir, tmp_path):
    """Run `harness ...` exactly as a user does: a fresh process, the installed console script."""
    assert HARNESS_SCRIPT.is_file(), f"{HARNESS_SCRIPT} is missing: install the project (scripts/setup-venv)"

    def run(*args: str, timeout: float = 240, env: dict | None = None, runs_dir: Path | None = None,
            leaderboard: bool = False) -> CliResult:
        # `harness run` refreshes the track's leaderboard after the run (charts, intervals: seconds of
        # work). Tests that read the refreshed files ask for it; the others skip it with the user's flag.
        if args and args[0] == "run" and not leaderboard and "--no-leaderboard" not in args:
            args = (*args, "--no-leaderboard")
        full_env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir),
                    "HARNESS_RUNS_DIR": str(runs_dir or tmp_path / "runs"), **(env or {})}
        t0 = time.monotonic()
        proc = subprocess.run([str(HARNESS_SCRIPT), *args], capture_output=True, text=True,
                              timeout=timeout, env=full_env, cwd=tmp_path)
        return CliResult(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)

    return run


def run_dirs(runs: Path) -> list[Path]:
    return sorted(p.parent for p in runs.glob("*/*/*/run.json"))


def only_record(runs: Path) -> tuple[Path, dict]:
    dirs = run_dirs(runs)
    assert len(dirs) == 1, f"expected one run record under {runs}, found {dirs}"
    return dirs[0], json.loads((dirs[0] / "run.json").read_text())


def processes_of_run(run_id: str) -> list[psutil.Process]:
    """Live processes started for a run: they all carry HARNESS_RUN_ID. Evaluation's model-process
    template and its copies are not dumpable (their environment cannot be read): they name the run on
    their command line."""
    from harness.ranks.process import thread_group_lives

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                # A zombie main thread whose other threads run on is a live process (the harness's teardown counts it
                # so: harness/ranks/process.py); its environment is read through one of those threads.
                if not thread_group_lives(proc.pid) or _live_thread_environ(proc.pid).get("HARNESS_RUN_ID") != run_id:
                    continue
                found.append(proc)
                continue
            cmd = proc.cmdline()
            if "harness.ranks.models.model_template" in cmd and run_id in cmd:
                found.append(proc)
            elif proc.environ().get("HARNESS_RUN_ID") == run_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _live_thread_environ(pid: int) -> dict[str, str]:
    """A process's environment read through a thread other than its (exited) main thread; {} where none can be read."""
    try:
        tasks = [t for t in os.listdir(f"/proc/{pid}/task") if t != str(pid)]
    except OSError:
        return {}
    for tid in tasks:
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/environ").read_bytes()
        except OSError:
            continue
        pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
    return {}


def tiny_track_with(folder: Path, base: Path = TINY_TRACK, **values) -> Path:
    """tiny.toml (or another of tests/fixtures/tracks) with some keys set, each already in it: top-level
    keys by name, a table's as `eval__timeout_s`. The name stays, so records and the leaderboard land
    where the other tests look, and the run stays official."""
    import re

    text = base.read_text()
    assert not (folder / base.name).exists(), f"{folder / base.name} is written once per test"
    for key, value in values.items():
        table, _, name = key.rpartition("__")
        parts = re.split(r"(?m)^(?=\[)", text)  # the top level, then one part per [table]
        i = next((i for i, part in enumerate(parts) if (part.startswith(f"[{table}]\n") if table else i == 0)), None)
        assert i is not None, f"no table [{table}] in {base.name}"
        parts[i], n = re.subn(rf"^{name} = .*$", f"{name} = {json.dumps(value)}", parts[i], flags=re.M)
        assert n == 1, f"{key} is not a key of {base.name}"
        text = "".join(parts)
    path = folder / base.name
    path.write_text(text)
    return path


def one_rank(folder: Path, **values) -> Path:
    """tiny on one rank of one thread: for a test of what a single process does, where a second rank
    would only double the CPU the suite spends (each run's ranks import torch and train in parallel
    on a 2-core machine)."""
    return tiny_track_with(folder, nproc_per_node=1, cpu_threads_per_rank=1, **values)


QUICK_STEPS, QUICK_BUDGET_S = 20, 30.0


def quick_track(folder: Path, **values) -> Path:
    """tiny on one rank for QUICK_STEPS steps, not to a budget: for a submission whose test is about the
    check, evaluation or the record, where neither the number of ranks nor the budget is under test.
    The budget is QUICK_BUDGET_S, not tiny's 4 s: the steps bound the work, and the hard limit (budget +
    grace) must not end 20 honest steps on a machine at a load of 10 (CI saw 0.3 s a step, 17 of 20
    steps at tiny's 7 s limit). The hard limit still holds, and the run stays official."""
    return one_rank(folder, max_steps=QUICK_STEPS, **{"budget_s": QUICK_BUDGET_S, **values})


def run_as_slurm(script: Path, folder: Path, **slurm_env: str) -> list[str]:
    """Run an sbatch script as SLURM would on the first node of its allocation, from another folder: srun
    and scontrol stood in for, and a python that only writes down the command it was given. Returns the
    arguments node 0's launcher was started with. `slurm_env`: SLURM_* variables of the job."""
    import subprocess

    bin_dir, node = folder / "bin", folder / "node0"
    bin_dir.mkdir()
    node.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node0\n")
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [ "$1" != bash ]; do shift; done\n'
                                  f'export HARNESS_PYTHON={bin_dir}/python SLURM_NODEID=0\nexec "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {node}/argv\n')
    for tool in ("scontrol", "srun", "python"):
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node0",
           "SLURM_CPUS_ON_NODE": "8", **slurm_env}  # what sbatch sets in every batch job
    ran = subprocess.run(["bash", str(script)], cwd=node, env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    return (node / "argv").read_text().splitlines()


# Fixtures that train a run (once per module or session) or start a cluster: a test that reads one waits
# for it, so it belongs to the slow tier whatever its own body costs. The fast tier (`-m "not slow"`,
# docs/testing.md) is what a contributor runs between edits.
SLOW_FIXTURES = frozenset({"baseline_run", "tiny_run", "shard_runs", "noisy_runs", "honest_run", "cluster", "teams"})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    # The SLURM cluster's tests hold one worker longest (a whole rehearsed day: 300 s of one test). pytest-xdist
    # hands out files in this order (--dist loadfile): started first, it cannot be the last file left running
    # alone. A stable sort: nothing else moves. (Not shown to help yet: one suite run with it took 30.9 min
    # against 28.5 without, with other tests running beside it on the same 2 cores.)
    items.sort(key=lambda item: item.get_closest_marker("slurm") is None)


@pytest.fixture(autouse=True)
def _no_orphan_outlives_its_test():
    """A test that runs the launcher or a scorer in this process makes it a child subreaper (Linux), and a test that
    kills a launcher outright then hands this process the zombies of its job's ranks (their parents were outside the
    job's PID namespace): pytest never reaps them, so that namespace's PID 1 stayed in the kernel's
    zap_pid_ns_processes for the rest of the session, a sleeping 'python' that a later test's look for leftover
    processes found (CI, benchmarks/test_benchmarks.py::test_honest_under_load_script_runs). After each test they
    are reaped here, as a launcher reaps them, and this process is a subreaper no longer."""
    yield
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    from harness.launcher.control.process_tree import PR_SET_CHILD_SUBREAPER, reap_adopted_from_deeper_namespaces

    for _ in range(200):  # PID 1 ends once what it waits for is reaped, and is reaped in turn: a few passes
        if not reap_adopted_from_deeper_namespaces():
            break
        time.sleep(0.01)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)  # off
