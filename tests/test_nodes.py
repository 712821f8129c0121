"""Node 0 reads the other nodes' accounts (harness/launcher/run/nodes.py): unit tests with accounts written by hand."""

import threading
import time

from harness.launcher.run import nodes
from harness.launcher.run.nodes import NodePaths, merge_node_reports
from harness.launcher.run.outcome import Outcome
from harness.results.records import RunRecord, stamp_epoch_s


class Beating:
    """A heartbeat whose every node still beats."""

    def silent(self, ranks):
        return []


def test_a_run_that_went_well_waits_for_the_account_of_a_node_that_still_beats(tmp_path, monkeypatch):
    """Issue 29: a node slow to end its training phase lost its flags from the record. While its launcher
    beats, its account is on its way, and node 0 waits for it (up to the silence that makes a node lost)."""
    monkeypatch.setattr(nodes, "WAIT_FOR_NODES_OK_S", 0.2)
    (tmp_path / "nodes").mkdir()
    node1 = NodePaths(tmp_path, 1)
    late = RunRecord(run_id="r", team="t", track_name="tiny", status="ok", hostname="h")
    late.flagged, late.flag_reason = True, "rank 1 wrote into the results"

    def write_late():
        time.sleep(1.0)
        node1.save_report(late)

    writer = threading.Thread(target=write_late)
    writer.start()
    record = RunRecord(run_id="r", team="t", track_name="tiny", status="ok")
    merge_node_reports(record, NodePaths(tmp_path, 0), Outcome("ok", ""), 2, silent_after_s=5.0, heartbeat=Beating())
    writer.join()
    assert record.flagged and "node 1: rank 1 wrote into the results" in record.flag_reason
    assert record.extra["nodes"]["1"]["status"] == "ok"


def test_a_silent_node_without_an_account_is_not_waited_for_past_the_short_wait(tmp_path, monkeypatch):
    monkeypatch.setattr(nodes, "WAIT_FOR_NODES_OK_S", 0.2)
    (tmp_path / "nodes").mkdir()

    class Silent:
        def silent(self, ranks):
            return list(ranks)

    record = RunRecord(run_id="r", team="t", track_name="tiny", status="ok")
    t0 = time.monotonic()
    merge_node_reports(record, NodePaths(tmp_path, 0), Outcome("ok", ""), 2, silent_after_s=30.0, heartbeat=Silent())
    assert time.monotonic() - t0 < 5.0
    assert any("node(s) 1 gave no account" in n for n in record.notes)


def _answered(tmp_path, longest_write_s: float) -> RunRecord:
    """Node 0 called node 1 lost (its heartbeat); node 1's launcher was alive and wrote its account afterwards."""
    (tmp_path / "nodes").mkdir()
    account = RunRecord(run_id="r", team="t", track_name="tiny", status="crashed", hostname="h",
                        reason="a peer stopped responding in a collective")
    account.extra["cause"] = "collective"
    account.extra["beat"] = {"longest_write_s": longest_write_s, "stall_s": 5.0}
    NodePaths(tmp_path, 1).save_report(account)
    record = RunRecord(run_id="r", team="t", track_name="tiny", status="aborted")
    record.extra["lost_nodes"] = [1]
    merge_node_reports(record, NodePaths(tmp_path, 0), Outcome("aborted", "node(s) 1 lost", cause="kill"), 2,
                       silent_after_s=1.0, heartbeat=Beating())
    return record


def test_a_node_called_lost_because_its_file_system_stalled_is_the_infrastructures(tmp_path):
    """Issue 29 review: node 1's writes to the shared file system blocked for 12 s (an NFS client hang on one
    node); node 0 called it lost, and its account came afterwards. The run was `crashed`, charged to the team."""
    record = _answered(tmp_path, longest_write_s=12.0)
    assert record.status == "aborted" and "blocked for 12 s" in record.reason, record.reason
    assert record.reason.startswith("node 1 was called lost: its launcher's writes to the shared file system blocked "
                                    "for 12 s (a stall of the file system"), record.reason


def test_a_node_called_lost_whose_writes_never_blocked_was_late_on_its_own(tmp_path):
    """Its writes went through in moments: its launcher was late (its node's ranks starved it), not its file
    system. Not the infrastructure's: a team could so draw again."""
    record = _answered(tmp_path, longest_write_s=0.01)
    assert record.status == "crashed" and "its launcher was late" in record.reason, record.reason


