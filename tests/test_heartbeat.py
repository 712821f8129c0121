"""The nodes' heartbeat: files each launcher writes in the run's nodes/ folder, in fractions of a second."""

import time

from harness.launcher.heartbeat import NodeHeartbeat, lost_after_s


def _pair(run_dir, lost_after=1.0):
    return [NodeHeartbeat(run_dir, r, 2, lost_after, interval_s=0.05).start() for r in (0, 1)]


def _freeze(beat):  # the thread stops without a word, as a node that loses its power
    beat._stop.set()
    beat._thread.join()


def test_a_node_that_stops_beating_is_lost_to_node_0_and_node_0_to_it(tmp_path):
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    assert node0.lost_nodes() == [] and node1.lost_nodes() == []
    _freeze(node1)
    time.sleep(1.5)
    assert node0.lost_nodes() == [1] and "node(s) 1 lost: no heartbeat" in node0.lost_why()
    assert node0.silent([1]) == [1]
    node0.stop()


def test_node_0_silent_is_lost_to_the_others(tmp_path):
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    _freeze(node0)
    time.sleep(1.5)
    assert node1.lost_nodes() == [0]
    node1.stop()


def test_a_node_that_ends_its_training_and_says_so_is_not_lost_and_still_beats_until_its_run_is_over(tmp_path):
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    node1.mark_done()  # its training is over; its launcher goes on (an account to write, evaluation)
    time.sleep(1.5)
    assert node0.lost_nodes() == [] and node0.silent([1]) == []
    node1.stop()
    time.sleep(1.5)
    assert node0.lost_nodes() == [] and node0.silent([1]) == [1]  # gone now: silent, though never "lost"
    node0.stop()


def test_a_node_never_heard_is_the_rendezvous_s_to_report_not_the_heartbeat_s(tmp_path):
    node0 = NodeHeartbeat(tmp_path, 0, 3, 0.2, interval_s=0.05).start()
    time.sleep(0.5)
    assert node0.lost_nodes() == [] and node0.silent([1, 2]) == [1, 2]
    node0.stop()


def test_the_beats_are_files_only_the_launchers_write(tmp_path):
    """In the runs tree, which no sandboxed rank can reach (tests/test_doors.py): nothing a team's code can
    write, unlike the rendezvous store that takes writes from anyone on the network."""
    node0, node1 = _pair(tmp_path)
    time.sleep(0.3)
    node0.stop()
    node1.stop()
    assert sorted(p.name for p in (tmp_path / "nodes").iterdir()) == ["alive-node0.json", "alive-node1.json"]


def test_the_silence_that_makes_a_node_lost_is_well_inside_the_collective_timeout():
    assert lost_after_s(300.0) == 10.0 and lost_after_s(12.0) == 6.0 and lost_after_s(1.0) == 2.0
