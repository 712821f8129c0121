"""pytest-benchmark measurements of the harness's in-process parts (not pass/fail tests).

    .venv/bin/python -m pytest benchmarks/ --benchmark-enable

The multi-process figures (overhead against a bare DDP loop, start-up, evaluation) come from
benchmarks/run.py, which also prints the table used in docs/performance.md.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    from harness.data.shards import inspect_shard, write_shard

    path = tmp_path_factory.mktemp("shard") / "train.bin"
    write_shard(path, np.random.default_rng(0).integers(0, 256, 8_000_000), "llmc_uint16")
    return inspect_shard(path)


def test_loader_batches(benchmark, shard):
    from harness.data.stream import TokenStream

    stream = TokenStream([shard], seq_len=256, micro_batch_size=8, rank=0, world_size=2, seed=1, vocab_size=256)
    steps = iter(range(10**9))
    benchmark(lambda: stream.batch_at(next(steps)))
    benchmark.extra_info["tokens_per_batch"] = 8 * 256


def test_raw_memmap_windows(benchmark, shard):
    tokens = shard.tokens()
    rng = np.random.default_rng(0)

    def read():
        starts = rng.integers(0, shard.num_tokens - 257, size=8)
        return np.asarray(tokens[starts[:, None] + np.arange(257)], dtype=np.int64)

    benchmark(read)
    benchmark.extra_info["tokens_per_batch"] = 8 * 256


def test_stop_rule_decision(benchmark):
    from harness.ranks.training.clock import StopRule

    rule = StopRule(600.0)
    for t in range(10):
        rule.synced(float(t))
    benchmark(rule.decide, 100.0)


@pytest.mark.parametrize("n_records", [1000, 10_000])
def test_leaderboard_table_rebuild(benchmark, tmp_path, n_records):
    from harness.results.views import rebuild
    from records_factory import make_run

    if benchmark.disabled:  # a smoke run (CI): the code path, not the scale
        n_records = min(n_records, 300)
    root = tmp_path / "runs"
    teams = max(1, n_records // 100)
    for i in range(n_records):
        make_run(root, f"team{i % teams:03d}", 2.0 + (i % teams) * 0.01 + (i % 7) * 0.001, seed=i,
                 run_id=f"20261129T100000-{i:06x}")
    benchmark.pedantic(rebuild, args=(root, "local", tmp_path / "lb", tmp_path / "plots"),
                       kwargs={"charts": False}, rounds=3, iterations=1)


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a smoke run, not a timed test: a loaded machine may take long
def test_benchmark_script_runs(tmp_path):
    """The table script end to end at tiny sizes (its figures are meaningless at this size)."""
    import json
    import os
    import subprocess

    out = tmp_path / "bench.json"
    env = {**os.environ, "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "run.py"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=1100)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    # What was measured is what the table prints (docs/performance.md copies the table).
    (o,) = results["overhead"]  # one A/B pair at smoke size
    assert 0 < o["bare_step_s"] < 60 and 0 < o["harness_step_s"] < 60
    assert o["ratio"] == o["harness_step_s"] / o["bare_step_s"]
    rows = {line[:44].strip(): line[44:].split() for line in proc.stdout.splitlines()}
    assert rows["step time, 2-rank gloo, baseline (ms)"] == [f"{1000 * o['harness_step_s']:.1f}",
                                                               f"{1000 * o['bare_step_s']:.1f}", f"{o['ratio']:.3f}"]
    # Command to first step: the check runs beside the ranks' start-up, inside the launch to the first step.
    t = o["harness_timings"]
    assert o["harness_startup_s"] > t["launch_to_train_s"] >= t["launch_to_go_s"] >= t["preflight_s"] > 0
    startup = rows["start-up to first step (s)"]
    assert startup[:2] == [f"{o['harness_startup_s']:.2f}", f"{o['bare_startup_s']:.2f}"]
    ev = results["eval"]
    assert rows["evaluation wall s, 16384 tokens"][:3] == [
        f"{ev['1']['wall_s']:.2f}", f"{ev['bare']['wall_s']:.2f}", f"{ev['1']['wall_s'] / ev['bare']['wall_s']:.2f}"]
    assert abs(ev["1"]["val_loss"] - ev["bare"]["val_loss"]) < 1e-3, "the reference scores what the harness scores"
    lb = results["leaderboard"]
    assert rows["table only"] == [f"{lb['table_cold_s']:.2f}", f"{lb['table_warm_s']:.2f}"]
    assert rows["with the five charts"][:2] == [f"{lb['with_charts_cold_s']:.2f}", f"{lb['with_charts_warm_s']:.2f}"]
    assert lb["records"] == 200 and lb["record_bytes"] > 10_000


@pytest.mark.slow
def test_gpu_check_says_plainly_when_there_is_no_gpu(tmp_path):
    """scripts/gpu-check is for a GPU box; on a CPU machine it refuses with a clear message (exit 2)."""
    import subprocess

    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: scripts/gpu-check runs the real check here")
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "gpu_check.py")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "needs a GPU" in proc.stderr and "--cpu-smoke" in proc.stderr


GPU_ONLY_ROWS = {"MFU", "MFU at the median step", "precision bf16", "backend NCCL", "model proc: 1 GPU",
                 "logits buffer pinned"}


# A network namespace whose loopback is up (the ranks meet on 127.0.0.1) and nothing else: no route, no DNS.
LOOPBACK_UP = ("import fcntl, os, socket, struct, sys; "
               "fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sh22x', b'lo', 0x1 | 0x8 | 0x40)); "  # SIOCSIFFLAGS
               "os.execvp(sys.argv[1], sys.argv[1:])")
NETWORK_WORDS = ("Temporary failure in name resolution", "Network is unreachable", "NewConnectionError",
                 "Could not fetch URL", "Retrying (Retry", "download.pytorch.org", "pypi.org")


def offline_prefix() -> list[str]:
    """`unshare -n` (root), or `unshare -rn` (a user namespace where root is not had), with the loopback up."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): the offline run needs a network namespace")
    for unshare in (["unshare", "-n"], ["unshare", "-rn"]):
        if subprocess.run([*unshare, "true"], capture_output=True).returncode == 0:
            return [*unshare, sys.executable, "-c", LOOPBACK_UP]
    pytest.skip("this user may not make a network namespace (unshare -n, unshare -rn)")


