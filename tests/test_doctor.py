"""`harness doctor`: one line per check with what to do, an exit code, a real all-reduce through the launcher
(harness/launcher/doctor/: checkup.py, table.py, host.py, comm.py, scratch.py, model.py;
harness/ranks/doctor_rank.py)."""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import ROOT, TINY_TRACK
from harness.launcher.doctor.table import CHECKS, Check, DoctorOptions
from harness.launcher.doctor.comm import BENCH_CHECKS
from harness.tracks.spec import load_track


@pytest.mark.slow
def test_doctor_runs_every_check_and_measures_a_two_rank_gloo_all_reduce(cli, tmp_path):
    """Through the real entry point on the test track (2 CPU ranks): every check once, in the table's order, an
    exit code that is 1 exactly when one failed, the all-reduce's bus bandwidth measured in 2 ranks, one of
    evaluation's model processes started and reporting its sandbox, the scratch root as runs use it."""
    result = cli("doctor", "--track", str(TINY_TRACK), "--json", timeout=120)
    report = json.loads(result.out)
    assert [c["name"] for c in report["checks"]] == list(CHECKS), result.err
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert result.code == report["exit_code"] == (1 if failed else 0), failed
    assert all(c["fix"] for c in report["checks"] if c["status"] in ("warn", "fail"))  # what to do, always
    by_name = {c["name"]: c for c in report["checks"]}
    bench = by_name["allreduce-node"]
    assert bench["status"] in ("ok", "warn"), bench
    assert bench["value"] > 0 and bench["unit"] == "GB/s" and "2 x cpu" in bench["measured"], bench
    assert by_name["clock-skew"]["status"] == "ok" and "2 ranks" in by_name["clock-skew"]["measured"]
    for name in ("gpus", "driver", "memlock", "infiniband", "allreduce-nodes"):  # a CPU machine, a one-node track
        assert by_name[name]["status"] == "skipped" and by_name[name]["measured"], by_name[name]
    # Evaluation's scorers use gloo between nodes: on one node there are none, and the line says so.
    gloo = by_name["gloo-nodes"]
    assert gloo["status"] == "skipped" and "runs on one node: evaluation's scorers meet no other node" in gloo["measured"]
    assert by_name["scratch-root"]["status"] == "ok" and "mounted exec" in by_name["scratch-root"]["measured"]
    # One of evaluation's model processes, started as a scorer starts it (forked from the clean template, in its
    # own namespaces and root, Landlock), fed one batch whose logits come back exact; no CUDA on a CPU track.
    model = by_name["eval-model"]
    assert model["status"] == "ok" and model["unit"] == "s" and 0 < model["value"] < 60, model
    for said in ("its own user, PID, IPC and network namespaces", "its own root", "Landlock ABI", "seccomp on",
                 "CUDA skipped (track tiny runs on cpu)", "one batch of 2x8"):
        assert said in model["measured"], model
    assert report["seconds"] < 60
    assert not list((tmp_path / "runs").glob(".doctor-*"))  # its lock file and canary are gone


def test_a_failing_check_gives_exit_code_1_and_its_fix_in_the_table(cli):
    """A node whose data differs from the fingerprint the organiser expects: the table's line says FAIL and what
    to do, the verdict names it, the exit code is 1."""
    skips = [arg for name in (*BENCH_CHECKS, "eval-model") for arg in ("--skip", name)]
    result = cli("doctor", "--track", str(TINY_TRACK), "--data-fingerprint", "0" * 16, *skips, timeout=120)
    assert result.code == 1, result.text
    lines = result.out.splitlines()
    assert lines[0].startswith("harness doctor: track tiny on ") and lines[1].split() == ["CHECK", "STATUS",
                                                                                         "MEASURED", "WHAT", "TO", "DO"]
    data = next(line for line in lines if line.startswith("data "))
    assert data.split()[1] == "FAIL" and f"expected {'0' * 16}" in data and "stage it again" in data, data
    assert {line.split()[0] for line in lines[2:-1]} == set(CHECKS)  # one line per check, skipped ones included
    assert "NOT READY (data failed" in lines[-1]


def test_skipping_an_unknown_check_is_a_usage_error(cli):
    result = cli("doctor", "--skip", "gpu")
    assert result.code == 2 and "unknown check(s) to skip: gpu" in result.err and "gpus" in result.err