def test_a_node_that_ended_before_training_is_not_waited_for_until_the_rendezvous_times_out(tmp_path):
    """Issue 29 review: a node whose scratch root was too full aborted at once, and the others waited for it in
    the rendezvous (600 s at Paris). Node 0 reads an `aborted` account; node R reads node 0's final record."""
    import json

    from harness.launcher.run.training import EarlyEnd

    (tmp_path / "nodes").mkdir()
    lead, other = EarlyEnd(NodePaths(tmp_path, 0), 2, every_s=0.0), EarlyEnd(NodePaths(tmp_path, 1), 2, every_s=0.0)
    assert lead.why() is None and other.why() is None
    aborted = RunRecord(run_id="r", team="t", track_name="tiny", status="aborted", hostname="h",
                        reason="the scratch folder /s has 0.01 GiB free")
    NodePaths(tmp_path, 1).save_report(aborted)
    status, why = lead.why()
    assert status == "aborted" and "node 1 ended its run before training: aborted: the scratch folder /s" in why
    # Refused by its own check (review of 2026-12-03): the team's, carried as such, never a rendezvous timed out
    refused = RunRecord(run_id="r", team="t", track_name="tiny", status="invalid", hostname="h",
                        reason="submission.py:1: RuntimeError", traceback='File "submission.py", line 1\nRuntimeError')
    NodePaths(tmp_path, 1).save_report(refused)
    assert lead.why() == ("invalid", "node 1 ended its run before training: invalid: submission.py:1: RuntimeError")
    assert lead.traceback == 'File "submission.py", line 1\nRuntimeError'  # the record carries node 1's traceback
    assert json.loads(NodePaths(tmp_path, 1).report_path.read_text())["cause"] == "own"  # for merge_node_reports
    # An account of a training job's end (its ranks timed out in the process group, say) is read after the job
    late = RunRecord(run_id="r", team="t", track_name="tiny", status="crashed", hostname="h", reason="a collective")
    late.extra["cause"] = "collective"
    NodePaths(tmp_path, 1).save_report(late)
    assert lead.why() is None
    # An earlier attempt's account under the same run id is not this run's
    NodePaths(tmp_path, 1).save_report(refused)
    assert EarlyEnd(NodePaths(tmp_path, 0), 2, every_s=0.0, stale_before_s=stamp_epoch_s("2999-01-01T00:00:00Z")).why() is None
    # Three nodes: node 2 does not wait for node 0's record (final only once node 0 has waited for node 2's account)
    third = EarlyEnd(NodePaths(tmp_path, 2), 3, every_s=0.0)
    (tmp_path / "run.json").write_text(json.dumps({"status": "running"}))
    assert third.why() == ("aborted", "node 1 ended the run before training: invalid: submission.py:1: RuntimeError")
    assert EarlyEnd(NodePaths(tmp_path, 1), 3, every_s=0.0).why() is None  # never on its own account
    from conftest import TINY_TRACK
    from harness.launcher.run.training import stale_before_s
    from harness.tracks.spec import load_track

    now = RunRecord(run_id="r", team="t", track_name="tiny", started_at="2026-12-03T10:00:00Z")
    assert stale_before_s(now, load_track(str(TINY_TRACK))) == stamp_epoch_s("2026-12-03T09:58:30Z")  # 30 s + a minute
    (tmp_path / "run.json").write_text(json.dumps({"status": "running"}))
    assert other.why() is None
    (tmp_path / "run.json").write_text(json.dumps({"status": "invalid", "reason": "submission.py: no get_model"}))
    status, why = other.why()  # node 0's record is the run's: this node's part ends aborted, saying why
    assert status == "aborted" and "node 0 ended the run before training: invalid" in why


def test_a_node_that_ends_the_run_before_this_nodes_ranks_start_gives_the_run_its_status():
    """Review of 2026-12-03: node 1 refused (its check, at once) before node 0's ranks had all started; node 0's job
    was ended and its record said "this node's ranks did not all start ... no team code ran", `aborted`: the
    re-run the team chose. The other node's status is the run's, wherever node 0 was when it came."""
    from types import SimpleNamespace

    from harness.launcher.control.watch import WatchResult
    from harness.launcher.run.check_phase import JobBeside, check_then_say
    from harness.launcher.run.outcome import Outcome

    said = ("invalid", "node 1 ended its run before training: invalid: submission.py:1: raised RuntimeError")
    ended = SimpleNamespace(outcome=Outcome(*said, cause="kill"), watch=WatchResult(ended_by=said))
    record = RunRecord(run_id="r", team="t", track_name="tiny")
    checked = []
    passed, beside = check_then_say(lambda: checked.append(1) or {}, lambda report: True, JobBeside(lambda gate: ended),
                                    {0}, record, nnodes=2, rendezvous_s=0.1)
    assert (passed, beside, checked) == (False, None, [])  # no check ran: the run was over
    assert (record.status, record.reason) == said
    assert record.extra["cause"] == "kill"  # a third node's account of it never reads as its own end before training
    # ... so node 0, reading both accounts, gives the run the refusing node's status (reviews of 2026-12-03)
    import tempfile
    from pathlib import Path

    from harness.launcher.run.training import EarlyEnd

    with tempfile.TemporaryDirectory() as run_dir:
        (Path(run_dir) / "nodes").mkdir()
        record.status, record.reason = "aborted", "node 3 ended the run before training: invalid: submission.py:1"
        NodePaths(Path(run_dir), 1).save_report(record)  # node 1's part, ended by node 3's account
        refused = RunRecord(run_id="r", team="t", track_name="tiny", status="invalid", hostname="h",
                            reason="submission.py:1: raised RuntimeError")
        NodePaths(Path(run_dir), 3).save_report(refused)
        full = RunRecord(run_id="r", team="t", track_name="tiny", status="aborted", hostname="h",
                         reason="the scratch folder /s has 0.01 GiB free")
        NodePaths(Path(run_dir), 2).save_report(full)  # seen in the same poll: the team's own end comes first
        assert EarlyEnd(NodePaths(Path(run_dir), 0), 4, every_s=0.0).why() == (
            "invalid", "node 3 ended its run before training: invalid: submission.py:1: raised RuntimeError")


