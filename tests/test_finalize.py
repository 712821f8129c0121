"""`harness finalize RUN`: a record its launcher can no longer finish, ended `aborted` by an organiser (issue 24)."""

import pytest
import csv
import json
import socket
import subprocess
import sys

from harness.results.records import utc_now
from records_factory import make_run

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_stuck_record_is_finalized_aborted_and_the_team_keeps_its_rank(tmp_path, cli):
    """A launcher killed with SIGKILL left the newest record at `running`: finalized through the real command, it
    says `aborted` with the organiser's reason, the refreshed leaderboard keeps the team's rank and says what
    became of the run, and a second finalize is refused (the record is final)."""
    runs = tmp_path / "runs"
    for seed, v in ((1, 2.00), (2, 2.02)):
        make_run(runs, "alpha", v, seed=seed, sha="1" * 64, started_at=f"2026-11-29T10:0{seed}:00Z")
    make_run(runs, "bravo", 2.5)
    stuck = make_run(runs, "alpha", None, status="running", sha="2" * 64, seed=3, started_at="2026-11-29T11:00:00Z",
                     hostname=socket.gethostname(), launcher_pid=_gone_pid())
    result = cli("finalize", stuck.name, "--reason", "node lost", "--runs-dir", str(runs))
    assert result.code == 0, result.text
    assert f"finalized alpha/{stuck.name} as aborted" in result.out
    record = json.loads((stuck / "run.json").read_text())
    assert record["status"] == "aborted" and record["reason"] == "finalized by the organiser: node lost"
    assert record["finalized"]["from_status"] == "running" and record["finalized"]["forced"] is False
    rows = {r["team"]: r for r in csv.DictReader((tmp_path / "leaderboard" / "local.csv").open())}
    assert rows["alpha"]["rank"] == "1" and rows["alpha"]["n_runs"] == "2"
    assert f"run {stuck.name} aborted (finalized by the organiser: node lost)" in rows["alpha"]["reason"]
    before = (stuck / "run.json").read_bytes()
    again = cli("finalize", stuck.name, "--runs-dir", str(runs), "--no-leaderboard")
    assert again.code == 2 and "already final (status aborted" in again.err
    assert (stuck / "run.json").read_bytes() == before


def test_finalize_refuses_a_run_whose_launcher_may_be_alive(tmp_path, cli):
    """On the record's host, a live process with its launcher's pid that started before the run is its launcher:
    refused, even stuck in evaluation. On another host nothing can be seen: refused unless --force. A pid that
    now belongs to a process started after the run is not the launcher: finalized."""
    runs, here = tmp_path / "runs", socket.gethostname()
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "harness", "run"])
    newcomer = subprocess.Popen(["sleep", "120"])  # started long after the record below: a reused pid
    try:
        live = make_run(runs, "alpha", None, status="evaluating", started_at=utc_now(), hostname=here,
                        launcher_pid=launcher.pid)
        elsewhere = make_run(runs, "bravo", None, status="running", hostname="node-that-was-lost.example",
                             launcher_pid=4242)
        reused = make_run(runs, "charlie", None, status="running", started_at="2026-11-29T11:00:00Z", hostname=here,
                          launcher_pid=newcomer.pid)
        before = {d: (d / "run.json").read_bytes() for d in (live, elsewhere)}
        refused = cli("finalize", live.name, "--runs-dir", str(runs), "--no-leaderboard")
        assert refused.code == 2 and f"process {launcher.pid} is alive and started before the run" in refused.err
        remote = cli("finalize", elsewhere.name, "--runs-dir", str(runs), "--no-leaderboard")
        assert remote.code == 2 and "node-that-was-lost.example" in remote.err and "--force" in remote.err
        assert {d: (d / "run.json").read_bytes() for d in (live, elsewhere)} == before  # nothing changed
        forced = cli("finalize", str(elsewhere), "--force", "--runs-dir", str(runs), "--no-leaderboard")
        assert forced.code == 0, forced.text
        record = json.loads((elsewhere / "run.json").read_text())
        assert record["status"] == "aborted" and record["finalized"]["forced"] is True
        assert record["reason"] == "finalized by the organiser: its launcher was gone and the record was left running"
        assert launcher.poll() is None  # finalize never touches a process
        done = cli("finalize", reused.name, "--runs-dir", str(runs), "--no-leaderboard")
        assert done.code == 0, done.text
        assert json.loads((reused / "run.json").read_text())["status"] == "aborted"
    finally:
        for proc in (launcher, newcomer):
            proc.kill()
            proc.wait()
