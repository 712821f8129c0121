"""The queue of runs (harness/launcher/event/queue.py): its state from the records alone, the run lock that
tells a live launcher from a dead one, and a real queue of three teams x two seeds through the CLI,
killed half-way (its launcher, as a lost node or SLURM would) and resumed."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from pathlib import Path

from conftest import FIXTURES, processes_of_run, quick_track, run_as_slurm
from records_factory import make_run
from harness.launcher.event.queue import (DONE, FAILED, LOST, QUEUED, RUNNING, STUCK, build_queue, close_lost_record, state_of,
                                          table)
from harness.results.locks import RUN_LOCK, RunLock, launcher_alive


def team_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / "submissions" / name
    shutil.copytree(FIXTURES / "ok_bigram", folder)
    (folder / "submission.toml").write_text(f'[team]\nname = "{name}"\n')
    return folder


def test_a_queue_entry_is_settled_by_its_own_records_only(tmp_path):
    runs = tmp_path / "runs"
    folder = team_folder(tmp_path, "alpha")
    entries = build_queue([str(folder)], seed=1, repeat=6)
    assert [e.seed for e in entries] == [1, 2, 3, 4, 5, 6] and {e.team for e in entries} == {"alpha"}
    sha = entries[0].sha256
    make_run(runs, "alpha", 2.0, seed=1, sha=sha)
    make_run(runs, "alpha", None, seed=2, sha=sha, status="crashed", reason="rank 1: model.py:3: boom")
    make_run(runs, "alpha", None, seed=3, sha=sha, status="aborted", reason="stopped by SIGTERM")
    here = socket.gethostname()  # a free lock is proof of a dead launcher on the launcher's own host only
    stale = make_run(runs, "alpha", None, seed=4, sha=sha, status="running", hostname=here)
    (stale / RUN_LOCK).touch()  # a launcher held it, and is gone
    live = make_run(runs, "alpha", None, seed=5, sha=sha, status="running", hostname=here)
    held = RunLock(live)
    make_run(runs, "alpha", 1.5, seed=6, sha="b" * 64)  # another version of the code: not this queue's
    make_run(runs, "alpha", 1.5, seed=6, sha=sha, overrides={"max_steps": {"track": 0, "run": 5}})  # another setup
    try:
        states = [state_of(e, runs / "local", {}) for e in entries]
        assert [s.state for s in states] == [DONE, FAILED, LOST, LOST, RUNNING, QUEUED]
        assert states[1].reason == "rank 1: model.py:3: boom" and states[2].reason == "stopped by SIGTERM"
        assert launcher_alive(live) is True and launcher_alive(stale) is False
        assert launcher_alive(runs / "local" / "alpha") is None  # no lock file: not known, never called dead
        view = "\n".join(table(states))
        assert "alpha        1        1        1        1        2" in view, view
    finally:
        held.release()


def test_an_organisers_stops_are_run_again_and_never_make_an_entry_stuck(tmp_path):
    """Ctrl-C, scancel and SLURM's time limit (SIGINT, SIGTERM, SIGHUP to the launcher: no team code can send them)
    leave `aborted` records that are run again however many there are; two losses of unknown cause make it stuck."""
    runs = tmp_path / "runs"
    (entry,) = build_queue([str(team_folder(tmp_path, "alpha"))], seed=1, repeat=1)
    for i, sig in enumerate(("SIGINT", "SIGTERM", "SIGHUP")):
        make_run(runs, "alpha", None, seed=1, sha=entry.sha256, status="aborted", reason=f"stopped by {sig}",
                 run_id=f"20261129T10000{i}-stop{i:02d}", started_at=f"2026-11-29T10:0{i}:00Z")
    state = state_of(entry, runs / "local", {})
    assert state.state == LOST and state.reason == "stopped by SIGHUP"
    # Where Landlock could not scope signals (ABI below 6), a rank could SIGTERM its own launcher: that stop counts.
    make_run(runs, "alpha", None, seed=1, sha=entry.sha256, status="aborted", reason="stopped by SIGTERM",
             run_id="20261129T100100-unscoped", started_at="2026-11-29T10:10:00Z",
             sandbox={"training": {"active": True, "abi": 5}})
    assert state_of(entry, runs / "local", {}).state == LOST
    make_run(runs, "alpha", None, seed=1, sha=entry.sha256, status="aborted", run_id="20261129T100101-lost01",
             reason="finalized by the queue (`harness run --resume`): its launcher died", started_at="2026-11-29T10:11:00Z")
    state = state_of(entry, runs / "local", {})
    assert state.state == STUCK and "lost 2 times" in state.reason


def test_a_record_left_running_by_a_dead_launcher_is_closed_as_aborted_and_a_live_one_is_not(tmp_path):
    runs = tmp_path / "runs"
    here = socket.gethostname()
    stale = make_run(runs, "alpha", None, seed=1, status="running", hostname=here)
    (stale / RUN_LOCK).touch()
    live = make_run(runs, "alpha", None, seed=2, status="running", hostname=here)
    held = RunLock(live)
    try:
        assert close_lost_record(stale, "its launcher died") is True
        assert close_lost_record(live, "its launcher died") is False
    finally:
        held.release()
    closed = json.loads((stale / "run.json").read_text())
    assert closed["status"] == "aborted" and closed["reason"] == "finalized by the queue (`harness run --resume`): its launcher died"
    assert json.loads((live / "run.json").read_text())["status"] == "running"


def _records(runs: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(runs.glob("*/*/*/run.json"))]


@pytest.mark.slow
def test_a_queue_killed_half_way_resumes_and_ends_with_every_team_ranked_on_its_own_runs(cli, tmp_path, cache_dir):
    """3 teams x 2 seeds, one after another; the queue's launcher is killed with SIGKILL during the third
    run (the infrastructure's failure: a lost node, a job SLURM ended), which leaves that record `running`.
    Started again with --resume, the queue skips the two settled runs, closes the lost one as `aborted`,
    runs it again and the rest; every team ends ranked on its two ok runs."""
    track = quick_track(tmp_path)
    runs = tmp_path / "runs"
    folders = [str(team_folder(tmp_path, name)) for name in ("alpha", "bravo", "charlie")]
    args = ["run", *folders, "--repeat", "2", "--track", str(track), "--no-leaderboard"]
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(runs)}
    queue = subprocess.Popen([sys.executable, "-m", "harness", *args, "--resume"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # the third run (charlie, seed 1: A B C A B C) is training: kill it
            if any((d / "logs" / "rank0.log").exists() for d in runs.glob("*/charlie/*")):
                break
            assert queue.poll() is None, "the queue ended before it could be killed"
            time.sleep(0.05)
        else:
            raise AssertionError(f"the third run never started: {_records(runs)}")
        (charlie_run,) = runs.glob("*/charlie/*")
        assert launcher_alive(charlie_run) is True  # the live launcher holds its run's lock
        queue.send_signal(signal.SIGKILL)
    finally:
        queue.wait(timeout=60)
    assert launcher_alive(charlie_run) is False  # dropped by the kernel with the launcher
    assert all(launcher_alive(d) is False for d in runs.glob("*/alpha/*"))  # released at each final record
    lost = next(r for r in _records(runs) if r["status"] == "running")
    time.sleep(1.0)  # the ranks die with their launcher (PR_SET_PDEATHSIG)
    assert processes_of_run(lost["run_id"]) == []

    view = cli("queue", *folders, "--repeat", "2", "--track", str(track))
    assert view.code == 0 and f"{lost['team']} seed {lost['seed']}: lost" in view.out, view.out

    resumed = cli("run", *args[1:], "--resume", timeout=600)
    assert resumed.code == 0, resumed.text
    assert resumed.err.count("skipped ") == 2 and "left running by a launcher that is gone; aborted" in resumed.err
    records = _records(runs)
    assert sorted((r["team"], r["seed"]) for r in records if r["status"] == "ok") == \
        [(t, s) for t in ("alpha", "bravo", "charlie") for s in (1, 2)]
    (closed,) = [r for r in records if r["status"] != "ok"]
    assert closed["run_id"] == lost["run_id"] and closed["status"] == "aborted" and "infrastructure" in closed["reason"]

    again = cli("run", *args[1:], "--resume")  # nothing left: every team x seed is settled
    assert again.code == 0 and again.err.count("skipped ") == 6 and len(_records(runs)) == 7
    board = cli("leaderboard", "--runs-dir", str(runs), "--no-charts")
    assert board.code == 0, board.text
    rows = {r["team"]: r for r in csv.DictReader((tmp_path / "leaderboard" / "tiny.csv").open())}
    assert {t: (rows[t]["rank"] != "", rows[t]["n_runs"]) for t in rows} == \
        {"alpha": (True, "2"), "bravo": (True, "2"), "charlie": (True, "2")}


@pytest.mark.slow
def test_slurm_writes_the_queue_as_a_job_array_of_what_is_left(cli, tmp_path):
    runs = tmp_path / "runs"
    folders = [team_folder(tmp_path, name) for name in ("alpha", "bravo", "charlie")]
    sha = build_queue([str(folders[0])], 1, 1)[0].sha256
    make_run(runs, "alpha", 2.0, seed=1, sha=sha, track="paris2026", budget_s=600.0)  # settled: --resume leaves it out
    script = tmp_path / "queue.sbatch"
    result = cli("slurm", *map(str, folders), "--repeat", "2", "--resume", "--track", "paris2026",
                 "--runs-dir", str(runs), "--max-concurrent", "1", "-o", str(script))
    assert result.code == 0, result.text
    text = script.read_text()
    assert "#SBATCH --array=0-4%1" in text and "#SBATCH --nodes=4" in text and "#SBATCH --exclusive" in text
    assert "SEEDS=(1 1 2 2 2)" in text and f"SUBMISSIONS=({folders[1]} {folders[2]} {folders[0]} " in text
    assert '--seed "$HARNESS_SEED"' in text and 'HARNESS_RUN_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in text
    assert "#SBATCH --no-requeue" in text  # SLURM's requeue would reuse the lost run's id and folder
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert shutil.which("shellcheck"), "shellcheck is needed (scripts/test installs it)"
    lint = subprocess.run(["shellcheck", "--severity=info", str(script)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout
    # Task 3 of array job 77 as SLURM runs it on its first node: bravo, seed 2, run id 77_3.
    argv = run_as_slurm(script, tmp_path, SLURM_JOB_NUM_NODES="4", SLURM_JOB_ID="80", SLURM_ARRAY_JOB_ID="77",
                        SLURM_ARRAY_TASK_ID="3")
    assert argv[argv.index("run") + 1] == str(folders[1]) and argv[argv.index("--seed") + 1] == "2"
    assert argv[argv.index("--run-id") + 1] == "77_3" and argv[argv.index("--node-rank") + 1] == "0"


def test_an_entry_is_claimed_by_one_queue_at_a_time(tmp_path):
    """Two queues over one runs tree read the same records and would both start an entry: the claim (a flock
    held for the run) lets one through; the other is told why, and a claim freed is free again."""
    from harness.launcher.event.queue import Queue, claim

    folder = team_folder(tmp_path, "alpha")
    queue = Queue(build_queue([str(folder)], seed=1, repeat=2), tmp_path / "runs" / "local", {})
    first, second = queue.entries
    with claim(queue, first) as mine:
        assert mine == ""
        with claim(queue, first) as theirs:  # another open file description: as another process's
            assert theirs == "another queue is running it now"
        with claim(queue, second) as other_seed:
            assert other_seed == ""
    with claim(queue, first) as again:
        assert again == ""
    assert not (tmp_path / "runs" / "local" / "alpha").exists()  # a team's folder holds its runs, nothing else


@pytest.mark.slow
def test_two_queues_started_at_once_run_each_entry_once(tmp_path, cache_dir):
    """An organiser's two terminals (or a queue beside a SLURM array task) over one runs tree: every team x seed
    runs exactly once between them."""
    track = quick_track(tmp_path)
    runs = tmp_path / "runs"
    folders = [str(team_folder(tmp_path, name)) for name in ("alpha", "bravo")]
    args = [sys.executable, "-m", "harness", "run", *folders, "--repeat", "2", "--track", str(track), "--resume",
            "--no-leaderboard"]
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(runs)}
    queues = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(2)]
    outs = [q.communicate(timeout=600) for q in queues]
    assert [q.returncode for q in queues] == [0, 0], outs
    records = [json.loads(p.read_text()) for p in runs.glob("*/*/*/run.json")]
    assert sorted((r["team"], r["seed"]) for r in records) == [("alpha", 1), ("alpha", 2), ("bravo", 1), ("bravo", 2)]
    assert all(r["status"] == "ok" for r in records)


def test_a_free_lock_seen_from_another_host_proves_nothing_but_slurm_can_say(tmp_path, monkeypatch):
    # flock on a shared file system may be local to each client (NFS local_lock, Lustre localflock): from
    # another host every lock looks free. There, the run's SLURM job is asked (squeue stood in for here).
    from harness.launcher.control.alive import launcher_alive as gone_or_why
    from harness.results.records import load_record

    runs = tmp_path / "runs"
    elsewhere = make_run(runs, "alpha", None, status="running", hostname="node7.cluster",
                         extra={"launcher_where": {"slurm_job_id": "4242"}})
    (elsewhere / RUN_LOCK).touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\necho RUNNING\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = load_record(elsewhere)
    assert "its SLURM job 4242 is still in the queue" in gone_or_why(record, run_dir=elsewhere)
    squeue.write_text("#!/bin/sh\nexit 0\n")  # the job has left the queue: its launcher is gone
    assert gone_or_why(record, run_dir=elsewhere) == ""
    no_job = make_run(runs, "bravo", None, status="running", hostname="node7.cluster")
    (no_job / RUN_LOCK).touch()
    assert "cannot be seen from here" in gone_or_why(load_record(no_job), run_dir=no_job)
    rebooted = make_run(runs, "charlie", None, status="running", hostname=socket.gethostname(),
                        extra={"launcher_where": {"boot_id": "an-earlier-boot"}})
    (rebooted / RUN_LOCK).touch()  # the same name, another boot: not this machine's lock to judge
    assert gone_or_why(load_record(rebooted), run_dir=rebooted) != ""


def test_what_a_team_can_make_of_its_folder_never_stops_or_fools_the_queue(tmp_path):
    """From the red team: a file name that is no UTF-8 made every team's queue exit; a team name with a
    zero-width character passed for another team's; a name or reason with terminal escapes forged rows of
    the queue's view; a rehearsal's track file with the event's name (another budget) counted as done."""
    from harness.launcher.event.queue import EntryState
    from harness.submission.contract import SubmissionError, read_team

    odd = team_folder(tmp_path, "odd")
    (odd / os.fsdecode(b"notes-\xff.txt")).write_bytes(b"x")
    (entry,) = build_queue([str(odd)], seed=1, repeat=1)
    assert entry.team == "odd" and len(entry.sha256) == 64
    twin = team_folder(tmp_path, "twin")
    (twin / "submission.toml").write_text('[team]\nname = "odd\\u200b"\n')
    with pytest.raises(SubmissionError, match="invisible or control characters"):
        read_team(twin)
    forged = EntryState(entry, FAILED, None, "boom\x1b[2K\r\nmallory          0        0        9")
    view = table([forged])
    assert "\x1b" not in "\n".join(view) and not any(line.startswith("mallory") for line in view)
    runs = tmp_path / "runs"
    make_run(runs, "odd", 2.0, seed=1, sha=entry.sha256, budget_s=4.0)  # the rehearsal's 4 s track, same name
    assert state_of(entry, runs / "local", {}, budget_s=600.0).state == QUEUED
    assert state_of(entry, runs / "local", {}, budget_s=4.0).state == DONE


def test_a_run_lost_twice_is_left_to_the_organiser(tmp_path):
    # A team that ends its own unlucky runs by starving its launcher would otherwise draw again for ever.
    from harness.launcher.event.queue import STUCK, pending
    from harness.launcher.event.queue import Queue

    runs = tmp_path / "runs"
    (entry,) = build_queue([str(team_folder(tmp_path, "alpha"))], seed=1, repeat=1)
    make_run(runs, "alpha", None, sha=entry.sha256, status="aborted", reason="launch failed: rendezvous timed out",
             started_at="2026-11-29T10:00:00Z")
    queue = Queue([entry], runs / "local", {})
    assert queue.state(entry).state == LOST and pending(queue) == [entry]
    make_run(runs, "alpha", None, sha=entry.sha256, status="aborted", run_id="again", started_at="2026-11-29T11:00:00Z",
             reason="finalized by the queue (`harness run --resume`): its launcher died")
    stuck = queue.state(entry)
    assert stuck.state == STUCK and "lost 2 times" in stuck.reason and pending(queue) == []


def test_a_copy_never_reads_past_what_the_file_held_when_it_was_opened(tmp_path, monkeypatch):
    # A rank could grow a sparse checkpoint to a terabyte while the launcher copied it: the copy filled the
    # records' disk. It takes the size seen at open, and no more (here the file "grew" after that moment).
    from harness.launcher.control import team_files

    (tmp_path / "src").write_bytes(b"a" * 100 + b"b" * 900)
    real_fstat = os.fstat

    def seen_at_open(fd):
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, st.st_uid, st.st_gid, 100,
                               st.st_atime, st.st_mtime, st.st_ctime))

    monkeypatch.setattr(team_files.os, "fstat", seen_at_open)
    folder = os.open(tmp_path, os.O_RDONLY)
    try:
        assert team_files.copy_regular_file("src", tmp_path / "dest", folder) is True
    finally:
        os.close(folder)
    assert (tmp_path / "dest").read_bytes() == b"a" * 100


def test_a_queue_refuses_two_teams_whose_names_share_a_records_folder(tmp_path):
    """Attack of 2026-12-03: folders claiming "Team A" and "Team-A" made two entries of one records folder; whichever
    ran first owned it, and the other's entry was refused at every --resume, never settled."""
    first, second = tmp_path / "a" / "x", tmp_path / "b" / "y"
    for folder, name in ((first, "Team A"), (second, "Team-A")):
        shutil.copytree(FIXTURES / "ok_bigram", folder)
        (folder / "submission.toml").write_text(f'[team]\nname = "{name}"\n')
    with pytest.raises(ValueError, match="teams 'Team A' and 'Team-A', one records folder"):
        build_queue([str(first), str(second)], seed=1, repeat=1)
    (second / "submission.toml").write_text('[team]\nname = "Team B"\n')
    assert [e.team for e in build_queue([str(first), str(second)], seed=1, repeat=1)] == ["Team A", "Team B"]