def test_a_forged_account_with_a_traceback_that_is_not_text_never_stops_the_record(tmp_path):
    """A node's account may be forged where the sandbox is off: a dict for a traceback made name_team_files raise in
    the runner's last step, so no run.json was written and a queue ran the run again."""
    import json

    from harness.launcher.run.assemble import name_team_files
    from harness.launcher.run.nodes import merge_node_reports
    from harness.launcher.run.outcome import Outcome

    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "node1.json").write_text(json.dumps(
        {"node_rank": 1, "status": "crashed", "reason": "boom", "cause": "own", "failing_rank": {"x": 1},
         "traceback": {"not": "text"}}))
    record = RunRecord(run_id="r", team="t", track_name="tiny", status="crashed", reason="echo")
    merge_node_reports(record, NodePaths(tmp_path, 0), Outcome("crashed", "echo", cause="collective"), 2,
                       silent_after_s=0.0)
    assert record.reason == "node 1: boom" and record.traceback is None and record.failing_rank is None
    record.traceback = ["planted"]
    name_team_files(record, [])
    assert record.traceback is None


def test_a_long_traceback_keeps_its_last_line_once_its_control_characters_are_escaped():
    """Escaping control characters lengthens a traceback; cut at the start, it lost its error line, the one a team
    reads."""
    from harness.launcher.run.assemble import name_team_files, set_outcome

    record = RunRecord(run_id="r", team="t", track_name="tiny")
    set_outcome(record, "crashed", "boom", tb="\x1b[31m" * 3000 + '\nFile "model.py", line 9\nValueError: the real cause')
    name_team_files(record, [])
    assert record.traceback.endswith("ValueError: the real cause") and "\x1b" not in record.traceback
    assert len(record.traceback) <= 8000 + 40 and record.traceback.startswith("... (")


def test_a_node_whose_job_namespace_was_ended_under_it_makes_the_run_the_infrastructures(tmp_path):
    """Node 1's training job lost its PID namespace (harness/launcher/run/training.py: its PID 1 killed from outside):
    the kernel ended its ranks, node 0's ranks saw their peers go (a collective's echo). The run is the machine's,
    `aborted` and re-run, never a crash charged to the team; a node's own error still comes first."""
    import json

    (tmp_path / "nodes").mkdir()
    lost = {"node_rank": 1, "status": "aborted", "cause": "infra",
            "reason": "harness error: PID 1 of the job's PID namespace ended while the job ran"}
    (tmp_path / "nodes" / "node1.json").write_text(json.dumps(lost))
    record = RunRecord(run_id="r", team="t", track_name="tiny", status="crashed", reason="echo")
    merge_node_reports(record, NodePaths(tmp_path, 0), Outcome("crashed", "echo", cause="collective"), 2,
                       silent_after_s=0.0)
    assert record.status == "aborted" and record.reason == f"node 1: {lost['reason']}", (record.status, record.reason)
    own = {"node_rank": 2, "status": "crashed", "cause": "own", "reason": "submission.py:3: raised ValueError"}
    (tmp_path / "nodes" / "node2.json").write_text(json.dumps(own))
    record = RunRecord(run_id="r", team="t", track_name="tiny", status="crashed", reason="echo")
    merge_node_reports(record, NodePaths(tmp_path, 0), Outcome("crashed", "echo", cause="collective"), 3,
                       silent_after_s=0.0)
    assert record.status == "crashed" and record.reason == f"node 2: {own['reason']}"
