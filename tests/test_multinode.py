"""Several nodes on one machine: two launchers on 127.0.0.1, one rank each (torchrun semantics)."""

import pytest
import json
import os
import signal
import socket
import subprocess
import sys
import time

from conftest import FIXTURES, TINY_TRACK, processes_of_run
from test_run_e2e import REQUIRED

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(node_rank: int, port: int, run_id: str, tmp_path, cache_dir, *extra: str,
           submission=FIXTURES / "ok_bigram", track=TINY_TRACK) -> subprocess.Popen:
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs"),
           "OMP_NUM_THREADS": "1"}  # one rank per "node", two nodes on two cores
    return subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(submission), "--track", str(track),
         "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(node_rank),
         "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", run_id, *extra],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_two_nodes_give_the_same_kind_of_record_as_one(tmp_path, cache_dir):
    port = free_port()
    nodes = [launch(r, port, "two-nodes", tmp_path, cache_dir) for r in (1, 0)]
    outs = [p.communicate(timeout=180) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    run_dir = tmp_path / "runs" / "tiny" / "ok_bigram" / "two-nodes"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "ok", record["reason"]
    missing = [k for k in REQUIRED if k not in record or (record[k] is None and k != "reason")]
    assert not missing
    assert (record["world_size"], record["nnodes"], record["nproc_per_node"]) == (2, 2, 1)
    node1 = json.loads((run_dir / "nodes" / "node1.json").read_text())
    assert node1["status"] == "ok" and record["nodes"]["1"]["status"] == "ok"
    for log in ("rank0.log", "rank1.log", "launcher.log", "launcher-node1.log", "preflight-node1.log",
                "eval-launcher-node1.log", "eval-node1/eval-rank1.log"):
        assert (run_dir / "logs" / log).is_file(), log
    # Scored on both nodes' devices (issue 23, item 3): one scorer job over the two nodes' ranks.
    assert record["eval"]["eval_world_size"] == 2, record["eval"]
    assert json.loads((run_dir / "nodes" / "node1-eval.json").read_text())["status"] == "ok"
    assert "node report" in outs[0][0] and "record" in outs[1][0]  # the summaries, on stdout
    assert processes_of_run("two-nodes") == []


def _read(path) -> str:
    try:
        return path.read_text()  # a live link into the node's private folder while the job runs
    except OSError:
        return ""


def test_a_node_that_dies_ends_the_job_with_a_clear_record(tmp_path, cache_dir):
    port = free_port()
    node1 = launch(1, port, "lost-node", tmp_path, cache_dir, "--budget-s", "60")
    node0 = launch(0, port, "lost-node", tmp_path, cache_dir, "--budget-s", "60")
    run_dir = tmp_path / "runs" / "tiny" / "ok_bigram" / "lost-node"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "training starts" not in _read(run_dir / "logs" / "rank1.log"):
        time.sleep(0.2)
    time.sleep(3.0)  # both ranks training
    node1.send_signal(signal.SIGKILL)  # the whole node goes away: no chance to report
    killed = time.monotonic()
    node0.communicate(timeout=120)
    ended_s = time.monotonic() - killed
    node1.communicate(timeout=10)
    record = json.loads((run_dir / "run.json").read_text())
    # The infrastructure's failure (a queue runs it again), not the team's crash: node 1 gave no account.
    assert node0.returncode == 1 and record["status"] == "aborted", record["reason"]
    assert record["reason"].startswith("node(s) 1 lost: stopped its heartbeat and gave no account within"), \
        record["reason"]
    assert "rank(s) 1 stopped responding" in record["reason"]  # what node 0 saw
    assert ended_s < 30.0  # peer loss seen at once, node 1's account awaited until its heartbeat is silent (4 s)
    assert processes_of_run("lost-node") == []


def _freeze(proc: subprocess.Popen) -> list:
    """SIGSTOP a launcher and everything under it: nothing closes a socket, as when a node loses its power
    or its network (a killed process's sockets are closed by its kernel, and its peers learn at once)."""
    import psutil

    root = psutil.Process(proc.pid)
    frozen: dict[tuple[int, float], psutil.Process] = {}
    for _ in range(50):  # again until a look finds no process it has not stopped: one forked meanwhile is stopped too
        try:
            found = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        stopped_now = 0
        for p in found:
            try:
                key = (p.pid, p.create_time())
                if key not in frozen:
                    p.send_signal(signal.SIGSTOP)
                    frozen[key] = p
                    stopped_now += 1
            except psutil.NoSuchProcess:  # ended meanwhile
                continue
        if not stopped_now:
            break
    return list(frozen.values())


def _ident(p) -> tuple[int, float] | None:
    """A process's pid and start time (who it is, whatever reuses its pid later); None once it is gone."""
    import psutil

    try:
        return p.pid, p.create_time()
    except psutil.NoSuchProcess:
        return None


def _wait_dead(procs: list, within_s: float) -> list:
    """Waits until each process is dead (a zombie, or gone: as processes_of_run counts them) and returns those still
    alive after `within_s`. A pid reused meanwhile is not the process waited for (is_running checks its start time)."""
    import psutil

    def alive(p) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + within_s
    while any(alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in procs if alive(p)]


def test_a_node_that_goes_silent_is_lost_in_seconds_and_charged_to_the_infrastructure(tmp_path, cache_dir):
    """Node 1 frozen mid-training: node 0's rank would wait in a collective until its timeout (300 s at Paris);
    the heartbeat ends the job after half of it here (6 s of 12), and the record says the node was lost. On the
    old code: `crashed` at the collective timeout, charged to the team."""
    from conftest import tiny_track_with

    track = tiny_track_with(tmp_path, collective_timeout_s=12.0)
    port = free_port()
    node1 = launch(1, port, "silent-node", tmp_path, cache_dir, "--budget-s", "60", track=track)
    node0 = launch(0, port, "silent-node", tmp_path, cache_dir, "--budget-s", "60", track=track)
    run_dir = tmp_path / "runs" / "tiny" / "ok_bigram" / "silent-node"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "training starts" not in _read(run_dir / "logs" / "rank1.log"):
        time.sleep(0.2)
    time.sleep(3.0)  # both ranks training
    frozen = _freeze(node1)
    frozen_ids = {_ident(p) for p in frozen}
    stopped = time.monotonic()
    try:
        node0.communicate(timeout=120)
        ended_s = time.monotonic() - stopped
        # What node 0 left, looked for while node 1's processes are still frozen and told apart by pid and start
        # time: a node-0 process still ending after its launcher exited is a leftover, however soon it dies.
        left_by_node0 = [p for p in processes_of_run("silent-node") if _ident(p) not in frozen_ids | {None}]
    finally:
        for p in frozen:
            try:
                p.send_signal(signal.SIGKILL)
            except Exception:  # noqa: BLE001  (gone already)
                pass
        node1.communicate(timeout=30)
        # The test's own kill (node 1's power cut) ends each process once it is scheduled, frees its memory and is
        # reaped; the job's PID 1 only once every process of its namespace is. The look below, after it, is for
        # what the harness left (once seen without this wait: a frozen rank alive at the look, a zombie just after).
        not_ended = _wait_dead(frozen, within_s=30.0)
    record = json.loads((run_dir / "run.json").read_text())
    assert node0.returncode == 1 and record["status"] == "aborted", record["reason"]
    assert record["reason"].startswith("node(s) 1 lost: stopped its heartbeat and gave no account"), record["reason"]
    assert record["lost_nodes"] == [1]
    assert ended_s < 12.0 + 8.0 + 4.0  # heartbeat (6 s and a beat) + 8 s for an account + teardown, < timeout's path
    assert left_by_node0 == []
    assert not_ended == [], "the test's own SIGKILL of node 1 had not ended these 30 s later"
    assert processes_of_run("silent-node") == []


def test_several_nodes_need_a_shared_run_id(cli):
    result = cli("run", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK), "--nnodes", "2",
                 "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29999")
    assert result.code == 2 and "--run-id" in result.err


