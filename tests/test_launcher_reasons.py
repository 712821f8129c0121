"""Reasons of the launcher, its ranks and its scorers that no test stated before issue 31, each triggered where
it is built (the watchdog, the outcome, node 0's merge, the caps, the checkpoint's taking, the queue, the
scorer's protocol) and stated; the reasons that only a real run gives are in tests/test_reason_runs.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import FIXTURES, ROOT, TINY_TRACK
from harness.launcher.control.channel import Message
from harness.launcher.control.watch import Deadlines, WatchResult, _expired, watch
from harness.launcher.control.workarea import WorkArea
from harness.launcher.run.outcome import Outcome, classify
from harness.results.records import RunRecord
from harness.tracks.spec import load_track


@pytest.fixture
def area(tmp_path):
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "submission.py").write_text("CONFIG = {}\n")
    made = WorkArea(snapshot)
    yield made
    made.cleanup()


# ----------------------------------------------------------------------------- the watchdog


def test_an_open_division_script_killed_while_it_still_trained_is_asked_whether_it_stops():
    d = Deadlines(startup_timeout_s=60.0, total_after_setup_s=27.0)
    training = WatchResult(setup_start_s=100.0, progress_s=102.0)  # progress, and no end of training reported
    reason, at = _expired(training, d, launched=99.0, now=127.1)
    assert at == 127.0
    assert reason == ("killed at the hard limit: 27.0 s (start-up allowance + budget + grace) after the ranks "
                      "started (it was still training: does it stop at --time_limit_min?)")


def test_a_checkpoint_not_saved_within_the_allowance_after_training_ends_the_job():
    d = Deadlines(startup_timeout_s=60.0, hard_limit_s=7.0, save_allowance_s=20.0, checkpoint_allowance_s=10.0)
    ended = WatchResult(setup_start_s=5.0, train_start_s=10.0, train_end_s=15.0)  # and no checkpoint_saved
    assert _expired(ended, d, launched=0.0, now=24.9) is None
    reason, at = _expired(ended, d, launched=0.0, now=25.1)
    assert at == 25.0 and reason == (
        "rank 0 did not save its checkpoint within 10 s of the end of training (the checkpoint allowance: the "
        "weights must leave as training left them, not trained on)")
    saved = WatchResult(setup_start_s=5.0, train_start_s=10.0, train_end_s=15.0, checkpoint_saved_s=16.0)
    assert _expired(saved, d, launched=0.0, now=25.1) is None
    assert _expired(ended, d, launched=0.0, now=25.1, lead=False) is None  # only node 0 hosts rank 0


class _Job:
    """The watchdog's view of a job (ElasticJob's running() and kill()): one that runs until it is killed."""

    def __init__(self):
        self.killed = False

    def running(self) -> bool:
        return not self.killed

    def kill(self) -> list[int]:
        self.killed = True
        return []


class _DeafChannel:
    """The watchdog's view of a control channel (ChannelServer's wait, first, alive, violation) whose listening
    thread has ended: nothing the ranks say reaches the launcher any more."""

    alive, violation = False, None

    def wait(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def first(self, kind: str, rank: int = 0):
        return None


def test_a_control_channel_that_stopped_listening_ends_the_job_as_the_harnesss_error():
    job = _Job()
    result = watch(job, _DeafChannel(), Deadlines(startup_timeout_s=60.0, hard_limit_s=7.0),
                   SimpleNamespace(is_set=False))
    assert job.killed
    assert (result.kill_status, result.kill_reason) == ("crashed",
                                                        "harness error: the control channel stopped listening")


class _QuietChannel(_DeafChannel):
    alive = True  # listening, and nothing said


def test_a_signal_to_the_launcher_ends_the_job_aborted_naming_it():
    from harness.launcher.control.watch import AbortFlag

    abort, job = AbortFlag(), _Job()
    abort.set("SIGTERM")
    result = watch(job, _QuietChannel(), Deadlines(startup_timeout_s=60.0, hard_limit_s=7.0), abort)
    assert job.killed and (result.kill_status, result.kill_reason) == ("aborted", "stopped by SIGTERM")


# ----------------------------------------------------------------------------- how a job ended


def test_an_agent_that_failed_on_its_own_is_a_launch_failure_run_again():
    o = classify([], world_size=2, done_kind="result", agent_succeeded=False, agent_failures={},
                 agent_error="RendezvousTimeoutError: node 1 never joined", kill_status=None, kill_reason="")
    assert (o.status, o.reason, o.cause) == ("aborted", "launch failed: RendezvousTimeoutError: node 1 never joined",
                                             "launch")


# ----------------------------------------------------------------------------- node 0's merge of the nodes' accounts


class _Heartbeat:
    """Node 0's heartbeat as merge_node_reports asks it: whether the nodes that gave no account still beat."""

    def __init__(self, silent: bool):
        self.quiet = silent

    def silent(self, ranks):
        return list(ranks) if self.quiet else []


