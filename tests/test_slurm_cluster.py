"""The event's path against a real SLURM: slurmctld and four slurmd on this machine (scripts/slurm-cluster, the
script organisers use to try `harness slurm` without a cluster), real sbatch, srun, squeue and scancel.

One rehearsal (`harness rehearse`) carries the day: 3 teams x 2 seeds on a 2-node CPU track, two array tasks
at once on one host, a node's processes killed mid-run, scancel of the array, the records' file system
frozen, the scratch filled, a team that hangs; the queue resumed until settled; its board is then compared
with the ranking the same queue gives in the foreground on one node. The doctor runs on an allocation first.
The tests of this file run in order, on one worker (`--dist loadfile`): the cluster is up for the first,
and the rehearsal stops it.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, run_dirs, tiny_track_with

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SCRIPT = ROOT / "scripts" / "slurm-cluster"
TEAMS = {"alpha": 0.08, "bravo": 0.03, "charlie": 0.01}  # learning rates: alpha learns fastest, charlie slowest


def _slurm_procs() -> list[str]:
    out = subprocess.run(["ps", "-eo", "stat=,comm="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if line.split()[-1] in ("slurmctld", "slurmd", "slurmstepd") and not line.startswith("Z")]


@pytest.fixture(scope="module")
def cluster():
    """The cluster, started by the project's own script (CI's path too): 4 nodes on this machine."""
    up = subprocess.run([str(SCRIPT), "up", "4"], capture_output=True, text=True, timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True, text=True)
    assert sorted(set(sinfo.stdout.split())) == ["n1", "n2", "n3", "n4"], sinfo.stdout
    yield
    subprocess.run([str(SCRIPT), "down"], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def teams(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("teams")
    text = (FIXTURES / "paced_bigram" / "submission.py").read_text()
    out = []
    for name, lr in TEAMS.items():
        team = folder / name
        team.mkdir()
        (team / "submission.py").write_text(text.replace("LEARNING_RATE = 0.05", f"LEARNING_RATE = {lr}")
                                            .replace("PACE_S = 0.3", f"PACE_S = {PACE_S}"))
        (team / "submission.toml").write_text(f'[team]\nname = "{name}"\n')
        out.append(team)
    return out


# 10 steps of 0.5 s: 5 s of training, where the faults land. A node is lost after 3 s here (half the collective
# timeout): the stall of the file system (5 s) outlasts it, and training outlasts the stall's first 3 s.
STEPS, PACE_S, COLLECTIVE_TIMEOUT_S = 10, 0.5, 6.0


def _cheap(track: Path) -> Path:
    """The scheduler's path is under test here, not evaluation's causality check (tests/test_evaluation_security.py
    and test_causality_verdict.py have it): without it, each run's evaluation starts one model process, not two."""
    track.write_text(track.read_text().replace("[eval]\n", "[eval]\ncausality_check = false\n", 1))
    return track


def _two_node_track(folder: Path) -> Path:
    """tiny on 2 nodes of 1 rank, bounded by STEPS steps, a budget that never cuts an honest run on a busy machine
    (the hanging team's run ends at it: budget + grace)."""
    folder.mkdir(parents=True, exist_ok=True)
    return _cheap(tiny_track_with(folder, nnodes=2, nproc_per_node=1, cpu_threads_per_rank=1, max_steps=STEPS,
                                  budget_s=25.0, collective_timeout_s=COLLECTIVE_TIMEOUT_S))


@pytest.mark.timeout(900)
def test_harness_slurm_doctor_runs_on_every_node_of_an_allocation(cluster, cli, tmp_path):
    """`harness slurm --doctor --submit` on a real 2-node allocation: each node's table in its own log, node 0
    the rendezvous of the all-reduce between the nodes, and the job's exit status SLURM records."""
    track = _two_node_track(tmp_path / "track")
    result = cli("slurm", "--doctor", "--track", str(track), "--submit", "-o", "doctor.sbatch", timeout=120)
    assert result.code == 0, result.text
    job = re.search(r"Submitted batch job (\d+)", result.out).group(1)
    _wait_gone(job, 600)
    logs = sorted((tmp_path / "slurm-logs").glob(f"harness-doctor-{job}-node*.out"))
    assert [p.name for p in logs] == [f"harness-doctor-{job}-node0.out", f"harness-doctor-{job}-node1.out"]
    for node, log in enumerate(logs):
        text = log.read_text()
        assert f"(node {node} of 2)" in text, text
        assert re.search(r"^allreduce-nodes\s+(ok|warn)\s", text, re.M), text  # measured between the two nodes
        assert "node_rank is only used" not in text  # torchrun's warning about a flag we no longer pass
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state or "JobState=FAILED" in state, state  # what the doctor's exit code made it


def _wait_gone(job: str, timeout_s: float) -> None:
    from harness.launcher.event.cluster import wait_for_job

    assert wait_for_job(job, timeout_s), f"SLURM job {job} still queued or running after {timeout_s:.0f} s"