def test_nodes_with_different_submissions_never_train(tmp_path, cache_dir):
    """Node 1's launcher was given another version of the submission (same team, one line changed):
    the ranks compare fingerprints before any submission code runs, and the run is invalid."""
    import shutil

    other = tmp_path / "elsewhere" / "ok_bigram"
    shutil.copytree(FIXTURES / "ok_bigram", other)
    (other / "submission.py").write_text((other / "submission.py").read_text() + "\n# edited on node 1\n")
    port = free_port()
    nodes = [launch(1, port, "disagree", tmp_path, cache_dir, submission=other), launch(0, port, "disagree", tmp_path, cache_dir)]
    outs = [p.communicate(timeout=180) for p in nodes]
    record = json.loads((tmp_path / "runs" / "tiny" / "ok_bigram" / "disagree" / "run.json").read_text())
    assert nodes[1].returncode == 1 and record["status"] == "invalid", outs
    assert "the nodes disagree before training: submission" in record["reason"]
    assert record["steps"] is None and record["val_loss"] is None
    assert processes_of_run("disagree") == []


def test_a_check_that_refuses_on_one_node_only_ends_the_run_invalid_on_every_node(tmp_path, cache_dir):
    """Each node checks the submission, and the check can tell which node it runs on (here: by its file's path).
    Refused on node 1 alone, node 1's ranks are told stop and node 0's wait for them in the process group: node 0
    ends the run on node 1's account, with its status (`invalid`, the team's) and its reason, not at the start-up
    timeout as a rendezvous that failed (`aborted`: a re-run the team would have chosen)."""
    import shutil

    folder = tmp_path / "two_faced"
    shutil.copytree(FIXTURES / "ok_bigram", folder)
    source = (folder / "submission.py").read_text()
    (folder / "submission.py").write_text(
        'if "node1" in __file__:\n    raise RuntimeError("refused on node 1 only")\n' + source)
    port = free_port()
    started = time.monotonic()
    nodes = [launch(1, port, "two-faced", tmp_path, cache_dir, submission=folder),
             launch(0, port, "two-faced", tmp_path, cache_dir, submission=folder)]
    outs = [p.communicate(timeout=240) for p in nodes]
    took_s = time.monotonic() - started
    run_dir = tmp_path / "runs" / "tiny" / "two_faced" / "two-faced"
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "invalid", (record["reason"], outs)
    assert record["reason"].startswith("node 1 ended its run before training: invalid: ") \
        and "refused on node 1 only" in record["reason"], record["reason"]
    assert json.loads((run_dir / "nodes" / "node1.json").read_text())["status"] == "invalid"
    assert "RuntimeError: refused on node 1 only" in (record["traceback"] or ""), record["traceback"]  # node 1's
    assert record["steps"] is None and record["val_loss"] is None
    assert processes_of_run("two-faced") == []
    assert took_s < 150, took_s  # not the start-up timeout's 600 s at Paris: minutes here only under heavy load


