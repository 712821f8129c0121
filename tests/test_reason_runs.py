"""Reasons only a real run gives, that no test stated before issue 31: each run through the CLI (one rank, a
fixed number of steps) with what makes it end so, and its record's reason stated."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, HARNESS_SCRIPT, QUICK_BUDGET_S, QUICK_STEPS, TINY_TRACK, only_record, processes_of_run, \
    quick_track, tiny_track_with

pytestmark = pytest.mark.slow


def sandboxed(folder: Path, mode: str) -> Path:
    """quick_track's track with the track's `sandbox` set (tiny.toml leaves it to its default, "auto")."""
    base = folder / "base" / TINY_TRACK.name
    base.parent.mkdir()
    base.write_text(TINY_TRACK.read_text().replace('name = "tiny"\n', f'name = "tiny"\nsandbox = "{mode}"\n', 1))
    return tiny_track_with(folder, base=base, nproc_per_node=1, cpu_threads_per_rank=1, max_steps=QUICK_STEPS,
                           budget_s=QUICK_BUDGET_S)


def test_a_launcher_that_fails_mid_run_says_it_was_the_harnesss_error(cli, tmp_path):
    """Where the record's copy of the submission goes, something already stands (a file): the launcher's copy
    fails, not the team. The run still ends with a record: `crashed`, and the reason says whose error it was."""
    run_dir = tmp_path / "runs" / "tiny" / "ok_bigram" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "submission").write_text("in the way")
    result = cli("run", str(FIXTURES / "ok_bigram"), "--track", str(quick_track(tmp_path)), "--run-id", "r1")
    assert result.code != 0
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "crashed", record["reason"]
    assert record["reason"].startswith("harness error: FileExistsError: "), record["reason"]


def test_a_checkpoint_the_launcher_cannot_take_aborts_the_run_as_the_harnesss(cli, tmp_path):
    """Rank 0 saved its checkpoint and said so; the record's copy cannot be written (a folder stands where it goes):
    the launcher's side failed, so the run is `aborted` (a queue runs it again), never charged to the team."""
    run_dir = tmp_path / "runs" / "tiny" / "ok_bigram" / "r1"
    (run_dir / "checkpoint.pt").mkdir(parents=True)
    result = cli("run", str(FIXTURES / "ok_bigram"), "--track", str(quick_track(tmp_path)), "--run-id", "r1")
    assert result.code != 0
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "aborted", record["reason"]
    assert record["reason"].startswith("harness error: the checkpoint could not be taken: IsADirectoryError: "), \
        record["reason"]
    assert record["val_loss"] is None and processes_of_run(record["run_id"]) == []


def test_rank_0_that_never_says_its_checkpoint_is_saved_is_crashed(cli, tmp_path):
    # a roomy checkpoint allowance: the job ends on its own, and the launcher finds no report to take the file on
    track = quick_track(tmp_path, checkpoint_allowance_s=120.0, save_allowance_s=120.0)
    result = cli("run", str(FIXTURES / "hides_checkpoint_report"), "--track", str(track))
    assert result.code != 0
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed", record["reason"]
    assert record["reason"] == "rank 0 reported success but never said its checkpoint was saved"
    assert record["val_loss"] is None and not (run_dir / "checkpoint.pt").exists()


def test_a_build_optimizers_that_returns_no_optimizer_is_invalid(cli, tmp_path):
    result = cli("run", str(FIXTURES / "bad_optimizers"), "--track", str(quick_track(tmp_path)))
    assert result.code != 0
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "invalid", record["reason"]
    assert record["reason"] == ("rank 0: submission.py: build_optimizers must return an Optimizer or a non-empty list "
                                "of them. Fix: return torch.optim optimizers built over model.parameters()")


def test_a_record_copy_changed_during_training_is_never_evaluated(cli, tmp_path):
    """Without the sandbox (a track that turns it off) a rank can reach the runs tree: edits_record_copy appends a
    line to the record's copy of its submission.py. Evaluation would import that copy: the run is `invalid`, flagged."""
    team = tmp_path / "edits_record_copy"
    shutil.copytree(FIXTURES / "edits_record_copy", team)
    run_dir = tmp_path / "runs" / "tiny" / "edits_record_copy" / "r1"
    (team / "record_copy.txt").write_text(str(run_dir / "submission" / "submission.py"))
    result = cli("run", str(team), "--track", str(sandboxed(tmp_path, "off")), "--run-id", "r1")
    assert result.code != 0
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "invalid", record["reason"]
    assert record["reason"] == ("the submission's files in the record changed during training; evaluation will not "
                                "import them")
    assert record["flagged"] and record["val_loss"] is None
    assert "# changed by a training rank" in (run_dir / "submission" / "submission.py").read_text()