def _merged(tmp_path, monkeypatch, silent: bool) -> RunRecord:
    from harness.launcher.run import nodes

    monkeypatch.setattr(nodes, "WAIT_FOR_NODES_S", 0.2)
    (tmp_path / "nodes").mkdir()
    record = RunRecord(run_id="r", team="t", track_name="tiny", status="crashed")
    echo = Outcome("crashed", "rank 0: a peer stopped responding in a collective", 0, cause="collective")
    nodes.merge_node_reports(record, nodes.NodePaths(tmp_path, 0), echo, 2, silent_after_s=0.5,
                             heartbeat=_Heartbeat(silent))
    return record


def test_a_node_gone_silent_without_an_account_is_lost_the_infrastructures(tmp_path, monkeypatch):
    record = _merged(tmp_path, monkeypatch, silent=True)
    assert record.status == "aborted"
    assert record.reason == ("node(s) 1 lost: stopped its heartbeat and gave no account within 0 s (the "
                             "infrastructure's failure, not the team's: run it again); node 0 saw: rank 0: a peer "
                             "stopped responding in a collective")


def test_a_node_that_still_beats_without_an_account_leaves_the_run_as_node_0_saw_it(tmp_path, monkeypatch):
    record = _merged(tmp_path, monkeypatch, silent=False)
    assert record.status == "crashed"
    assert record.reason == ("node(s) 1 still beat but gave no account within 0 s; node 0 saw: rank 0: a peer "
                             "stopped responding in a collective")


# ----------------------------------------------------------------------------- evaluation's verdict


def test_a_model_that_looks_ahead_is_invalid_with_where_it_did():
    from harness.launcher.run.evaluation import apply_evaluation
    from harness.launcher.run.phases import PhaseResult

    causality = {"verdict": "non-causal", "causal": False, "checked_batches": 3, "batches": 8,
                 "worst_deviation": 2.5, "tolerance": 1e-3,
                 "worst_at": {"batch": 1, "row": 2, "position": 40, "cut": 30}}
    ev = PhaseResult(Outcome("ok", cause="ok"), WatchResult(),
                     [Message("eval_result", {"rank": 0, "val_loss": 1.2, "causality": causality}, 1.0)])
    record = RunRecord(run_id="r", team="t", track_name="tiny", status="evaluating")
    apply_evaluation(record, ev)
    assert record.status == "invalid" and record.val_loss is None
    assert record.reason == (
        "non-causal: 3 of 8 scoring batches were run again with every row's tokens after a secret cut replaced, and "
        "the log-probabilities before the cut changed by up to 2.5 nats (batch 1, row 2, position 40, cut after 30), "
        "more than the 0.001 an honest model shows: the model used tokens after the position it predicts")


# ----------------------------------------------------------------------------- the caps and the checkpoint's taking


def test_a_checkpoint_past_the_cap_is_not_taken_and_ends_the_job(area, tmp_path):
    from harness.launcher.run.takeback import CheckpointTaker

    (area.staging / "checkpoint.pt").write_bytes(b"w" * 4096)
    taker = CheckpointTaker(area, tmp_path / "checkpoint.pt", max_bytes=1024)
    watched = WatchResult(train_end_s=1.0, checkpoint_saved_s=2.0)  # rank 0 said it is saved
    taker.poll(watched)
    taker.wait()
    taker.poll(watched)
    assert not (tmp_path / "checkpoint.pt").exists() and taker.too_large == 4096
    assert watched.violation == "the checkpoint is 0.00 GiB, past the track's cap of 0.00 GiB (checkpoint_cap_gib)"


def test_a_private_folder_with_more_entries_than_the_cap_ends_the_job(area, monkeypatch):
    from harness.launcher.run import takeback

    monkeypatch.setattr(takeback, "MAX_ENTRIES", 5)
    for i in range(10):
        (area.dir / f"empty{i}").touch()  # empty files fill a file system's inodes too
    assert takeback.ScratchCaps(area, load_track(str(TINY_TRACK))).measure() == (
        "the ranks' private folder holds more than 5 files and folders")