def test_a_node_that_never_joins_is_the_infrastructures_failure_not_the_teams(cli, tmp_path):
    """Node 0 alone of two: no rank starts (the rendezvous never completes), so no team code ever ran, not even the
    check, which waits for the ranks (harness/launcher/run/check_phase.py). It ends `aborted` (a queue runs it
    again), never the team's `timeout` nor `invalid`."""
    from conftest import tiny_track_with

    # The missing node is waited for the rendezvous timeout (tiny's: 30 s of an idle test worker): 5 s here, as what is
    # tested is the record the wait ends with, whatever its length.
    track = tiny_track_with(tmp_path, startup_timeout_s=6.0, rendezvous_timeout_s=5.0)
    result = cli("run", str(FIXTURES / "ok_bigram"), "--track", str(track), "--nnodes", "2", "--node-rank", "0",
                 "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--run-id", "alone")
    assert result.code == 1, result.text
    record = json.loads((tmp_path / "runs" / "tiny" / "ok_bigram" / "alone" / "run.json").read_text())
    assert record["status"] == "aborted", record["reason"]
    # what torch elastic said of it comes after, for the organiser who reads why
    assert record["reason"].startswith("this node's ranks did not all start (a node that never joined the "
                                       "rendezvous?)") and record["reason"].endswith("; no team code ran")
    assert "launch failed: " in record["reason"], record["reason"]  # torch elastic's own words, for the organiser
    assert processes_of_run("alone") == []