NO_USER_NAMESPACES = """
import os, sys
from harness.ranks.confine.namespaces import CLONE_NEWUSER, map_identity
from harness.ranks.confine.rootfs import Libc, Refused
try:
    uid, gid = os.getuid(), os.getgid()
    Libc().unshare(CLONE_NEWUSER, "unshare")
    map_identity(uid, gid)
    with open("/proc/sys/user/max_user_namespaces", "w") as fh:  # this namespace's own limit: none below it
        fh.write("0")
except (OSError, Refused) as exc:
    print(f"SKIP {exc}", flush=True)
    sys.exit(0)
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_a_track_that_requires_the_sandbox_aborts_on_a_host_that_refuses_user_namespaces(tmp_path, cache_dir):
    """The run inside a user namespace of the test's own whose limit of user namespaces is 0: as on a host that
    refuses them (Ubuntu's AppArmor default, a sysctl), the training ranks' namespace cannot be made. The track
    requires the sandbox: the run is `aborted` before the training ranks start (the machine's, not the team's)."""
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    ran = subprocess.run([sys.executable, "-c", NO_USER_NAMESPACES, str(HARNESS_SCRIPT), "run",
                          str(FIXTURES / "ok_bigram"), "--track", str(sandboxed(tmp_path, "required")),
                          "--no-leaderboard"], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert not ran.stdout.startswith("SKIP"), f"no user namespace of the test's own here: {ran.stdout.strip()}"
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "aborted", (record["reason"], ran.stderr[-2000:])
    assert record["reason"].startswith("the track requires the sandbox, and the training ranks cannot have a "
                                       "namespace of their job's own here: no namespace of the job's own: "), \
        record["reason"]
    assert record["steps"] is None and "training" not in record["sandbox"]


# Landlock stacks at most 16 rulesets on a process: a wrapper that takes all 16 (each allows everything it
# handles, so the layers change nothing) leaves the harness's own sandbox no layer, as a host or a container
# that confines its processes with Landlock does.
LANDLOCK_FULL = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]
class Beneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]
EXECUTE = 1
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
root = os.open("/", os.O_PATH)
for _ in range(16):
    attr = Attr(EXECUTE)
    fd = libc.syscall(444, ctypes.byref(attr), ctypes.sizeof(attr), 0)  # landlock_create_ruleset
    assert fd >= 0, ctypes.get_errno()
    rule = Beneath(EXECUTE, root)
    assert libc.syscall(445, fd, 1, ctypes.byref(rule), 0) == 0, ctypes.get_errno()  # landlock_add_rule
    assert libc.syscall(446, fd, 0) == 0, ctypes.get_errno()  # landlock_restrict_self
    os.close(fd)
os.execv(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.parametrize("submission, reason_start", [
    # the open division checks before it launches: the check process is the first to need the sandbox
    (ROOT / "submissions" / "open_example",
     "the track requires the sandbox and the check process could not enter it on this machine ("),
    # the fixed loop's ranks start beside the check, and their namespace is made first (Landlock refuses its mounts)
    (FIXTURES / "ok_bigram",
     "the track requires the sandbox, and the training ranks cannot have a namespace of their job's own here: "),
])
def test_a_check_process_that_cannot_enter_the_required_sandbox_aborts_the_run_as_the_machines(
        tmp_path, cache_dir, submission, reason_start):
    """The track requires the sandbox and the check process cannot enter it (here every Landlock layer is taken
    before the harness starts): no team code ran, so the run is `aborted` (the machine's, re-run), as a training
    rank without the sandbox is; it was `invalid`, charged to the team, with a reason naming no file."""
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    ran = subprocess.run([sys.executable, "-c", LANDLOCK_FULL, str(HARNESS_SCRIPT), "run",
                          str(submission), "--track", str(sandboxed(tmp_path, "required")),
                          "--no-leaderboard"], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "aborted", (record["status"], record["reason"], ran.stderr[-2000:])
    assert record["reason"].startswith(reason_start), record["reason"]
    assert record["reason"].endswith("no team code ran") and record["steps"] is None


def test_a_check_killed_at_its_limit_by_a_slow_screen_is_not_a_sandbox_it_could_not_enter(tmp_path):
    """The team's files decide how long the static screen takes (chains of attribute lookups, megabytes of them).
    The check process sends its sandbox report before the screen, so a check killed at its time limit has said
    whether it entered the sandbox, and a track that requires the sandbox does not read its silence as "could not
    enter it" (an `aborted` run, re-run for free: the red team's way to choose a re-run). Only a report the process
    sent can abort a run; a report that never came says nothing of the sandbox."""
    from harness.launcher.run.check_process import run_preflight

    folder = tmp_path / "slow_screen"
    folder.mkdir()
    (folder / "submission.py").write_text((FIXTURES / "ok_bigram" / "submission.py").read_text())
    chain = "x = a" + ".b" * 150 + "\n"
    (folder / "padding.py").write_text(chain * (2_000_000 // len(chain)))  # tens of seconds of screen here
    report = run_preflight(folder, vocab_size=256, device="cpu", seed=1, log_path=tmp_path / "preflight.log",
                           eval_seq_len=64, sandbox_mode="required", timeout_s=8.0)
    assert report["problems"][0]["problem"].startswith("checking the submission took more than 8 s"), report
    assert report["sandbox"]["reported"] is True and report["sandbox"]["active"] is True, report["sandbox"]