def test_a_private_folder_that_cannot_be_measured_again_and_again_ends_the_job():
    from harness.launcher.run.takeback import MAX_FAILED_MEASURES, ScratchCaps

    class Failing:  # a private folder whose walk fails every time (the disk under it, say)
        def usage(self, max_entries):
            raise OSError(5, "Input/output error")

    with ScratchCaps(Failing(), load_track(str(TINY_TRACK)), every_s=0.01) as caps:
        deadline = time.monotonic() + 10
        while caps.violation is None and time.monotonic() < deadline:
            time.sleep(0.01)
    assert caps.violation == (f"the ranks' private folder could not be measured {MAX_FAILED_MEASURES} times in a "
                              "row (OSError: [Errno 5] Input/output error): its caps cannot hold")


UNLISTABLE = """
import os, sys
from types import SimpleNamespace
from pathlib import Path
from harness.launcher.control.workarea import WorkArea
from harness.launcher.run.takeback import ScratchCaps
snapshot = Path(sys.argv[1])
snapshot.mkdir()
area = WorkArea(snapshot)
os.mkdir(area.dir / "hidden", 0o300)  # its own rights taken away: nobody can list it, its owner included
print(ScratchCaps(area, SimpleNamespace(log_cap_mib=8, scratch_cap_gib=0.25)).measure())
os.chmod(area.dir / "hidden", 0o700)
area.cleanup()
"""


