"""A job's cgroup (harness/launcher/control/job_cgroup.py): what joins it first thing, and everything that process
starts, however fast it forks, is ended with it; a cgroup left by a launcher killed outright is ended by the next.
Against the machine's real cgroup v2 hierarchy (root here, as in CI's container)."""

import os
import subprocess
import sys
import time
from pathlib import Path


from harness.launcher.control import job_cgroup
from harness.launcher.control.job_cgroup import JobCgroup, cgroup2_mount, own_cgroup

MOUNTINFO = """\
24 30 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 1 0:27 / / rw,relatime shared:1 - ext4 /dev/vda rw
35 24 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
36 24 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
"""

# A process that joins the cgroup named in its environment (as a rank does), then starts a hopper that leaves its
# session and forks a new copy of itself every millisecond: its pid is never the one a list holds.
JOIN_AND_HOP = r"""
import os, sys, time
from harness.ranks.confine import cgroup
joined = cgroup.join_from_environment()["active"]
print(joined, flush=True)
if not joined:  # never a hopper outside a cgroup: nothing could end it but its own clock
    sys.exit(1)
if os.fork() == 0:
    os.setsid()
    end = time.monotonic() + 60  # and never one that outlives a failed test by more than a minute
    while time.monotonic() < end:
        if os.fork():
            os._exit(0)
        time.sleep(0.001)
    os._exit(0)
time.sleep(60)
"""


def test_the_cgroup2_mount_and_this_process_s_cgroup_are_read_from_proc(tmp_path):
    (tmp_path / "mountinfo").write_text(MOUNTINFO)
    assert cgroup2_mount(str(tmp_path / "mountinfo")) == Path("/sys/fs/cgroup/unified")
    (tmp_path / "none").write_text(MOUNTINFO.replace("cgroup2 cgroup2", "cgroup cgroup"))
    assert cgroup2_mount(str(tmp_path / "none")) is None
    (tmp_path / "cgroup").write_text("4:memory:/x\n0::/user.slice/job\n")
    assert own_cgroup(str(tmp_path / "cgroup")) == "/user.slice/job"


def _hopper(cg: JobCgroup) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", JOIN_AND_HOP], env={**os.environ, **cg.env()},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "True", "the process could not join the cgroup"
    return proc


def test_everything_a_joined_process_starts_ends_with_the_cgroup_however_fast_it_forks():
    cg = JobCgroup("test")
    assert cg.active, f"this machine (as CI's) offers a cgroup v2 of the job's own: {cg.why}"
    path = Path(cg.env()[job_cgroup.ENV])
    proc = _hopper(cg)
    assert Path(f"/proc/{proc.pid}/oom_score_adj").read_text().strip() == "1000", "team code goes first on OOM"
    time.sleep(0.3)
    assert len(cg.members()) >= 2, "the hopper is in the cgroup, born there"
    ended = cg.close()
    assert proc.wait(timeout=10) == -9 and len(ended) >= 2
    assert not path.exists(), "the cgroup is removed once empty"
    assert cg.close() == [], "closing twice is harmless"


def test_a_cgroup_left_by_a_launcher_killed_outright_is_ended_by_the_next(tmp_path):
    """A launcher killed by SIGKILL runs no teardown: its job's cgroup stays populated. The next JobCgroup on the
    host ends it, and leaves alone the cgroups of launchers that are alive (this one's)."""
    live = JobCgroup("mine")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    parent = cgroup2_mount() / own_cgroup().lstrip("/")
    orphan = parent / f"{job_cgroup.PREFIX}{dead.pid}-1-job-0"  # a launcher's pid that is gone
    orphan.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", JOIN_AND_HOP], env={**os.environ, job_cgroup.ENV: str(orphan)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "True"
        second = JobCgroup("next")
        assert orphan.name in second.swept and not orphan.exists()
        assert proc.wait(timeout=10) == -9
        assert live.active and Path(live.env()[job_cgroup.ENV]).exists(), "a live launcher's cgroup is left alone"
        second.close()
    finally:
        if orphan.exists():
            job_cgroup.end(orphan)
        live.close()
        proc.kill()


def test_the_doctor_says_which_containment_the_node_offers(monkeypatch):
    from harness.launcher.doctor.host import containment_check

    check = containment_check()
    assert check.status == "ok" and "cgroup v2" in check.measured
    monkeypatch.setenv(job_cgroup.OFF_ENV, "off")
    check = containment_check()
    assert check.status == "fail" and "turned off (HARNESS_CGROUP=off)" in check.measured
    monkeypatch.delenv(job_cgroup.OFF_ENV)
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if str(path).endswith("cgroup.procs") else real_access(path, mode))
    check = containment_check()
    assert check.status == "fail" and "cgroup.procs is not writable" in check.measured
    monkeypatch.setattr(os, "access", real_access)
    monkeypatch.setattr(job_cgroup, "cgroup2_mount", lambda *a: None)
    check = containment_check()
    assert check.status == "fail" and "no cgroup v2 hierarchy" in check.measured and "Delegate=yes" in check.fix


def test_a_process_that_joins_no_cgroup_reports_nothing_and_one_that_cannot_says_why(tmp_path, monkeypatch):
    from harness.ranks.confine import cgroup

    monkeypatch.delenv(cgroup.ENV, raising=False)
    assert cgroup.join_from_environment(oom_first=False) is None
    monkeypatch.setenv(cgroup.ENV, str(tmp_path / "not-a-cgroup"))
    held = cgroup.join_from_environment(oom_first=False)
    assert held["active"] is False and "could not join" in held["why"]
