"""The nodes' heartbeat through a real rendezvous store on this machine, in fractions of a second."""

import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from harness.launcher.heartbeat import NodeHeartbeat, lost_after_s


@pytest.fixture
def store_port():
    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)
    yield store.port
    del store


def _pair(port, lost_after=1.0):
    return [NodeHeartbeat("127.0.0.1", port, r, 2, lost_after, interval_s=0.05).start() for r in (0, 1)]


def _freeze(beat):  # the thread stops without a word, as a node that loses its power
    beat._stop.set()
    beat._thread.join()


def test_a_node_that_stops_beating_is_lost_to_node_0_and_node_0_to_it(store_port):
    node0, node1 = _pair(store_port)
    time.sleep(0.3)
    assert node0.lost_nodes() == [] and node1.lost_nodes() == []
    _freeze(node1)
    time.sleep(1.5)
    assert node0.lost_nodes() == [1] and "node(s) 1 lost: no heartbeat" in node0.lost_why()
    node0.stop()
    node1b = NodeHeartbeat("127.0.0.1", store_port, 1, 2, 1.0, interval_s=0.05).start()  # node 0 said it is done
    time.sleep(1.5)
    assert node1b.lost_nodes() == []
    node1b.stop()


def test_node_0_silent_is_lost_to_the_others(store_port):
    node0, node1 = _pair(store_port)
    time.sleep(0.3)
    _freeze(node0)
    time.sleep(1.5)
    assert node1.lost_nodes() == [0]
    node1.stop()


def test_a_node_that_ends_its_training_and_says_so_is_not_lost(store_port):
    node0, node1 = _pair(store_port)
    time.sleep(0.3)
    node1.stop()
    time.sleep(1.5)
    assert node0.lost_nodes() == []
    node0.stop()


def test_a_node_never_heard_is_the_rendezvous_s_to_report_not_the_heartbeat_s(store_port):
    node0 = NodeHeartbeat("127.0.0.1", store_port, 0, 3, 0.2, interval_s=0.05).start()
    time.sleep(0.5)
    assert node0.lost_nodes() == []
    node0.stop()


def test_the_silence_that_makes_a_node_lost_is_well_inside_the_collective_timeout():
    assert lost_after_s(300.0) == 10.0 and lost_after_s(12.0) == 6.0 and lost_after_s(1.0) == 2.0