def test_the_doctor_fails_a_host_whose_apparmor_refuses_user_namespaces(tmp_path):
    """Issue 23, item 11: Ubuntu 24.04's AppArmor default weakens the sandbox to Landlock alone; the doctor says
    it is a failure, and gives the fix."""
    from harness.launcher.doctor.host import namespaces_check

    proc_sys = tmp_path / "kernel"
    proc_sys.mkdir()
    (proc_sys / "apparmor_restrict_unprivileged_userns").write_text("1\n")
    check = namespaces_check(load_track(str(TINY_TRACK)), str(tmp_path))
    assert check.status == "fail" and "kernel.apparmor_restrict_unprivileged_userns = 1" in check.measured
    assert "Landlock alone" in check.measured
    assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in check.fix and "`userns,`" in check.fix


def test_the_doctor_makes_the_jobs_private_tmpfs_and_warns_where_it_cannot(tmp_path, monkeypatch):
    """The namespaces line makes a job's namespaces with its private folder a tmpfs, for real; where the tmpfs cannot
    be had (here: its holder's root cannot be reached), it is a warning that says what stays undefended."""
    from harness.launcher.control.job_namespace import JobNamespace
    from harness.launcher.doctor.host import namespaces_check

    track = load_track(str(TINY_TRACK))
    check = namespaces_check(track, str(tmp_path))
    assert check.status == "ok" and "its private folder a tmpfs of the job's own: made" in check.measured
    assert "PID namespaces of the job's own (a /proc of its own)" in check.measured
    made = JobNamespace.__init__

    def without_pids(self, *args, **kwargs):  # as the holder says where the kernel refuses the PID namespace
        made(self, *args, **kwargs)
        self.pid_why = "unshare of the ranks' namespaces: Operation not permitted (the test's)"

    with monkeypatch.context() as patched:
        patched.setattr(JobNamespace, "__init__", without_pids)
        check = namespaces_check(track, str(tmp_path))
    assert check.status == "warn" and "no PID namespace of the job's own (unshare" in check.measured, check.measured
    assert "can outlive its job" in check.measured and check.fix
    monkeypatch.setattr(JobNamespace, "_open_folder", lambda self, writable: "not reachable (the test's)")
    check = namespaces_check(track, str(tmp_path))
    assert check.status == "warn" and "not reachable (the test's)" in check.measured, check.measured
    assert "a file without a name is not under the track's scratch_cap_gib" in check.measured and check.fix


