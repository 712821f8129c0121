"""The nodes' heartbeat: files each launcher writes in the run's nodes/ folder, in fractions of a second."""

import pytest
import threading
import time
from pathlib import Path

from harness.launcher.control.heartbeat import NodeHeartbeat, lost_after_s


def _pair(run_dir, lost_after=1.0):
    return [NodeHeartbeat(run_dir, r, 2, lost_after, interval_s=0.05).start() for r in (0, 1)]


def _soon(check, within_s: float = 10.0) -> bool:
    """A verdict that needs the reader thread's current reads: polled, as the launcher's watchdog asks again and
    again, so that a loaded machine that delays a thread fails no test."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _freeze(beat):  # the threads stop without a word, as a node that loses its power
    beat._stop.set()
    beat._writer.join()
    beat._reader.join()


def test_a_node_that_stops_beating_is_lost_to_node_0_and_node_0_to_it(tmp_path):
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    assert node0.lost_nodes() == [] and node1.lost_nodes() == []
    _freeze(node1)
    assert _soon(lambda: node0.lost_nodes() == [1])
    assert "node(s) 1 lost: no heartbeat" in node0.lost_why()
    assert _soon(lambda: node0.silent([1]) == [1])
    node0.stop()


def test_node_0_silent_is_lost_to_the_others(tmp_path):
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    _freeze(node0)
    assert _soon(lambda: node1.lost_nodes() == [0])
    node1.stop()


@pytest.mark.slow
def test_a_node_that_ends_its_training_and_says_so_is_not_lost_and_still_beats_until_its_run_is_over(tmp_path):
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    node1.mark_done()  # its training is over; its launcher goes on (an account to write, evaluation)
    time.sleep(1.5)
    assert node0.lost_nodes() == [] and node0.silent([1]) == []
    node1.stop()
    assert _soon(lambda: node0.silent([1]) == [1])  # gone now: silent, though never "lost"
    assert node0.lost_nodes() == []
    node0.stop()


def test_a_node_never_heard_is_the_rendezvous_s_to_report_not_the_heartbeat_s(tmp_path):
    node0 = NodeHeartbeat(tmp_path, 0, 3, 0.2, interval_s=0.05).start()
    assert _soon(lambda: node0.silent([1, 2]) == [1, 2])
    assert node0.lost_nodes() == []
    node0.stop()


def test_the_beats_are_files_only_the_launchers_write(tmp_path):
    """In the runs tree, which no sandboxed rank can reach (tests/test_doors.py): nothing a team's code can
    write, unlike the rendezvous store that takes writes from anyone on the network."""
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    node0.stop()
    node1.stop()
    assert sorted(p.name for p in (tmp_path / "nodes").iterdir()) == ["alive-node0.json", "alive-node1.json"]


def _stall_writes_of(monkeypatch, folder, node_rank: int, stall_s: float) -> threading.Event:
    """Node `node_rank`'s writes of its beat block for `stall_s`, as an NFS server that stops answering one
    client: its other threads go on. Returns an event set when the stall has begun."""
    from harness.launcher.control import heartbeat

    real, began = heartbeat._write_beat, threading.Event()
    until = time.monotonic() + 3600.0

    def write_beat(path, text):
        nonlocal until
        if Path(path).name == f"alive-node{node_rank}.json" and Path(path).parent == folder / "nodes":
            if not began.is_set():
                began.set()
                until = time.monotonic() + stall_s
            while time.monotonic() < until:
                time.sleep(0.01)
        return real(path, text)

    monkeypatch.setattr(heartbeat, "_write_beat", write_beat)
    return began


@pytest.mark.slow
def test_a_node_whose_own_write_stalls_never_calls_a_live_node_lost(tmp_path, monkeypatch):
    """Issue 29: two heartbeats and a 4 s stall of node 0's write made node 0 call node 1 lost while it beat on.
    Node 0's reads go on apart from its write."""
    node0, node1 = _pair(tmp_path, lost_after=0.5)
    time.sleep(0.3)
    began = _stall_writes_of(monkeypatch, tmp_path, 0, stall_s=2.0)
    assert began.wait(2.0)
    deadline = time.monotonic() + 1.8
    while time.monotonic() < deadline:  # node 1 beats on through node 0's stall: never lost to node 0
        assert node0.lost_nodes() == []  # what the launcher's watchdog asks, from its own thread
        time.sleep(0.05)
    assert node0.silent([1]) == []
    node0.stop()
    node1.stop()