def test_a_folder_the_launcher_cannot_list_ends_the_job():
    """Run as a user that is not root (root lists any folder), under /tmp where that user may reach (pytest's
    folders are root's alone)."""
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="harness-test-unlistable-"))
    os.chmod(base, 0o777)
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HARNESS_SCRATCH_DIR": str(base)}
    try:
        out = subprocess.run([*as_nobody, sys.executable, "-c", UNLISTABLE, str(base / "snapshot")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("the ranks' private folder holds a folder the harness cannot list (hidden: "
                                  "Permission denied): what it holds is not under the track's caps (leave every "
                                  "folder readable)")


def test_a_scratch_root_too_small_for_a_run_aborts_it_with_the_figures_and_the_fix(tmp_path):
    from harness.ranks.confine.scratch import SCRATCH_ENV, short_of_space

    said = short_of_space(1 << 62, root=tmp_path, why="the checkpoint and 1 GiB more")
    assert said.startswith(f"the scratch folder {tmp_path} has ")
    assert (" GiB free, and a run needs 4294967296.00 GiB there (the checkpoint and 1 GiB more): the "
            "infrastructure's failure, not the team's. Fix: free space there, or set "
            f"{SCRATCH_ENV} to a folder with room; then run it again") in said


def test_a_scratch_root_out_of_inodes_aborts_the_run(tmp_path, monkeypatch):
    from harness.ranks.confine import scratch

    monkeypatch.setattr(scratch, "MIN_FREE_INODES", 1 << 62)  # more than any file system has left
    said = scratch.short_of_space(0, root=tmp_path)
    assert said.startswith(f"the scratch folder {tmp_path} has ") and said.endswith(
        " free inodes (files) left, and a run makes thousands: the infrastructure's failure, not the team's. Fix: "
        f"remove what fills it, or set {scratch.SCRATCH_ENV} to another file system; then run it again")


def test_a_scratch_root_that_cannot_be_measured_is_said(tmp_path):
    from harness.ranks.confine.scratch import short_of_space

    assert short_of_space(1, root=tmp_path / "gone") == (
        f"the scratch folder {tmp_path / 'gone'} cannot be measured ([Errno 2] No such file or directory: "
        f"'{tmp_path / 'gone'}')")


# ----------------------------------------------------------------------------- the queue


def test_a_resumed_queue_closes_a_dead_launchers_record_as_the_infrastructures(tmp_path):
    from records_factory import make_run
    from harness.launcher.event.queue import Queue, build_queue, pending
    from harness.results.locks import RUN_LOCK

    team = tmp_path / "submissions" / "alpha"
    shutil.copytree(FIXTURES / "ok_bigram", team)
    (entry,) = build_queue([str(team)], seed=1, repeat=1)
    runs = tmp_path / "runs"
    lost = make_run(runs, "alpha", None, sha=entry.sha256, status="running", hostname=socket.gethostname())
    (lost / RUN_LOCK).touch()  # a launcher held it, and is gone
    assert pending(Queue([entry], runs / "local", {})) == [entry]
    record = json.loads((lost / "run.json").read_text())
    assert (record["status"], record["reason"]) == ("aborted", (
        "finalized by the queue (`harness run --resume`): its launcher died before the run finished: the "
        "infrastructure's failure, not the team's; run again"))


# ----------------------------------------------------------------------------- the open division's checkpoint


def _finish(area, tmp_path) -> tuple[bool, RunRecord]:
    from harness.launcher.run.open_run import finish_open_training

    record = RunRecord(run_id="r", team="t", track_name="tiny", status="ok", division="open")
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    checkpoint.parent.mkdir()
    # Both end before the model check (no snapshot, spec or track is read).
    done = finish_open_training(record, None, None, None, area, checkpoint, tmp_path / "check-after.log", 1, [])
    return done, record


def test_a_link_left_at_checkpoint_path_is_never_followed(area, tmp_path):
    (tmp_path / "elsewhere.pt").write_bytes(b"the validation shard, say")
    (area.staging / "checkpoint.pt").symlink_to(tmp_path / "elsewhere.pt")
    done, record = _finish(area, tmp_path)
    assert not done and (record.status, record.reason) == ("invalid", (
        "the file at --checkpoint_path is not a regular file (a link?); save the checkpoint itself there"))


def test_a_checkpoint_that_unpacks_far_beyond_its_size_is_refused_before_any_process_reads_it(area, tmp_path):
    with zipfile.ZipFile(area.staging / "checkpoint.pt", "w", compression=zipfile.ZIP_DEFLATED) as bomb:
        bomb.writestr("archive/data/0", b"\0" * (8 << 20))
    done, record = _finish(area, tmp_path)
    assert not done and record.status == "invalid"
    assert not (tmp_path / "run" / "team-checkpoint.pt").exists()  # what was taken is removed, refused unread
    assert record.reason.startswith(f"the checkpoint rank 0 saved at --checkpoint_path: the file unpacks to {8 << 20} "
                                    "bytes from ")
    assert record.reason.endswith(": torch.save writes uncompressed entries, save the checkpoint with torch.save")


def test_a_checkpoint_that_takes_too_long_to_read_is_refused(tmp_path, monkeypatch):
    from harness.launcher.run import open_run

    monkeypatch.setattr(open_run, "NORMALIZE_TIMEOUT_S", 0.01)  # the reader imports torch first: never in time
    (tmp_path / "team.pt").write_bytes(b"not read in time")
    found = open_run.normalize_in_own_process(tmp_path / "team.pt", tmp_path / "out.pt", tmp_path / "read.log")
    assert found == {"error": "reading the checkpoint took more than 0 s"}


# ----------------------------------------------------------------------------- a rank's reports


def test_a_report_too_large_for_the_channel_is_sent_as_the_ranks_error(tmp_path):
    from harness.ranks.channel import FRAME, ChannelClient

    path = str(tmp_path / "c.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    client = ChannelClient(path, rank=0)
    conn, _ = server.accept()
    try:
        client.send("result", config={f"key{i}": "v" * 100 for i in range(1000)})  # a CONFIG of 100 kB
        assert client.flush()
        conn.settimeout(10)
        (size,) = FRAME.unpack(conn.recv(FRAME.size))
        data = b""
        while len(data) < size:
            data += conn.recv(size - len(data))
    finally:
        client.close()
        conn.close()
        server.close()
    report = json.loads(data)
    assert (report["kind"], report["status"]) == ("error", "crashed")
    assert report["reason"].startswith("the result report was too large to send (")
    assert report["reason"].endswith(" bytes: a CONFIG this large?)")


# ----------------------------------------------------------------------------- the scorer and its model processes


def test_a_model_process_whose_error_report_is_unreadable_is_a_crash():
    from harness.ranks.models.wire import ERROR, send
    from harness.scoring.workers import ModelWorker, WorkerFailed

    worker = object.__new__(ModelWorker)
    worker.replies, w = os.pipe()
    try:
        send(w, ERROR, payload=b"\xff not json")
        with pytest.raises(WorkerFailed) as caught:
            worker.wait_ready()
    finally:
        os.close(worker.replies)
        os.close(w)
    assert (caught.value.harness_status, str(caught.value)) == ("crashed",
                                                                 "the model process sent an unreadable error report")


def test_a_model_process_whose_pid_never_came_ends_the_evaluation():
    """A model process forked by a copy of the template is ended by its pid; a copy that is gone before it said
    the pid leaves a process nobody can end, so the evaluation ends there."""
    import mmap
    import tempfile

    from harness.scoring.template import ForkedProcess, _Channel
    from harness.scoring.workers import ModelWorker, WorkerFailed

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()  # the template's copy is gone
    worker = object.__new__(ModelWorker)
    worker._closed, worker._template, worker.proc = False, SimpleNamespace(family=set), ForkedProcess(_Channel(ours))
    worker.requests, worker.replies = os.pipe()
    worker.buffer, worker.buffer_fd = mmap.mmap(-1, 4096), os.open(os.devnull, os.O_RDONLY)
    worker.dir = Path(tempfile.mkdtemp(prefix="harness-test-worker-"))
    with pytest.raises(WorkerFailed) as caught:
        worker.close()
    assert (caught.value.harness_status, str(caught.value)) == ("crashed", (
        "a model process's pid never came from the template, so it could not be ended; see the scorer's log"))
    assert not worker.dir.exists()


def test_a_template_copy_that_fails_its_protocol_breaks_its_channel_for_good():
    """The scorer's socket to one copy of the model-process template: whatever goes wrong is said, and the channel
    is broken for good (a late reply is never taken for the answer to a later question)."""
    from harness.scoring.template import _Channel
    from harness.scoring.workers import WorkerFailed

    def said(ask) -> str:
        with pytest.raises(WorkerFailed) as caught:
            ask()
        assert caught.value.harness_status == "crashed"
        return str(caught.value)

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    channel = _Channel(ours)
    theirs.send(json.dumps({"error": "refused: 'exec' with 0 descriptors"}).encode())
    assert said(lambda: channel.reply(5.0)) == ("the model-process template refused a request: refused: 'exec' with "
                                                "0 descriptors")
    assert said(lambda: channel.reply(5.0)) == said(lambda: channel.send({"op": "fork"}))  # broken for good
    theirs.close()

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    assert said(lambda: _Channel(ours).reply(0.05)) == "the model-process template did not answer (timed out); see " \
                                                        "the scorer's log"
    theirs.close()

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()  # the copy is gone
    assert said(lambda: _Channel(ours).reply(5.0)) == "the model-process template is gone; see the scorer's log"

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.close()
    assert said(lambda: _Channel(ours).send({"op": "fork"})) == ("the model-process template took no request "
                                                                 "([Errno 32] Broken pipe)")


def test_a_template_with_no_copy_left_forks_nothing():
    from harness.scoring.template import ModelTemplate
    from harness.scoring.workers import WorkerFailed

    template = object.__new__(ModelTemplate)
    template._channels = []  # each copy serves one model process: both roles have had theirs
    with pytest.raises(WorkerFailed) as caught:
        template.fork(log_fd=-1, fds=(-1, -1, -1), logits_bytes=0, cwd=Path("."), env={})
    assert str(caught.value) == "the model-process template has no copy left"


# ----------------------------------------------------------------------------- slow: processes that import torch


@pytest.mark.slow
def test_a_reader_of_the_checkpoint_that_dies_is_said_with_its_log(tmp_path):
    import torch

    from harness.launcher.run.open_run import normalize_in_own_process

    torch.save({"model": {"w": torch.zeros(2)}, "config": {}}, tmp_path / "team.pt")
    # Where the reader writes the harness's form cannot be written: it dies on its OSError, with no verdict.
    found = normalize_in_own_process(tmp_path / "team.pt", tmp_path / "missing" / "out.pt", tmp_path / "read.log")
    assert found == {"error": f"the process that reads the checkpoint died (exit code 1); see {tmp_path / 'read.log'}"}
    assert "Traceback" in (tmp_path / "read.log").read_text()


@pytest.mark.slow
def test_a_check_that_takes_longer_than_its_limit_is_ended_and_said(tmp_path):
    from harness.launcher.run.check_process import run_preflight

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "submission.py").write_text("import time\ntime.sleep(600)\n")
    report = run_preflight(tmp_path / "sub", vocab_size=64, device="cpu", seed=1, log_path=tmp_path / "check.log",
                           precision="float32", timeout_s=3.0)
    assert not report["ok"]
    assert [p["problem"] for p in report["problems"]] == [
        "checking the submission took more than 3 s (model build and one tiny step)"]


@pytest.mark.slow
def test_a_check_that_outlives_its_kill_does_not_hold_the_launcher(tmp_path, monkeypatch):
    """A process stuck in the kernel (a driver, a file system) does not die of SIGKILL yet: the launcher waits a
    bounded time for it and goes on with the check's reason, the cgroup's end left to do the rest."""
    from harness.launcher.run import check_process

    monkeypatch.setattr(check_process, "CLOSE_WAIT_S", 0.5)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "submission.py").write_text("import time\ntime.sleep(600)\n")
    check = check_process.CheckProcess(tmp_path / "sub", vocab_size=64, device="cpu", seed=1, precision="float32",
                                       log_path=tmp_path / "check.log", timeout_s=3.0)
    proc, real_wait, real_kill, killed = check.proc, check.proc.wait, check.proc.kill, []

    def stuck_wait(timeout=None):
        if not killed:
            return real_wait(timeout=timeout)
        assert timeout is not None, "the launcher waited without a bound for a process that may never end"
        raise subprocess.TimeoutExpired(proc.args, timeout)

    proc.kill, proc.wait = (lambda: killed.append(True)), stuck_wait  # SIGKILL not taken yet, as in the kernel
    try:
        report = check.finish()
    finally:
        real_kill()  # the cgroup's end killed it already, where there is one
        real_wait(timeout=60)
    assert killed and not report["ok"]
    assert [p["problem"] for p in report["problems"]] == [
        "checking the submission took more than 3 s (model build and one tiny step)"]


@pytest.mark.slow
def test_a_check_process_that_dies_before_reporting_is_said(tmp_path):
    from harness.launcher.run.check_process import run_preflight

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "submission.py").write_text("import os\nos._exit(3)\n")
    report = run_preflight(tmp_path / "sub", vocab_size=64, device="cpu", seed=1, log_path=tmp_path / "check.log",
                           precision="float32")
    assert not report["ok"]
    (problem,) = report["problems"]
    assert problem["problem"] == f"the check process died (exit code 3) before reporting; see {tmp_path / 'check.log'}"