def test_an_open_division_node_that_never_joins_is_the_infrastructures_failure_too(cli, tmp_path):
    """An open-division script starts once its check has passed (no ranks beside the check): node 0 alone of two
    never gets a rank through the process group, and its start-up timeout ends the run `aborted`."""
    import shutil

    from conftest import tiny_track_with

    folder = tmp_path / "open_alone"
    shutil.copytree(FIXTURES / "open_modes", folder)
    (folder / "submission.toml").write_text('division = "open"\n[team]\nname = "open-alone"\n[open]\n\n'
                                           '[open.args]\nmode = "honest"\nbatch_size = 4\nseq_len = 32\n')
    track = tiny_track_with(tmp_path, startup_timeout_s=6.0)
    result = cli("run", str(folder), "--track", str(track), "--nnodes", "2", "--node-rank", "0",
                 "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--run-id", "open-alone")
    assert result.code == 1, result.text
    record = json.loads((tmp_path / "runs" / "tiny" / "open-alone" / "open-alone" / "run.json").read_text())
    assert record["status"] == "aborted" and record["reason"].endswith(
        " (no rank got through the process group: a node that never joined?)"), record["reason"]
    assert processes_of_run("open-alone") == []


def test_node_0_evaluates_alone_when_a_node_does_not_answer_and_with_every_node_when_all_do(tmp_path):
    import threading

    from harness.launcher.run.evaluation import EvalPlan, join, offer, remote_failure, save_account
    from harness.launcher.run.nodes import NodePaths

    plan = EvalPlan(checkpoint_sha256="ab" * 32, nproc=1, precision="float32", vocab_out=256, model_file="submission.py")
    lone = tmp_path / "lone"
    assert offer(NodePaths(lone, 0), plan, nnodes=2, within_s=0.5) == 1
    assert join(NodePaths(lone, 1), deadline_s=2.0) is None  # too late: node 0 went on alone, and said so

    both = tmp_path / "both"
    joined = []
    thread = threading.Thread(target=lambda: joined.append(join(NodePaths(both, 1), deadline_s=10.0)))
    thread.start()
    assert offer(NodePaths(both, 0), plan, nnodes=2, within_s=10.0) == 2
    thread.join()
    assert joined == [plan]

    class Ev:  # what save_account reads of a phase's result
        outcome = type("O", (), {"status": "crashed", "reason": "rank 1: the model process died", "cause": "own",
                                 "failing_rank": 1, "traceback": None})()

        def reports(self, kind):
            return {}

    save_account(NodePaths(both, 1), Ev(), False, "")
    found = remote_failure(NodePaths(both, 0), 2, within_s=1.0)
    assert (found["node_rank"], found["status"], found["reason"]) == (1, "crashed", "rank 1: the model process died")


def test_a_node_waiting_to_evaluate_stops_when_node_0s_run_ends_without_evaluating(tmp_path):
    from harness.launcher.run.evaluation import join
    from harness.launcher.run.nodes import NodePaths

    (tmp_path / "run.json").write_text(json.dumps({"status": "crashed"}))
    t0 = time.monotonic()
    assert join(NodePaths(tmp_path, 1), deadline_s=30.0) is None and time.monotonic() - t0 < 5.0
