"""A job's cgroup (harness/launcher/control/job_cgroup.py): what joins it first thing, and everything that process
starts, however fast it forks, is ended with it; a cgroup left by a launcher killed outright is ended by the next.
Against the machine's real cgroup v2 hierarchy (root here, as in CI's container)."""

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path


from harness.launcher.control import job_cgroup, job_limits
from harness.launcher.control.job_cgroup import JobCgroup, cgroup2_mount, own_cgroup
from harness.launcher.control.job_limits import Caps

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


# A process that joins the cgroup, starts a child, then ends its main thread alone while another thread runs on:
# /proc shows it as a zombie, and cgroup.kill passed it over (Linux 6.18).
JOIN_THEN_END_THE_MAIN_THREAD = r"""
import ctypes, os, sys, threading, time
from harness.ranks.confine import cgroup
joined = cgroup.join_from_environment()["active"]
if not joined:
    print(False, flush=True)
    sys.exit(1)
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(True, child, flush=True)
threading.Thread(target=lambda: time.sleep(60)).start()
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit: the main thread alone
"""


def test_a_process_whose_main_thread_ended_first_ends_with_the_cgroup(monkeypatch):
    """cgroup.kill passes over it (Linux 6.18): it is frozen first, so it starts nothing while the launcher lists the
    cgroup and kills what is left one by one."""
    listed_frozen = []
    kill_members = job_cgroup._kill_members

    def seen_frozen(path):
        deadline = time.monotonic() + 30  # the freeze takes each task as it is next scheduled: on a busy machine, late
        while "frozen 1" not in (path / "cgroup.events").read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        listed_frozen.append("frozen 1" in (path / "cgroup.events").read_text())
        kill_members(path)

    monkeypatch.setattr(job_cgroup, "_kill_members", seen_frozen)
    cg = JobCgroup("test")
    assert cg.active, f"this machine (as CI's) offers a cgroup v2 of the job's own: {cg.why}"
    path = Path(cg.env()[job_cgroup.ENV])
    proc = subprocess.Popen([sys.executable, "-c", JOIN_THEN_END_THE_MAIN_THREAD], env={**os.environ, **cg.env()},
                            stdout=subprocess.PIPE, text=True)
    try:
        joined, child = proc.stdout.readline().split()
        assert joined == "True", "the process could not join the cgroup"
        deadline = time.monotonic() + 60
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "its main thread never ended"
            time.sleep(0.01)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2, "one thread runs on"
        ended = cg.close()
        assert proc.wait(timeout=10) == -9 and proc.pid in ended
        assert listed_frozen and all(listed_frozen), "what cgroup.kill passed over ran on while the cgroup was listed"
        try:  # gone, or ended and not yet collected by whoever adopted it
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            state = "gone"
        assert state in ("gone", "Z"), "its child outlived the cgroup"
        assert not path.exists(), "the cgroup is removed once empty"
    finally:
        proc.kill()
        proc.wait()