MEDDLING_MODEL = """
import json

import torch.nn as nn

try:  # the check process's request, in its folder: after training it names the checkpoint the process may read
    with open("request.json") as fh:
        checkpoint = json.load(fh).get("checkpoint")
except OSError:
    checkpoint = None
if checkpoint:
    with open(checkpoint, "ab") as fh:  # refused inside the sandbox (read only); here the track turns it off
        fh.write(b"more")


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets=None):
        return self.table(idx), None


def get_model(config):
    return Bigram(config["vocab_size"])
"""


@pytest.mark.slow
def test_a_checkpoint_changed_while_its_model_is_checked_is_never_scored(tmp_path):
    """The open division's model check runs model.py beside the checkpoint it may only read; on a track without the
    sandbox it could write it. A checkpoint that is not the one normalised and hashed is invalid, and flagged."""
    import torch

    from harness.launcher.run.open_run import finish_open_training
    from harness.submission.open_division import read_open_spec

    snapshot = tmp_path / "submission"
    snapshot.mkdir()
    (snapshot / "train.py").write_text("")
    (snapshot / "model.py").write_text(MEDDLING_MODEL)
    (snapshot / "submission.toml").write_text('division = "open"\n')
    track_file = tmp_path / "tiny.toml"
    track_file.write_text(TINY_TRACK.read_text().replace('name = "tiny"\n', 'name = "tiny"\nsandbox = "off"\n', 1))
    track = load_track(str(track_file))
    area = WorkArea(snapshot)
    try:
        torch.save({"model": {"table.weight": torch.zeros(256, 256)}, "config": {"vocab_size": 256}, "step": 3},
                   area.staging / "checkpoint.pt")
        record = RunRecord(run_id="r", team="t", track_name="tiny", status="ok", division="open", precision="float32")
        (tmp_path / "run").mkdir()
        done = finish_open_training(record, snapshot, read_open_spec(snapshot), track, area,
                                    tmp_path / "run" / "checkpoint.pt", tmp_path / "run" / "check-after.log", 1, [])
    finally:
        area.cleanup()
    assert not done
    assert (record.status, record.reason) == ("invalid", "the checkpoint changed while its model was checked")
    assert record.flagged and record.flag_reason == record.reason