def checkout_copy(dest: Path) -> Path:
    """What scripts/gpu-check needs of the checkout, copied (compiled modules too: their sources keep their
    times), without .venv: an entry that made a venv of its own, or ran scripts/setup-venv, leaves one in it."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    for name in ("harness", "benchmarks", "submissions", "scripts"):
        shutil.copytree(root / name, dest / name, ignore=shutil.ignore_patterns(".pytest_cache"))
    shutil.copy2(root / "pyproject.toml", dest / "pyproject.toml")
    return dest


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one empty module: the --wheels path (pip --no-index --target) without the network."""
    import zipfile

    folder.mkdir()
    info = "gpu_check_carried-0.1.dist-info"
    files = {"gpu_check_carried.py": "",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpu-check-carried\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    path = folder / "gpu_check_carried-0.1-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


@pytest.mark.slow
@pytest.mark.timeout(900)  # a smoke run, not a timed test: 4 runs of 3 steps, 2 evaluations (63-110 s on 2 cores)
def test_gpu_check_cpu_smoke_runs_offline_in_the_given_python_every_phase_skipping_only_what_needs_a_gpu(tmp_path):
    """scripts/gpu-check --cpu-smoke, the real entry, in a network namespace with nothing but a loopback, from a
    copy of the checkout without .venv, this interpreter given (HARNESS_PYTHON) and no venv's folder on PATH, a
    wheel folder given: it installs the wheel with --no-index, and every run ends ok, every check that can hold
    on a CPU holds (the sandbox in training and evaluation, forked model processes, causality, 1 rank and every
    rank agreeing, scorers without CUDA, Inductor's deterministic mode, both DataLoader workers), those that
    cannot are skipped, not failed; the table on screen shows the cells the JSON holds, and $OUT gets the
    figures. An entry that reached for the network or a venv fails here."""
    import json
    import os
    import subprocess

    checkout = checkout_copy(tmp_path / "checkout")
    tiny_wheel(tmp_path / "wheels")
    out, out_dir = tmp_path / "gpu_check.json", tmp_path / "OUT"
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and not (Path(p) / "activate").exists()]
    env = {**{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")},
           "PATH": os.pathsep.join(path), "HARNESS_PYTHON": sys.executable, "OUT": str(out_dir)}
    proc = subprocess.run([*offline_prefix(), "bash", str(checkout / "scripts" / "gpu-check"), "--cpu-smoke",
                           "--wheels", str(tmp_path / "wheels"), "--keep", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, timeout=880, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert not (checkout / ".venv").exists() and not any(w in proc.stdout + proc.stderr for w in NETWORK_WORDS)
    assert "wheels: gpu_check_carried-0.1-py3-none-any.whl installed into " in proc.stdout
    site = proc.stdout.split(" installed into ", 1)[1].split()[0]
    assert site.endswith("site-packages") and not Path(site).exists()  # a temporary folder, gone after the run
    result = json.loads(out.read_text())
    assert result["python"] == sys.executable and f"harness from {checkout.resolve()};" in proc.stdout
    columns = result["columns"]
    assert result["mode"] == "cpu-smoke" and result["ok"]
    assert list(columns) == ["124M eager", "124M compile", "compiled fwd", "open+DataLoader"]
    state = {(name, label): cell["state"] for name, col in columns.items() for label, cell in col["cells"].items()}
    assert {label for (_, label), s in state.items() if s == "skip"} == GPU_ONLY_ROWS
    assert "fail" not in state.values()
    for name in columns:
        for label in ("status", "sandbox: training", "sandbox: evaluation", "model procs forked", "causality deviation",
                      "scorers without CUDA"):
            assert state[(name, label)] == "ok", (name, label)
    assert state[("124M eager", "compiled")] == state[("124M compile", "compiled")] == "ok"
    assert state[("124M compile", "eval run/1/all ranks")] == "ok"
    assert set(columns["124M compile"]["evals"]) == {"1", "2"}  # 1 rank and every rank
    assert state[("compiled fwd", "Inductor deterministic")] == state[("open+DataLoader", "DataLoader workers")] == "ok"
    rows = {line[:24].strip(): line[24:].split() for line in proc.stdout.splitlines() if line[:24].strip()}
    assert rows["status"] == ["ok"] * 4 and rows["DataLoader workers"] == ["-", "-", "-", "2", "of", "2"]
    assert "all checks hold" in proc.stdout
    assert sorted(p.name for p in out_dir.iterdir()) == ["gpu-check-records.tar.gz", "gpu-check.json", "gpu-check.txt"]
    assert json.loads((out_dir / "gpu-check.json").read_text())["table"] in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_check_only_runs_the_phases_named_and_its_verdict_says_so(tmp_path):
    """--only re-runs what failed in the device time left: the phases named run, no other, the table has their
    columns alone, and the verdict names them (a part is never read as the whole); a name it does not know stops
    it before any work, naming the phases it knows."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    gpu_check = [sys.executable, str(Path(__file__).parent / "gpu_check.py"), "--cpu-smoke"]
    bad = subprocess.run([*gpu_check, "--only", "eager,warp"], capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "eager, compiled-fwd, open, compile" in bad.stderr and "[data]" not in bad.stdout
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([*gpu_check, "--only", "compiled-fwd", "--keep", str(tmp_path / "work"), "--json", str(out)],
                          capture_output=True, text=True, timeout=580, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert list(result["columns"]) == ["compiled fwd"]
    assert sorted(p.name for p in (tmp_path / "work" / "runs").rglob("run.json")) == ["run.json"]
    assert "all checks hold (these phases only: compiled-fwd)" in proc.stdout


def test_gpu_check_says_which_package_the_interpreter_lacks_and_how_to_carry_it():
    """An interpreter without the harness's packages is told so before any work, with the wheel recipe; torch is
    not a wheel to carry: it names the interpreter to give instead."""
    import gpu_check

    assert gpu_check.missing_packages() == []  # this interpreter runs the harness
    hint = gpu_check.carry_hint(["py-landlock>=0.1.1"])
    assert "lacks what the harness imports: py-landlock>=0.1.1" in hint
    assert "pip download --no-deps --only-binary=:all: --python-version" in hint
    assert "-d .whl 'py-landlock>=0.1.1'" in hint
    assert "--python PY or HARNESS_PYTHON" in gpu_check.carry_hint(["torch>=2.4", "py-landlock>=0.1.1"])


def test_gpu_check_on_a_host_without_landlock_measures_without_the_sandbox_and_says_so(tmp_path, monkeypatch):
    """A kernel without Landlock (gVisor: the call does not exist), found as harness/ranks/confine/sandbox.py finds it:
    the runs go on a copy of the track with the sandbox off, named so; the table's first row says Landlock is
    unavailable and that every figure was measured without it; the sandbox's rows are unavailable, not failed,
    so the other checks decide the exit code. With Landlock there, the same records fail those rows."""
    import py_landlock
    from gpu_check_parts import GPU, SMOKE, HostSandbox, landlock_missing, the_track
    from gpu_check_rows import FAIL, UNAVAILABLE, Column, cells, table

    from harness.tracks.spec import load_track

    def no_such_call():
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(py_landlock, "get_abi_version", no_such_call)
    why, abi = landlock_missing()
    assert abi is None and why.startswith("not available on this kernel") and "Function not implemented" in why
    monkeypatch.setitem(sys.modules, "py_landlock", None)  # the package itself missing: said so, not the kernel
    assert landlock_missing() == ("the py-landlock package is not installed", None)

    host = HostSandbox(landlock=why, userns="no namespace of the job's own: unshare failed: Operation not permitted")
    assert the_track(tmp_path, GPU, HostSandbox(landlock_abi=7)) == ("dev-gpu", "dev-gpu")  # the track itself
    for sizes, name, device in ((GPU, "dev-gpu-no-sandbox", "cuda"), (SMOKE, "gpu-check-cpu-no-sandbox", "cpu")):
        path, got = the_track(tmp_path, sizes, host)
        track = load_track(path)
        assert got == track.name == name and track.sandbox == "off" and track.device == device

    off = {"active": False, "why": "the track turns the sandbox off"}
    records = [Column("124M compile", "big", compiled=True, evals={1: 2.1}, scorers={11: False},
                      record=gpu_record(sandbox={"training": off, "evaluation": {"model": off, "check": off}}))]
    grid = cells(records, GPU, host)
    states = {label: cell.state for label, cell in grid["124M compile"].items()}
    assert states["sandbox: training"] == states["sandbox: evaluation"] == UNAVAILABLE and FAIL not in states.values()
    text = table(records, grid, host)
    first, second = text.splitlines()[:2]
    assert first == (f"sandbox: Landlock unavailable ({why}) — measured without it "
                     "(the track's copy has sandbox = \"off\")")
    assert second.startswith("sandbox: user namespaces unavailable too (no namespace of the job's own")
    assert "off   sandbox: training: Landlock unavailable on this host" in text
    assert "note  eval run/1/all ranks: this machine has 1 GPU: evaluated at 1 process only" in text

    with_landlock = cells(records, GPU, HostSandbox(landlock_abi=7))["124M compile"]
    assert with_landlock["sandbox: training"].state == with_landlock["sandbox: evaluation"].state == FAIL
    assert table(records, cells(records, GPU, HostSandbox(landlock_abi=7)), HostSandbox(landlock_abi=7)).startswith(
        "sandbox: Landlock ABI 7 and user namespaces available")


def gpu_record(**changes) -> dict:
    """A dev-gpu run's record as gpu_check_rows reads it (what a GPU would write)."""
    active = {"active": True, "why": "Landlock ABI 6"}
    record = {"status": "ok", "reason": "", "flagged": False, "steps": 900, "tokens_per_s": 4.1e5, "mfu": 0.41,
              "flops_per_token": 7.7e8, "tokens_per_step": 16384, "median_step_s": 0.031,
              "peak_flops_per_device": 989e12, "world_size": 1, "nproc_per_node": 1, "peak_mem_gib": 30.1,
              "startup_s": 2.0, "val_loss": 2.1,
              "precision": "bfloat16", "precision_reason": "track", "track": {"backend": "nccl"},
              "versions": {"nccl": "2.27.3"}, "compiled": True, "device_name": "NVIDIA H200",
              "sandbox": {"training": active, "evaluation": {"model": active, "check": active}},
              "eval": {"eval_tokens_per_s": 2e6, "eval_world_size": 1, "causality": {"worst_deviation": 0.0,
                       "tolerance": 1e-3}, "model_processes": "forked from a clean template"}}
    return {**record, **changes}


def test_gpu_check_rows_hold_on_a_good_gpu_record_and_name_each_failure():
    """The table's GPU-only checks (the smoke skips them), on records as a GPU box writes them: a good
    one holds; a run with the sandbox off, no MFU, a model process that saw two GPUs or a buffer left
    pageable fails that cell, and the line under the table says why."""
    from gpu_check_parts import GPU
    from gpu_check_rows import FAIL, OK, Column, cells, table

    probe = {"cuda_visible_devices": "0", "cuda_devices": 1, "pinned": True, "pending_error": 0,
             "inductor_deterministic_env": "1", "inductor_config_deterministic": True}
    from gpu_check_parts import DRIVER_ONLY

    good = [Column("124M compile", "big", compiled=True, record=gpu_record(), evals={1: 2.1 + 1e-7},
                   scorers={11: False, 13: DRIVER_ONLY}),
            Column("compiled fwd", "small", record=gpu_record(compiled=False), probes=[probe, probe],
                   scorers={12: False})]
    grid = cells(good, GPU)
    assert {cell.state for col in grid.values() for cell in col.values()} <= {OK, "info", "na"}
    assert grid["124M compile"]["MFU"].text == "41.0%" and grid["124M compile"]["backend NCCL"].text == "nccl 2.27.3"
    # the driver's library mapped without a GPU opened is said, not failed (a library's link: no CUDA started)
    assert grid["124M compile"]["scorers without CUDA"].text == "2 of 2"
    assert "[13]: libcuda mapped, no GPU opened" in grid["124M compile"]["scorers without CUDA"].note

    off = {"active": False, "why": "Landlock is not available on this kernel"}
    bad = [Column("124M compile", "big", compiled=True, record=gpu_record(mfu=None, sandbox={"training": off,
                  "evaluation": {"model": {"active": True}, "check": off}}), evals={1: 2.2}, scorers={11: True}),
           Column("compiled fwd", "small", record=gpu_record(),
                  probes=[{**probe, "cuda_devices": 2, "cuda_visible_devices": "0,1"},
                          {**probe, "pinned": False, "pending_error": 712}])]
    grid = cells(bad, GPU)
    failed = {(name, label) for name, col in grid.items() for label, cell in col.items() if cell.state == FAIL}
    assert failed == {("124M compile", label) for label in ("MFU", "sandbox: training", "sandbox: evaluation",
                                                             "eval run/1/all ranks", "scorers without CUDA")} | {
        ("compiled fwd", label) for label in ("model proc: 1 GPU", "logits buffer pinned", "scorers without CUDA")}
    text = table(bad, grid)
    assert ("FAIL  124M compile / sandbox: training: the training sandbox was not active: Landlock is not available"
            in text)
    assert "check: Landlock is not available on this kernel" in text
    assert "FAIL  compiled fwd / scorers without CUDA: no scorer" in text


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_check_size_script_runs(tmp_path):
    """benchmarks/check_size.py end to end on a small submission (the 124M figure is in docs/performance.md)."""
    import json
    import subprocess

    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "check_size.py"), "--submission",
                           str(Path(__file__).parent.parent / "submissions" / "minimal"), "--track", "local",
                           "--json", str(out)], capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())
    assert runs[0]["accepted"] and runs[0]["timings_s"]["step_s"] > 0 and "median" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_honest_under_load_script_runs(tmp_path):
    """benchmarks/honest_under_load.py end to end: one quick run beside one CPU hog (the 20-run figure for
    `local` is in docs/performance.md); the hog is gone afterwards."""
    import json
    import subprocess

    import psutil
    from conftest import quick_track

    out = tmp_path / "load.json"
    env = {**__import__("os").environ, "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "honest_under_load.py"), "--runs", "1",
                           "--hogs", "1", "--track", str(quick_track(tmp_path)), "--submissions",
                           "tests/fixtures/ok_bigram", "--out", str(out)], capture_output=True, text=True, timeout=280,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())
    assert row["status"] == "ok" and row["team"] == "ok_bigram" and "not ok: 0 of 1" in proc.stdout
    me = psutil.Process()
    assert not [c for c in me.children(recursive=True) if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_eval_against_reports_the_paired_difference_and_its_interval():
    """benchmarks/eval_against.py's statistics: the difference is this checkout minus the earlier commit, pair by pair,
    with Student's t interval (here by hand: differences +0.1, +0.2, +0.3, mean 0.2, sd 0.1, t(0.975, 2) = 4.303)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_against import paired

    got = paired([2.0, 2.5, 3.0], [2.1, 2.7, 3.3])
    assert got["mean_diff_s"] == pytest.approx(0.2)
    half = 4.302653 * 0.1 / 3 ** 0.5
    assert got["ci95_s"] == pytest.approx([0.2 - half, 0.2 + half], rel=1e-5)
    assert (got["earlier_median_s"], got["now_median_s"], got["pairs"]) == (2.5, 2.7, 3)
    assert paired([1.0, 2.0], [1.0, 2.0])["wilcoxon_p"] == 1.0  # no difference at all: nothing to test
    with pytest.raises(ValueError, match="paired samples"):
        paired([1.0, 2.0], [1.0])