def test_harness_slurm_names_and_leaves_out_a_submission_the_check_rejects(cli, tmp_path):
    """Issue 29: `harness slurm` queued a template the check rejects. Each submission is checked first; one that
    would be rejected is named with its problem and left out of the array."""
    track = _two_node_track(tmp_path / "track")
    result = cli("slurm", str(FIXTURES / "ok_bigram"), str(FIXTURES / "no_get_model"), "--track", str(track),
                 "--repeat", "2", "-o", "queue.sbatch", timeout=180)
    assert result.code == 0, result.text
    assert re.search(r"left out: \S*no_get_model would be rejected on track .*get_model", result.err), result.err
    script = (tmp_path / "queue.sbatch").read_text()
    assert "#SBATCH --array=0-1%1" in script  # 2 seeds of ok_bigram alone, one at a time by default
    assert "no_get_model" not in script
    assert "under a folder each node of a cluster has of its own" in result.err  # tmp_path is under /tmp


@pytest.mark.timeout(1800)
def test_the_day_rehearsed_every_fault_ends_as_it_must_and_the_board_ranks_as_the_foreground(cluster, cli, teams,
                                                                                              tmp_path):
    track = _two_node_track(tmp_path / "track")
    result = cli("rehearse", *map(str, teams), "--track", str(track), "--repeat", "2", "--max-concurrent", "2",
                 "--fault", "node-lost", "--fault", "cancel", "--fault", "fs-stall", "--fault", "scratch-full",
                 "--fault", "team-hangs", "--workdir", str(tmp_path / "day"), timeout=1500)
    report = json.loads((tmp_path / "day" / "report.json").read_text())
    assert result.code == 0 and report["ok"], result.text + "\n" + "\n".join(report["problems"])
    assert "Every entry and every fault ended as it must." in (tmp_path / "day" / "report.md").read_text()
    assert not _slurm_procs(), _slurm_procs()  # the rehearsal stopped the cluster: nothing of it runs

    entries = {(e["team"], e["seed"]): e for e in report["entries"]}
    assert set(entries) == {(t, s) for t in TEAMS for s in (1, 2)} | {("rehearsal-hangs", 1)}
    assert all(e["state"] == "done" for k, e in entries.items() if k[0] in TEAMS)
    assert entries[("rehearsal-hangs", 1)]["state"] == "failed"  # the team's own: never run again
    assert [a["status"] for a in entries[("rehearsal-hangs", 1)]["attempts"]] == ["timeout"]
    faults = {f["fault"]: f for f in report["faults"]}
    assert set(faults) == {"node-lost", "cancel", "fs-stall", "scratch-full"} and all(f["as_expected"] for f in faults.values())
    lost = next(a for e in entries.values() for a in e["attempts"] if a["run_id"] == faults["node-lost"]["run_id"])
    assert lost["status"] == "aborted" and "lost" in lost["reason"], lost

    # --resume runs what was lost or never ran, and nothing that was settled (a done run, the team's timeout)
    first, second = report["rounds"][0], report["rounds"][1]
    first_ids = {t["run_id"] for t in first["tasks"]}
    settled_in_first = {k for k, e in entries.items()
                        if any(a["run_id"] in first_ids and a["status"] in ("ok", "timeout") for a in e["attempts"])}
    resumed = {(t["team"], t["seed"]) for t in second["tasks"]}
    assert resumed and not resumed & settled_in_first
    assert resumed == {k for k in entries if k not in settled_in_first}

    # two array tasks ran at once on one host (rendezvous and ports of their own) and both ended well
    records = [json.loads((d / "run.json").read_text()) for d in run_dirs(tmp_path / "day" / "runs")]
    ok = sorted((r["started_at"], r["ended_at"]) for r in records if r["status"] == "ok")
    assert any(b[0] < a[1] for a, b in zip(ok, ok[1:])), ok
    for log in (tmp_path / "day" / "slurm-logs").glob("*.out"):
        assert "node_rank is only used" not in log.read_text(errors="replace"), log

    # the same queue in the foreground, on one node of two ranks (the same world size): the same ranking
    fg_track = _cheap(tiny_track_with(_mkdir(tmp_path / "fg"), nproc_per_node=2, cpu_threads_per_rank=1,
                                      max_steps=STEPS, budget_s=25.0, collective_timeout_s=COLLECTIVE_TIMEOUT_S))
    fg = cli("run", *map(str, teams), "--track", str(fg_track), "--repeat", "2", runs_dir=tmp_path / "fg-runs",
             timeout=900)
    assert fg.code == 0, fg.text
    board = [b["team"] for b in report["board"] if b["rank"]]
    fg_records = [json.loads((d / "run.json").read_text()) for d in run_dirs(tmp_path / "fg-runs")]
    mean = {t: sum(r["val_loss"] for r in fg_records if r["team"] == t) / 2 for t in TEAMS}
    assert board == sorted(TEAMS, key=mean.get) == ["alpha", "bravo", "charlie"], (board, mean)
    for b in report["board"]:
        if b["rank"]:  # one figure on either path: the same data, world size and steps; only the scorers differ
            assert float(b["val_loss"]) == pytest.approx(mean[b["team"]], abs=1e-5), (b, mean)


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