def test_an_infiniband_registration_refused_is_not_out_of_memory_and_a_limited_node_is_refused_before_team_code():
    """NCCL's "Call to ibv_reg_mr failed with error Cannot allocate memory" is the node's locked-memory limit, not
    the model's size: the rank names it so (never "out of memory"), and the run stays `crashed`, since a team can
    write that text. The machine's part is decided before any team code: a GPU track on several nodes refuses a
    node whose launcher has a finite `ulimit -l` (its ranks inherit it); one node or a CPU track needs none."""
    from types import SimpleNamespace as Track

    from harness.launcher.run.runner import memlock_refusal
    from harness.ranks.process import describe_failure

    exc = RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, NCCL version 2.21.5\n"
                       "ncclSystemError: Last error:\nCall to ibv_reg_mr failed with error Cannot allocate memory")
    report = describe_failure(exc, device="cuda")
    assert report["cause"] == "memlock" and "NCCL could not register memory with InfiniBand" in report["reason"]
    assert "the node's locked-memory limit (ulimit -l), not the model's size" in report["reason"]
    assert "out of memory" not in report["reason"] and report["status"] == "crashed"
    msg = Message("error", {"rank": 0, **report}, 1.0)
    outcome = classify([msg], world_size=1, done_kind="result", agent_succeeded=False, agent_failures={},
                       agent_error=None, kill_status=None, kill_reason="", local_ranks=[0])
    assert (outcome.status, outcome.cause) == ("crashed", "memlock")
    said = memlock_refusal(Track(device="cuda", nnodes=4), 64 << 20)
    assert said.startswith("this node limits locked memory to 64 MiB") and "ulimit -l unlimited" in said
    assert memlock_refusal(Track(device="cuda", nnodes=4), None) == ""
    assert memlock_refusal(Track(device="cuda", nnodes=1), 64 << 20) == ""
    assert memlock_refusal(Track(device="cpu", nnodes=4), 64 << 20) == ""


