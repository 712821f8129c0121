"""Node 0 reads the other nodes' accounts (harness/launcher/nodes.py): unit tests with accounts written by hand."""

import threading
import time

from harness.launcher import nodes
from harness.launcher.nodes import NodePaths, merge_node_reports
from harness.launcher.outcome import Outcome
from harness.results.records import RunRecord


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
