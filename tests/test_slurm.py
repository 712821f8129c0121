"""`harness slurm`: the sbatch script's content, `bash -n`, shellcheck, and --submit through sbatch."""

import os
import shutil
import subprocess

import pytest

from conftest import ROOT
from harness.tracks.spec import load_track

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


@pytest.fixture
def script(cli, tmp_path):
    result = cli("slurm", str(ROOT / "submissions" / "baseline"), "--track", "paris2026", "-o", "job.sbatch",
                 "--partition", "gpu", "--account", "gpumode")
    assert result.code == 0, result.err
    return (tmp_path / "job.sbatch").read_text(), tmp_path


def test_script_asks_for_the_tracks_allocation(script):
    text, tmp_path = script
    assert text.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive",
                 "#SBATCH --mem=0", "#SBATCH --no-requeue",
                 "#SBATCH --partition=gpu", "#SBATCH --account=gpumode", "#SBATCH --job-name=harness-baseline"):
        assert line in text.splitlines(), line
    # Every limit the track itself allows must fit: SLURM must never end a run the harness would let finish.
    # On several nodes that includes node 0's wait for the nodes' accounts (while they beat), its wait for their
    # answer to the evaluation's offer, and the evaluation again on node 0 alone (issue 29).
    from harness.launcher.control.heartbeat import silent_after_s

    t = load_track("paris2026")
    longest = (300 + t.startup_timeout_s + t.budget_s + t.grace_s + t.save_allowance_s + silent_after_s(t) + 30
               + t.eval.timeout_s + t.eval.timeout_s + 8)
    line = next(l for l in text.splitlines() if l.startswith("#SBATCH --time="))
    h, m, s = (int(x) for x in line.split("=", 1)[1].split(":"))
    assert longest < h * 3600 + m * 60 + s <= longest + 120, line
    assert ("check 300 s + startup 600 s + budget 600 s + grace 60 s + save 120 s + accounts 35 s + offer 30 s + "
            "eval 600 s + eval_alone 608 s + margin 60 s") in text
    assert (tmp_path / "slurm-logs").is_dir()


def test_one_launcher_per_node_with_rendezvous_on_the_first_node(script):
    text, tmp_path = script
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text
    srun = text[text.index("srun "):]
    assert '--ntasks-per-node=1' in srun and f"--output={tmp_path}/slurm-logs/%x-%j-node%n.out" in srun
    assert '--node-rank "$SLURM_NODEID"' in srun and '--rdzv-endpoint "$HARNESS_RDZV_HOST:$HARNESS_RDZV_PORT"' in srun
    # each job its own port: two jobs whose first node is one host must not meet on one (issue 29)
    assert "export HARNESS_RDZV_PORT=$((29500 + SLURM_JOB_ID % 1000))" in text
    assert '--run-id "$SLURM_JOB_ID"' in srun and '--track "$HARNESS_TRACK"' in srun
    # Since SLURM 20.11 a step gets only the CPUs it asks for (one per task): the launcher asks for the node's.
    assert '--cpus-per-task="$SLURM_CPUS_ON_NODE"' in srun
    assert "--kill-on-bad-exit=0 --wait=0" in srun  # no node is stopped because another ended: each says how it ended
    assert f"export HARNESS_SUBMISSION={ROOT / 'submissions' / 'baseline'}" in text
    assert f"export HARNESS_RUNS_DIR={tmp_path / 'runs'}" in text


def test_script_is_valid_bash_and_passes_shellcheck(script):
    _, tmp_path = script
    assert subprocess.run(["bash", "-n", str(tmp_path / "job.sbatch")]).returncode == 0
    assert shutil.which("shellcheck"), "shellcheck is needed (scripts/test installs it)"
    proc = subprocess.run(["shellcheck", "--severity=info", str(tmp_path / "job.sbatch")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def test_submit_hands_the_script_to_sbatch(cli, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\necho "Submitted batch job 4242"\n')
    fake.chmod(0o755)
    result = cli("slurm", str(ROOT / "submissions" / "baseline"), "--track", "paris2026", "-o", "job.sbatch",
                 "--submit", env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.code == 0, result.err
    assert "Submitted batch job 4242" in result.out
    assert (bin_dir / "args").read_text().strip() == "job.sbatch"


def test_submit_without_sbatch_is_a_clear_error(cli, tmp_path):
    result = cli("slurm", str(ROOT / "submissions" / "baseline"), "--submit", "-o", "job.sbatch",
                 env={"PATH": str(tmp_path)})
    assert result.code == 2 and "sbatch is not on PATH" in result.err
    assert (tmp_path / "job.sbatch").is_file()  # the script is written anyway


def test_threads_are_sized_to_the_cpus_this_process_may_use_not_the_machines(monkeypatch):
    """Inside a SLURM step (or a container, or taskset) the affinity mask is the truth, not os.cpu_count():
    ranks sized to the machine would share the one core a step was given (issue 23, item 6)."""
    from harness.launcher.control import process_tree
    from harness.launcher.run.training import threads_per_rank

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert process_tree.usable_cpus() == 4
    assert threads_per_rank(load_track("local"), 2) == 2  # 4 usable CPUs / 2 ranks, not 64 / 2


def test_the_doctor_job_runs_harness_doctor_on_every_node_of_the_allocation(cli, tmp_path):
    """`harness slurm --doctor`: the track's allocation (its nodes, exclusive, its GPUs), one `harness doctor` per
    node with the all-reduce between the nodes through the first; valid bash that shellcheck passes."""
    from conftest import run_as_slurm

    result = cli("slurm", "--doctor", "--track", "paris2026", "--partition", "gpu", "-o", "doctor.sbatch")
    assert result.code == 0, result.err
    assert "`harness doctor` on each of 4 node(s)" in result.out
    path = tmp_path / "doctor.sbatch"
    text = path.read_text()
    for line in ("#SBATCH --nodes=4", "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive", "#SBATCH --partition=gpu",
                 "#SBATCH --job-name=harness-doctor"):
        assert line in text.splitlines(), line
    assert "node_allreduce 300 s + nodes_allreduce 900 s + margin 60 s" in text  # the rendezvous' 600 s included
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    proc = subprocess.run(["shellcheck", "--severity=info", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    argv = run_as_slurm(path, tmp_path, SLURM_JOB_NUM_NODES="4", SLURM_JOB_ID="99")
    assert argv == ["-P", "-m", "harness", "doctor", "--track", "paris2026", "--node-rank", "0", "--rdzv-endpoint",
                    "node0:29599"], argv  # 29500 + job id 99 mod 1000: the job's own port


def test_slurm_wants_submissions_or_the_doctor_never_both(cli):
    for args in ((), ("--doctor", str(ROOT / "submissions" / "baseline"))):
        result = cli("slurm", *args)
        assert result.code == 2 and "or --doctor" in result.err, result.err