def test_caps_are_measured_once_more_after_the_job_and_a_measure_that_fails_then_ends_the_run(tmp_path):
    """A burst written after the caps' last look during the job counts: the caps are measured when the job is over;
    a folder that cannot be measured then is a cap that cannot hold, not a run that passed."""
    from harness.launcher.run.takeback import ScratchCaps

    area = WorkArea(tmp_path)
    try:
        track = SimpleNamespace(log_cap_mib=8, scratch_cap_gib=0.25)
        with ScratchCaps(area, track, every_s=3600.0) as caps:  # no look during the job
            with open(area.logs / "rank0.log", "wb") as fh:
                fh.truncate(9 << 20)
        assert caps.violation and "more than 8 MiB to their logs" in caps.violation
        (area.logs / "rank0.log").unlink()
        caps = ScratchCaps(area, track, every_s=3600.0)
        caps.measure = lambda: (_ for _ in ()).throw(OSError("gone"))
        with caps:
            pass
        assert caps.violation.startswith("the ranks' private folder could not be measured after the job (OSError: gone)")
    finally:
        area.cleanup()


@pytest.mark.parametrize("code, team_disk, status", [
    (errno.ENOSPC, True, "crashed"), (errno.EDQUOT, True, "crashed"), (errno.ENFILE, False, "crashed"),
    (errno.ENOMEM, False, "crashed"), (errno.ENOSPC, False, "aborted"), (errno.EDQUOT, False, "aborted"),
    (errno.EMFILE, True, "aborted"), (errno.EIO, True, "aborted"), (errno.EACCES, True, "aborted")],
    ids=lambda v: errno.errorcode.get(v, str(v)) if isinstance(v, int) and not isinstance(v, bool) else str(v))
def test_the_launchers_own_io_failure_is_a_rerun_only_where_no_team_can_cause_it(code, team_disk, status):
    """A full disk the team writes (its private folder's), a used-up quota there, the system's file table or memory
    can be the team's doing: never a free re-run. A full disk it cannot write, the launcher's own file table, a
    failing disk or a permission are the machine's: `aborted`, run again."""
    from harness.launcher.run.takeback import io_failure_outcome

    got, reason = io_failure_outcome("the checkpoint could not be taken", f"OSError: [Errno {code}] x", code, team_disk)
    assert got == status
    assert reason.startswith("harness error: the checkpoint could not be taken: OSError")
    assert ("the team's processes could cause this" in reason) == (status == "crashed")


def test_a_staging_folder_the_team_closed_to_its_reader_is_the_teams_not_the_machines(tmp_path, monkeypatch):
    """Rank 0 takes its staging folder's rights away after the save: the launcher cannot stat the checkpoint
    (EACCES, as a non-root launcher), which must read as no checkpoint (the team's), never as an I/O error of
    the machine's (a free re-run)."""
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    area = WorkArea(snapshot)
    try:
        (area.staging / "checkpoint.pt").write_bytes(b"weights")
        real_stat = os.stat

        def refused(path, *args, **kwargs):
            if path == "checkpoint.pt":
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return real_stat(path, *args, **kwargs)

        monkeypatch.setattr(os, "stat", refused)
        assert area.take_staged("checkpoint.pt", tmp_path / "copy.pt") is False
        monkeypatch.undo()
        assert area.same_disk(tmp_path) is True
    finally:
        area.cleanup()