def test_a_file_system_without_flock_is_a_warning_with_the_mount_option(tmp_path, monkeypatch):
    """Lustre without -o flock, NFS mounted nolock: the records run unlocked (harness/results/locks.py), and the
    doctor says how to mount them."""
    import fcntl

    from harness.launcher.doctor.host import locks_check

    def no_locks(*_args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    check = locks_check(tmp_path / "runs")
    assert check.status == "warn" and "runs go on unlocked" in check.measured and "-o flock" in check.fix
    assert list((tmp_path / "runs").iterdir()) == []


NCCL_IB = """NCCL INFO Bootstrap : Using ib0:10.0.0.1<0>
NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.0.0.1<0>
NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/IB/0/GDRDMA
"""
NCCL_SOCKETS = """NCCL INFO NET/IB : No device found.
NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>
NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Socket/0
"""


def test_infiniband_from_inside_the_sandbox_is_read_from_nccls_own_log():
    """NET/IB in NCCL's INFO log is the proof; a fall-back to sockets between nodes is a failure, said plainly."""
    from harness.launcher.doctor.comm import Bench, infiniband_check

    track = load_track("paris2026")
    ok = infiniband_check(track, Bench({}, "", NCCL_IB, {}), None)
    assert ok.status == "ok" and "mlx5_0" in ok.measured and "via NET/IB" in ok.measured
    sockets = infiniband_check(track, Bench({}, "", NCCL_SOCKETS, {}), None)
    assert sockets.status == "fail" and "TCP sockets" in sockets.measured and "/dev/infiniband" in sockets.fix
    chosen = infiniband_check(track, Bench({}, "", "NCCL INFO Using network IB\n", {}), None)  # NCCL 2.19+
    assert chosen.status == "ok", chosen
    cpu = infiniband_check(load_track(str(TINY_TRACK)), Bench({}, "", "", {}), None)
    assert cpu.status == "skipped" and "gloo" in cpu.measured


@pytest.mark.parametrize("share, status", [(0.9, "ok"), (0.5, "warn"), (0.1, "fail")])
def test_the_bus_bandwidth_is_judged_against_the_tracks_declared_links(share, status):
    """busbw against comm_model's figure for the same size and ranks (NVLink's, on paris2026)."""
    from harness.launcher.doctor.comm import Bench, bandwidth_check, expected_busbw

    track = load_track("paris2026")
    size = 256 << 20
    want = expected_busbw(track, size, 8, 8)
    assert 400e9 < want < 720e9  # 900 GB/s x 0.8 less the latency terms
    result = {"world_size": 8, "size_bytes": size, "time_s": 1e-3, "busbw_bytes_per_s": share * want,
              "device_name": "NVIDIA B300", "correct": True}
    check = bandwidth_check("allreduce-node", track, Bench(result, "", "", {}), 8, 1)
    assert check.status == status and f"{share:.0%}" in check.measured, check
    assert check.value == pytest.approx(share * want / 1e9)


def test_a_check_is_typed():
    with pytest.raises(ValueError, match="status"):
        Check(name="gpus", status="fine")
    with pytest.raises(ValueError, match="unknown check"):
        DoctorOptions(skip=("gpu",))


def test_a_kernel_whose_landlock_does_not_scope_signals_is_a_warning_with_the_reason():
    """Below Landlock ABI 6 a rank can signal its node's launcher, and a stopped launcher reads as a lost node."""
    from harness.launcher.doctor.comm import Bench, sandbox_check
    from harness.tracks.spec import load_track

    track = load_track("local")
    box = {"active": True, "why": "Landlock ABI 5", "abi": 5, "namespaces": {"active": True}}
    check = sandbox_check(track, Bench({"sandbox": box, "canaries_readable": []}, "", "", {}), ["x"])
    assert check.status == "warn" and "does not scope signals" in check.fix
    box7 = {**box, "abi": 7, "why": "Landlock ABI 7"}
    assert sandbox_check(track, Bench({"sandbox": box7, "canaries_readable": []}, "", "", {}), ["x"]).status == "ok"


# ----------------------------------------------------------------------------- the scratch root, as runs use it


@pytest.fixture
def short_root():
    """A scratch root with a short path, as an organiser's should be (the ranks' sockets are made under it)."""
    root = Path(tempfile.mkdtemp(prefix="hd-", dir="/tmp" if os.path.isdir("/tmp") else None))
    yield root
    shutil.rmtree(root, ignore_errors=True)


IN_A_MOUNT = """
import json, os, sys
from dataclasses import asdict
from harness.ranks.confine.namespaces import CLONE_NEWNS, CLONE_NEWUSER, map_identity
from harness.ranks.confine.rootfs import MS_NODEV, MS_NOEXEC, MS_NOSUID, Libc, Refused
root, flags, data, check = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
uid, gid = os.getuid(), os.getgid()
try:
    Libc().unshare(CLONE_NEWUSER | CLONE_NEWNS, "unshare")
    map_identity(uid, gid)
    Libc().mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV | flags, "the test's tmpfs", data)
except (OSError, Refused) as exc:
    print(f"SKIP {exc}", flush=True)
    sys.exit(0)
os.environ["HARNESS_SCRATCH_DIR"] = root
if check == "scratch-root":
    from harness.launcher.doctor.scratch import scratch_root_check
    found = scratch_root_check()
else:
    from pathlib import Path
    from harness.launcher.doctor.model import model_process_check
    from harness.tracks.spec import load_track
    found = model_process_check(load_track(sys.argv[5]), Path(sys.argv[6]), None)
print(json.dumps(asdict(found)))
"""


def _in_a_tmpfs(root: Path, check: str, *, noexec: bool = False, options: str = "", args=()) -> dict:
    """One of the doctor's checks in a user and mount namespace of the test's own, with a real tmpfs mounted
    over the scratch root (no root needed; skipped where the host refuses them)."""
    from harness.ranks.confine.rootfs import MS_NOEXEC

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ran = subprocess.run([sys.executable, "-c", IN_A_MOUNT, str(root), str(MS_NOEXEC if noexec else 0), options, check,
                          *map(str, args)], capture_output=True, text=True, timeout=120, env=env)
    if ran.stdout.startswith("SKIP"):
        pytest.skip(f"no user and mount namespace here: {ran.stdout.strip()}")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return json.loads(ran.stdout.strip().splitlines()[-1])


def test_a_noexec_scratch_root_fails_the_doctor_with_the_folder_and_the_fix(short_root):
    """Issue 29: `harness run` refuses a scratch root mounted noexec, and the doctor said "ready" over one. A
    real noexec tmpfs over HARNESS_SCRATCH_DIR: the doctor fails it in the words of `harness run`'s refusal."""
    check = _in_a_tmpfs(short_root, "scratch-root", noexec=True)
    assert check["status"] == "fail", check
    assert f"the scratch folder {short_root} (HARNESS_SCRATCH_DIR) is on a file system mounted noexec" in \
        check["measured"] and "failed to map segment" in check["measured"], check
    assert check["fix"].startswith("set HARNESS_SCRATCH_DIR to a folder on a local file system mounted with exec")


def test_a_scratch_root_too_long_for_a_ranks_sockets_fails_with_the_fix(tmp_path, monkeypatch):
    """A rank's multiprocessing socket (<root>/harness-train-XXXXXXXX/tmp/pymp-XXXXXXXX/listener-XXXXXXXX) must
    fit 107 bytes: bound for real in a training folder made as a run makes it; a short root passes."""
    from harness.launcher.doctor.scratch import SOCKET_PATH_MAX_BYTES, scratch_root_check
    from harness.ranks.confine.scratch import SCRATCH_ENV

    long_root = tmp_path / ("x" * 60)
    long_root.mkdir()
    monkeypatch.setenv(SCRATCH_ENV, str(long_root))
    check = scratch_root_check()
    fits = SOCKET_PATH_MAX_BYTES - len("/harness-train-XXXXXXXX/tmp/pymp-XXXXXXXX/listener-XXXXXXXX")
    assert check.status == "fail" and check.value == len(str(long_root)) + SOCKET_PATH_MAX_BYTES - fits, check
    assert f"{long_root} (HARNESS_SCRATCH_DIR) mounted exec" in check.measured and "too long" in check.measured
    assert check.fix.startswith(f"set HARNESS_SCRATCH_DIR to a folder with a shorter path ({fits} bytes at most")
    assert list(long_root.iterdir()) == []  # the training folder it made is gone
    monkeypatch.setenv(SCRATCH_ENV, "/tmp")
    assert scratch_root_check().status == "ok"


# ----------------------------------------------------------------------------- evaluation's model process


@pytest.mark.slow
def test_a_model_process_that_cannot_start_fails_with_its_error(short_root, tmp_path):
    """A scratch root that cannot hold a model process's private folder (a real tmpfs with no inode left): the
    check fails with the error, naming the folder, and what to do."""
    runs = tmp_path / "runs"
    check = _in_a_tmpfs(short_root, "eval-model", options="size=4k,nr_inodes=1", args=(TINY_TRACK, runs))
    assert check["status"] == "fail", check
    assert check["measured"].startswith("the model process could not start: OSError: [Errno 28] No space left on device")
    assert f"{short_root}/harness-model-" in check["measured"]
    assert "no run could be scored on this node" in check["fix"] and "scratch" in check["fix"]
    assert not list(runs.glob(".doctor-*"))


# ----------------------------------------------------------------------------- gloo between the nodes


@pytest.mark.slow
def test_the_gloo_all_reduce_runs_beside_the_tracks_in_one_job():
    """On an NCCL track the nodes' job also all-reduces over a gloo group of CPU tensors (evaluation's scorers'
    transport); here on one node with 2 ranks, judged as gloo-nodes judges it."""
    import dataclasses

    from harness.launcher.doctor.comm import Bench, gloo_nodes_check, run_bench

    track = load_track(str(TINY_TRACK))
    bench = run_bench(track, nproc=2, nnodes=1, gloo=True)
    gloo = bench.result["gloo"]
    assert gloo["correct"] and gloo["busbw_bytes_per_s"] > 0 and gloo["size_bytes"] == 4 << 20, bench.why
    check = gloo_nodes_check(dataclasses.replace(track, backend="nccl", device="cuda"), bench)
    assert check.status == "ok" and "CPU tensors" in check.measured and check.unit == "GB/s", check
    broken = gloo_nodes_check(dataclasses.replace(track, backend="nccl", device="cuda"),
                              Bench({**bench.result, "gloo": {"error": "RuntimeError: Connection refused"}}, "", "", {}))
    assert broken.status == "fail" and "Connection refused" in broken.measured and "GLOO_SOCKET_IFNAME" in broken.fix