@pytest.mark.slow
def test_a_node_whose_reads_stall_calls_nobody_lost_until_it_reads_again(tmp_path, monkeypatch):
    """A reader that learns nothing (its file system stalled) has no verdict: silence needs current reads."""
    node0, node1 = _pair(tmp_path, lost_after=0.5)
    time.sleep(0.3)
    _freeze(node1)  # node 1 really is gone, but node 0 cannot read that now
    release = threading.Event()
    real_read = node0._read

    def stalled_read():
        release.wait(10.0)
        real_read()

    monkeypatch.setattr(node0, "_read", stalled_read)
    time.sleep(1.2)  # past lost_after with no read completed since node 1 stopped
    assert node0.lost_nodes() == [] and node0.silent([1]) == []
    release.set()
    assert _soon(lambda: node0.lost_nodes() == [1])  # once its reads are current again, the silence counts
    node0.stop()


@pytest.mark.slow
def test_while_the_shared_file_system_stalls_every_write_nobody_is_lost_and_after_it_nobody_was(tmp_path, monkeypatch):
    """A stall of the file system that holds the run (fsfreeze, an NFS server that stops answering) silences every
    node's beat at once, reads still answering: a node whose own write stalls judges nobody. `harness rehearse
    --fault fs-stall` does it for real."""
    node0, node1 = _pair(tmp_path, lost_after=0.5)
    time.sleep(0.3)
    began0 = _stall_writes_of(monkeypatch, tmp_path, 0, stall_s=2.0)
    assert began0.wait(2.0)
    from harness.launcher.control import heartbeat

    stalled0 = heartbeat._write_beat  # node 1's writes stall too, from now on
    began1 = threading.Event()

    def both(path, text):
        if Path(path).name == "alive-node1.json":
            began1.set()
            while not node0_thawed.is_set():
                time.sleep(0.01)
        return stalled0(path, text)

    node0_thawed = threading.Event()
    monkeypatch.setattr(heartbeat, "_write_beat", both)
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:
        assert node0.lost_nodes() == [] and node1.lost_nodes() == []
        time.sleep(0.05)
    node0_thawed.set()  # node 1's writes go through first; node 0's stall ends a little later (its own 2 s)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # right after the stall every beat is old: still nobody lost
        assert node0.lost_nodes() == [] and node1.lost_nodes() == []
        time.sleep(0.02)
    node0.stop()
    node1.stop()


def test_a_node_is_lost_only_after_several_reads_that_saw_no_change(tmp_path):
    """One read can be stale (an NFS client's cache); the verdict waits for several since the last change, as
    well as for lost_after seconds of this node's own healthy reads and writes (a fake clock: no thread runs)."""
    clock = [100.0]
    node0 = NodeHeartbeat(tmp_path, 0, 2, 1.0, interval_s=0.05, clock=lambda: clock[0], fresh_reads=30)
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "alive-node1.json").write_text('{"beat": 1, "done": false}')
    node0._write()
    node0._read()  # heard once, at 100.0
    verdicts = []
    for _ in range(40):  # a write and a read every 0.05 s of the fake clock, node 1's beat never moving
        clock[0] += 0.05
        node0._write()
        node0._read()
        verdicts.append(node0.lost_nodes())
    # past lost_after (1 s) after 21 reads, but lost only at the 30th read without a change
    assert verdicts[:29] == [[]] * 29 and verdicts[29:] == [[1]] * 11


def test_the_silence_that_makes_a_node_lost_is_well_inside_the_collective_timeout():
    assert lost_after_s(300.0) == 10.0 and lost_after_s(12.0) == 6.0 and lost_after_s(1.0) == 2.0


def test_slow_writes_that_are_no_stall_never_hide_a_lost_node(tmp_path, monkeypatch):
    """Issue 29 review: a beat write of 2.6 s every few beats (an fsync behind a busy disk) reset the healthy
    time again and again, and a node that really died was never called lost. A write slower than an interval
    but shorter than half of lost_after is no stall; beats are no longer fsynced at all."""
    from harness.launcher.control import heartbeat

    node0, node1 = _pair(tmp_path, lost_after=1.0)
    assert _soon(lambda: node0._seen.get(1) is not None)
    real = heartbeat._write_beat

    def slow(path, text):
        if Path(path).name == "alive-node0.json":
            time.sleep(0.4)  # 8 intervals, under stall_s (0.5 s)
        return real(path, text)

    monkeypatch.setattr(heartbeat, "_write_beat", slow)
    _freeze(node1)
    assert _soon(lambda: node0.lost_nodes() == [1])
    node0.stop()


def test_the_account_of_a_node_says_how_long_its_own_beat_writes_blocked(tmp_path, monkeypatch):
    """Node 0 tells a node whose file system stalled (the infrastructure's) from one whose launcher was
    starved (a team's busy ranks): the account carries the slowest write of its beat."""
    node0, node1 = _pair(tmp_path, lost_after=0.5)
    began = _stall_writes_of(monkeypatch, tmp_path, 1, stall_s=0.8)
    assert began.wait(2.0)
    assert _soon(lambda: node1.summary()["longest_write_s"] >= 0.8)
    assert node0.summary()["longest_write_s"] < 0.25
    node0.stop()
    node1.stop()