def test_a_check_report_of_another_shape_is_the_teams_invalid_and_never_a_harness_error():
    """report.json is written where the submission's code runs: `{}`, or a failure naming no problem, must end the
    run as the team's `invalid` (a harness error would invite a re-run of the same seed), and the ranks waiting
    beside the check are told stop (harness/launcher/run/check_phase.py)."""
    from types import SimpleNamespace

    from harness.launcher.run.check_phase import accept_check, report_problem
    from harness.results.records import RunRecord

    assert report_problem({"ok": True, "problems": [], "warnings": []}) == ""
    for bad in ({}, {"ok": "yes"}, {"ok": False, "problems": []}, {"ok": True, "problems": [1]},
                {"ok": True, "warnings": "x"}, [], None, {"ok": False, "problems": [{"file": "x", "traceback": 5}]},
                {"ok": False, "problems": [{"problem": "x", "traceback": ["x"]}]}, {"ok": True, "config": [1]},
                {"ok": True, "flops_method": 3}):
        record = RunRecord(run_id="r", team="t", track_name="local", status="running")
        passed = accept_check(record, bad, SimpleNamespace(sandbox="required"), SimpleNamespace(info=print),
                              SimpleNamespace(is_set=False), [])
        assert passed is False and record.status == "invalid", (bad, record.reason)
        assert isinstance(bad, dict) or record.sandbox.get("check") is None
        assert record.reason.endswith(" (report.json is written in the check's folder, where the submission's code "
                                      "runs: a submission that rewrites it is refused)"), record.reason


def test_a_check_report_too_large_or_too_deep_for_a_record_is_the_teams_invalid(tmp_path):
    """report.json holds what the record copies (problems, warnings, config). Written by the team's code, one of
    millions of warnings, a traceback of megabytes of non-ASCII text (six bytes each in the record's JSON) or a
    config nested hundreds deep made a record no reader takes (over its 16 MiB) or one its writer cannot write
    (RecursionError): a run the team chose to void, re-run by the queue. Such a report is the team's `invalid`;
    an honest report's strings are kept, a long one cut, and what is kept writes and reads back as a record."""
    import json

    from harness.launcher.run.check_phase import accept_check
    from harness.launcher.run.check_process import REPORT_MAX_KEPT_BYTES, _read_report
    from harness.results.records import RunRecord, read_record_json, save_record
    from types import SimpleNamespace

    deep: dict = {}
    inner = deep
    for _ in range(600):
        inner["x"] = {}
        inner = inner["x"]
    cases = {"warnings": {"ok": True, "warnings": ["w"] * 3_000_000},
             "traceback": {"ok": False, "problems": [{"file": "m.py", "problem": "p", "traceback": "é" * 6_000_000}]},
             "deep config": {"ok": True, "config": deep}}
    for what, report in cases.items():
        path = tmp_path / f"{what}.json"
        path.write_text(json.dumps(report, ensure_ascii=False))
        read = _read_report(path)
        if what == "traceback":  # one long string is cut, not refused: the rest of an honest failure stands
            assert read["problems"][0]["traceback"].endswith(" [cut]")
            assert len(json.dumps(read)) <= REPORT_MAX_KEPT_BYTES
        else:
            assert read["ok"] is False and read["problems"][0]["problem"].startswith("the check's report "), read
        record = RunRecord(run_id="r", team="t", track_name="local", status="running")
        passed = accept_check(record, read, SimpleNamespace(sandbox="off"), SimpleNamespace(info=lambda _: None),
                              SimpleNamespace(is_set=False), [])
        assert passed is False and record.status == "invalid", (what, record.reason)
        save_record(tmp_path / what.replace(" ", "_"), record)
        assert read_record_json(tmp_path / what.replace(" ", "_") / "run.json")["status"] == "invalid"


def test_an_open_division_checkpoint_whose_config_no_record_can_hold_is_the_teams_invalid(tmp_path):
    """The open division's record keeps the config the team's script saved in its checkpoint: nested deep (the
    record's writer raised RecursionError at a few hundred levels) it is refused as the check's report is, and an
    honest one is kept as saved."""
    import torch

    from harness.launcher.run.open_run import normalize_in_own_process

    deep: dict = {}
    inner = deep
    for _ in range(100):  # past the bound, within what torch.save itself can write from a test
        inner["x"] = {}
        inner = inner["x"]
    state = {"w": torch.zeros(2)}
    for name, config in (("deep", deep), ("honest", {"n_layer": 2, "betas": [0.9, 0.95]})):
        torch.save({"model": state, "config": config, "step": 3}, tmp_path / f"{name}.pt")
        found = normalize_in_own_process(tmp_path / f"{name}.pt", tmp_path / f"{name}-out.pt", tmp_path / f"{name}.log")
        if name == "deep":
            assert found.get("error", "").startswith("the checkpoint's config is nested deeper than"), found
        else:
            assert "error" not in found and found["config"] == config and found["step"] == 3, found