def test_a_thread_moved_alone_into_a_cgroup_ends_with_it():
    """A process whose main thread has exited, written into another cgroup, moves its running thread alone: that
    cgroup then lists it in cgroup.threads only, and is populated with an empty cgroup.procs."""
    first, second = JobCgroup("test"), JobCgroup("test")
    assert first.active and second.active, f"this machine (as CI's) offers a cgroup v2 of the job's own: {first.why}"
    proc = subprocess.Popen([sys.executable, "-c", JOIN_THEN_END_THE_MAIN_THREAD], env={**os.environ, **first.env()},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().split()[0] == "True", "the process could not join the cgroup"
        deadline = time.monotonic() + 60
        while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline, "its main thread never ended"
            time.sleep(0.01)
        target = Path(second.env()[job_cgroup.ENV])
        (target / "cgroup.procs").write_text(str(proc.pid))
        assert (target / "cgroup.procs").read_text().split() == [] and (target / "cgroup.threads").read_text().split()
        second.close()
        assert proc.wait(timeout=10) == -9
        assert not target.exists(), "the cgroup is removed once empty"
    finally:
        proc.kill()
        proc.wait()
        first.close()


def test_a_cgroup_left_by_a_launcher_killed_outright_is_ended_by_the_next(tmp_path):
    """A launcher killed by SIGKILL runs no teardown: its job's cgroup stays populated. The next JobCgroup on the
    host ends it, and leaves alone the cgroups of launchers that are alive (this one's)."""
    live = JobCgroup("mine")
    # The "launcher" that makes the cgroup lives until the hopper is in it: a cgroup named for a launcher already
    # dead would be swept by any other JobCgroup on the host meanwhile (the suite's other worker makes them too).
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    parent = cgroup2_mount() / own_cgroup().lstrip("/")
    orphan = parent / f"{job_cgroup.PREFIX}{launcher.pid}-{job_cgroup._start_ticks(launcher.pid)}-job-0"
    orphan.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", JOIN_AND_HOP], env={**os.environ, job_cgroup.ENV: str(orphan)},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "True"
        launcher.kill()  # killed outright: no teardown ran
        launcher.wait()
        second = JobCgroup("next")
        # ended by the next JobCgroup on the host: this one, or, between the two lines above, another worker's
        assert not orphan.exists()
        assert proc.wait(timeout=10) == -9
        assert live.active and Path(live.env()[job_cgroup.ENV]).exists(), "a live launcher's cgroup is left alone"
        second.close()
    finally:
        launcher.kill()
        if orphan.exists():
            job_cgroup.end(orphan)
        live.close()
        proc.kill()


def test_the_doctor_says_which_containment_the_node_offers(monkeypatch):
    from harness.launcher.doctor.host import containment_check

    check = containment_check()
    assert check.status == "ok" and "cgroup v2" in check.measured
    assert "memory capped in cgroup" in check.measured and "pids capped in cgroup" in check.measured
    real_dirs = job_limits.v1_dirs
    monkeypatch.setattr(job_limits, "v1_dirs", lambda *a: {k: v for k, v in real_dirs(*a).items() if k != "pids"})
    check = containment_check()
    assert check.status == "warn" and "no pids cap" in check.measured and "ConstrainRAMSpace" in check.fix and "chowned" in check.fix
    monkeypatch.setattr(job_limits, "v1_dirs", real_dirs)
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


# A process that joins its job's cgroups as a rank does, then either forks until a fork is refused (`forks`), or
# writes memory page by page (`memory`) until something stops it.
JOIN_AND_GROW = r"""
import os, sys, time
from harness.ranks.confine import cgroup
print(cgroup.join_from_environment(), flush=True)
if sys.argv[1] == "forks":
    kids = []
    try:
        for _ in range(1000):
            pid = os.fork()
            if pid == 0:
                os.closerange(0, 3)  # the test reads the parent's output to its end, not 30 s of children's
                time.sleep(30)
                os._exit(0)
            kids.append(pid)
    except OSError as exc:
        print("refused after", len(kids), exc.errno, flush=True)
    sys.exit(0)
hoard = []
for _ in range(16):  # 16 x 64 MiB, past the test's 128 MiB cap and far short of the machine
    chunk = bytearray(64 << 20)
    chunk[::4096] = b"\x01" * len(range(0, len(chunk), 4096))
    hoard.append(chunk)
print("survived", flush=True)
"""


def test_a_job_past_its_memory_cap_is_ended_by_the_kernel_and_the_record_counts_it():
    """The kernel ends the job's process that passes the cap (never the process that made the cgroup, here the
    test as the launcher), and the report counts the kill for the run's reason."""
    cg = JobCgroup("capped", Caps(memory_bytes=128 << 20, pids=512))
    assert set(cg.limits.held) == {"memory", "pids"}, cg.limits.why
    tcp = cg.limits.cap_dirs["memory"] / "memory.kmem.tcp.limit_in_bytes"
    held_tcp = tcp.read_text().strip() if tcp.exists() else ""
    proc = subprocess.run([sys.executable, "-c", JOIN_AND_GROW, "memory"], env={**os.environ, **cg.env()},
                          capture_output=True, text=True, timeout=120)
    cg.close()
    assert "'active': True" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -9 and "survived" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr[-500:])
    report = cg.report()
    assert report["limits"]["refused"]["oom_kills"] >= 1, report
    said = job_limits.caps_reached(report)
    assert "the job's memory reached its cap of 0.12 GiB" in said and "killer ended 1 of its processes" in said
    assert held_tcp in ("", str(128 << 20)), "socket buffers are held to the cap where v1 charges them apart"
    assert not any(Path(d).exists() for d in cg.limits.held.values()), "the job's cgroups are removed with it"


def test_a_job_past_its_task_cap_cannot_fork_and_the_record_counts_it():
    cg = JobCgroup("capped", Caps(memory_bytes=1 << 30, pids=32))
    proc = subprocess.run([sys.executable, "-c", JOIN_AND_GROW, "forks"], env={**os.environ, **cg.env()},
                          capture_output=True, text=True, timeout=120)
    leftover = cg.close()
    refused = [line for line in proc.stdout.splitlines() if line.startswith("refused after")]
    assert refused and int(refused[0].split()[2]) < 32 and refused[0].endswith(" 11"), proc.stdout + proc.stderr
    assert leftover, "the sleeping children were in the job's cgroup and ended with it"
    report = cg.report()
    assert report["limits"]["refused"]["forks_refused"] >= 1, report
    assert "cap of 32 tasks" in job_limits.caps_reached(report)


def test_each_cap_is_held_in_the_v2_cgroup_where_its_controller_is_handed_down_else_in_a_v1_hierarchy(tmp_path):
    """Where each controller's cap goes, from the files the kernel shows: a v2 job cgroup whose parent hands the
    controller down holds it; otherwise the controller's own v1 hierarchy, below this process's place in it; where
    neither, no cap and why."""
    v2_parent = tmp_path / "unified" / "launcher"
    (v2_parent / "job").mkdir(parents=True)
    (v2_parent / "cgroup.subtree_control").write_text("cpu memory\n")
    v1 = tmp_path / "pids-hierarchy"
    (v1 / "slurm" / "step").mkdir(parents=True)
    (tmp_path / "mountinfo").write_text(
        f"35 24 0:30 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw\n"
        f"40 24 0:35 / {v1} rw,nosuid - cgroup cgroup rw,pids\n")
    (tmp_path / "cgroup").write_text("8:pids:/slurm/step\n0::/launcher\n")
    caps = Caps(memory_bytes=3 << 30, pids=100)
    limits = job_limits.JobLimits("job", caps, v2_parent / "job", lambda name: False,
                                  mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "cgroup"))
    assert (v2_parent / "job" / "memory.max").read_text() == str(3 << 30)
    assert (v1 / "slurm" / "step" / "job" / "pids.max").read_text() == "100"
    assert limits.held["memory"].startswith("cgroup v2") and limits.held["pids"].startswith("cgroup v1")
    assert limits.env() == {"HARNESS_JOB_LIMITS": str(v1 / "slurm" / "step" / "job")}
    (v2_parent / "job" / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    (v1 / "slurm" / "step" / "job" / "pids.events").write_text("max 7\n")
    assert limits.count() == {"oom_kills": 1, "forks_refused": 7}
    # Without the v2 cgroup, and with no memory hierarchy: the memory cap is not held, and the report says why.
    bare = job_limits.JobLimits("job2", caps, None, lambda name: False, mountinfo=str(tmp_path / "mountinfo"),
                                proc_cgroup=str(tmp_path / "cgroup"))
    assert "memory" not in bare.held and "no memory controller" in bare.why["memory"] and "pids" in bare.held


def test_a_v1_cap_cgroup_left_by_a_launcher_killed_outright_is_removed_by_the_next(tmp_path):
    v1 = tmp_path / "pids"
    (v1 / "harness-job-1-2-job-0").mkdir(parents=True)
    (v1 / "someone-elses").mkdir()
    (tmp_path / "mountinfo").write_text(f"40 24 0:35 / {v1} rw - cgroup cgroup rw,pids\n")
    (tmp_path / "cgroup").write_text("8:pids:/\n")
    job_limits.JobLimits("harness-job-3-4-job-0", Caps(memory_bytes=1 << 30, pids=100), None,
                         lambda name: name.startswith("harness-job-1-"), mountinfo=str(tmp_path / "mountinfo"),
                         proc_cgroup=str(tmp_path / "cgroup"))
    assert sorted(p.name for p in v1.iterdir()) == ["harness-job-3-4-job-0", "someone-elses"]


def test_the_node_offers_its_memory_or_the_lowest_cap_of_the_cgroups_above_this_process(tmp_path):
    """SLURM caps a job's cgroup, above the step's own: the lowest cap on the way up is what the node offers."""
    (tmp_path / "meminfo").write_text("MemTotal:       24000000 kB\nMemFree: 1 kB\n")
    memory = tmp_path / "memory"
    (memory / "job" / "step").mkdir(parents=True)
    # v1: the kernel's own minimum over the folder and those above it, in memory.stat
    (memory / "job" / "step" / "memory.stat").write_text(f"cache 0\nhierarchical_memory_limit {8 << 30}\n")
    (tmp_path / "mountinfo").write_text(f"36 24 0:31 / {memory} rw - cgroup cgroup rw,memory\n")
    (tmp_path / "cgroup").write_text("4:memory:/job/step\n")
    args = dict(meminfo=str(tmp_path / "meminfo"), proc_cgroup=str(tmp_path / "cgroup"),
                mountinfo=str(tmp_path / "mountinfo"))
    assert job_limits.node_memory_bytes(None, **args) == 8 << 30
    (memory / "job" / "step" / "memory.stat").write_text("hierarchical_memory_limit 9223372036854771712\n")  # none
    assert job_limits.node_memory_bytes(None, **args) == 24000000 * 1024
    # v2: memory.max of the own cgroup and of every one above it, to the mount
    v2 = tmp_path / "unified"
    (v2 / "job" / "step").mkdir(parents=True)
    (v2 / "job" / "step" / "memory.max").write_text("max\n")
    assert job_limits.node_memory_bytes(v2 / "job" / "step", v2, **args) == 24000000 * 1024
    (v2 / "job" / "memory.max").write_text(f"{2 << 30}\n")
    assert job_limits.node_memory_bytes(v2 / "job" / "step", v2, **args) == 2 << 30


def test_a_v1_mount_that_shows_part_of_its_hierarchy_places_this_process_within_it(tmp_path):
    """A container on a v1 host: the mount shows /docker/<id> of the hierarchy, which /proc/self/cgroup names."""
    (tmp_path / "mountinfo").write_text(
        "36 24 0:31 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "37 24 0:32 /docker/abc /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n")
    (tmp_path / "cgroup").write_text("4:memory:/docker/abc\n5:pids:/docker/abc/inner\n")
    assert job_limits.v1_dirs(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup")) == {
        "memory": Path("/sys/fs/cgroup/memory"), "pids": Path("/sys/fs/cgroup/pids/inner")}
    (tmp_path / "cgroup").write_text("4:memory:/elsewhere\n")  # outside what the mount shows: unreachable
    assert job_limits.v1_dirs(str(tmp_path / "mountinfo"), str(tmp_path / "cgroup")) == {}


def test_a_kill_or_a_refusal_below_the_jobs_own_cap_is_never_blamed_on_it(tmp_path):
    """An out-of-memory kill of the node, or a fork refused by a limit above the job (systemd's TasksMax, a
    SLURM step's), is counted in the job's cgroup too: the cap is blamed only where the job reached it."""
    v2_parent = tmp_path / "launcher"
    (v2_parent / "job").mkdir(parents=True)
    (v2_parent / "cgroup.subtree_control").write_text("memory pids\n")
    limits = job_limits.JobLimits("job", Caps(memory_bytes=1 << 30, pids=100), v2_parent / "job", lambda n: False,
                                  mountinfo=str(tmp_path / "none"), proc_cgroup=str(tmp_path / "none"))
    job = v2_parent / "job"
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\n")
    (job / "pids.events").write_text("max 3\n")
    (job / "pids.peak").write_text("40\n")
    assert limits.count() == {"oom_kills": 0, "oom_kills_not_at_cap": 2, "forks_refused": 0,
                              "forks_refused_not_at_cap": 3}
    assert job_limits.caps_reached({"limits": limits.report()}) == ""  # never the caps' doing
    said = job_limits.caps_reached({"limits": limits.report()}, outside=True)
    assert "ended 2 of the job's processes while the job was below its own memory cap" in said
    assert "a limit above the job (the host's or its container's) refused 3" in said
    (job / "memory.events").write_text("low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n")
    (job / "pids.peak").write_text("100\n")
    limits.events.clear()
    assert limits.count() == {"oom_kills": 1, "forks_refused": 3}
    assert "the job's memory reached its cap of 1.00 GiB" in job_limits.caps_reached({"limits": limits.report()})
    assert job_limits.caps_reached({"limits": limits.report()}, outside=True) == ""


def test_a_run_whose_host_holds_no_cap_says_so_in_its_warnings(tmp_path):
    """Where a cap could not be held, the record's warnings name it and why, once for every phase."""
    from harness.launcher.run.assemble import sandbox_warnings
    from harness.results.records import RunRecord

    record = RunRecord(run_id="r", team="t", track_name="tiny")
    why = {"pids": "no pids controller here, and no cgroup v2 of the job's own"}
    record.extra["containment"] = {phase: {"active": True, "why": "cgroup v2 x", "limits": {"held": {"memory": "v1"},
                                                                                           "why": why}}
                                   for phase in ("check", "training", "evaluation")}
    sandbox_warnings(record, proc_sys=str(tmp_path))
    capped = [w for w in record.warnings if w.startswith("no cap of the job's own")]
    assert capped == ["no cap of the job's own on pids (no pids controller here, and no cgroup v2 of the job's own): a "
                      "job that allocates or forks without end can exhaust the node's (docs/rules.md, \"Signals and "
                      "other processes\")"]
    held = RunRecord(run_id="r", team="t", track_name="tiny")
    held.extra["containment"] = {"training": {"active": True, "why": "x", "limits": {"held": {"memory": "v1", "pids": "v1"}}}}
    sandbox_warnings(held, proc_sys=str(tmp_path))
    assert not [w for w in held.warnings if w.startswith("no cap")]


def test_the_task_cap_leaves_the_host_room_to_fork_and_evaluation_room_for_its_scorers(tmp_path):
    """A job at its task cap must leave the launcher and the scorers pids to fork: the cap is at most half of what
    the host holds. Evaluation's scorers share the job's cgroups: the team's model processes keep the track's
    memory cap, and the scorers have room of their own beside it."""
    from harness.launcher.run.evaluation import eval_caps
    from harness.scoring.scorer import KEEP_BYTES
    from harness.tracks.spec import load_track

    (tmp_path / "pid_max").write_text("32768\n")
    (tmp_path / "threads-max").write_text("190000\n")
    assert job_limits.caps_for(1.0, 32768, proc_sys=str(tmp_path)).pids == 16384
    assert job_limits.caps_for(1.0, 4096, proc_sys=str(tmp_path)).pids == 4096
    assert job_limits.caps_for(1.0, 4096, proc_sys=str(tmp_path / "nothing")).pids == 4096  # unknown: the track's
    track = dataclasses.replace(load_track("local"), job_memory_gib=2.0)
    caps = eval_caps(track, 2)
    logits = track.eval.batch_size * track.eval.seq_len * track.data.vocab_size * 4
    assert caps.memory_bytes == (2 << 30) + caps.room_bytes and caps.room_bytes == 2 * (KEEP_BYTES + 3 * logits + (1 << 30))
    node = int(job_limits.node_memory_bytes(*job_cgroup.v2_own_and_mount()) * job_limits.MEMORY_SHARE_OF_NODE)
    by_default = eval_caps(load_track("local"), 2)  # 90% of the node already: no room past it
    assert by_default.memory_bytes == node and by_default.room_bytes == 0
