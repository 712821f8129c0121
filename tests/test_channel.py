"""The control channel: reports are tied by the kernel to the process that sent them."""

import subprocess
import sys
import time

from harness.launcher.channel import ChannelServer

CLIENT = r"""
import sys
from harness.ranks.channel import ChannelClient
c = ChannelClient(sys.argv[1], int(sys.argv[2]))
for kind in sys.argv[3:]:
    c.send(kind, claimed="x")
"""


def report(channel: ChannelServer, rank: int, *kinds: str) -> None:
    subprocess.run([sys.executable, "-c", CLIENT, channel.path, str(rank), *kinds], check=True, timeout=60)


def settle(channel: ChannelServer, n_messages: int, n_refused: int = 0) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(channel.snapshot()) < n_messages or len(channel.refused) < n_refused):
        time.sleep(0.02)


def test_a_rank_is_bound_by_its_hello_and_an_impostor_is_refused():
    ch = ChannelServer(expected_ranks=[0, 1])
    try:
        report(ch, 0, "hello", "progress")
        report(ch, 1, "hello")
        report(ch, 0, "hello", "train_end")  # another process claiming rank 0
        settle(ch, 3, 1)
        kinds = [(m.kind, m.body["rank"]) for m in ch.snapshot()]
        assert kinds == [("hello", 0), ("progress", 0), ("hello", 1)]
        assert len(ch.refused) == 1 and "claimed rank 0, already reporting from pid" in ch.refused[0]
    finally:
        ch.close()


def test_reports_before_hello_and_ranks_of_other_nodes_are_refused():
    ch = ChannelServer(expected_ranks=[2, 3])
    try:
        report(ch, 2, "train_end")
        report(ch, 0, "hello")
        settle(ch, 0, 2)
        assert ch.snapshot() == []
        assert any("before saying which rank" in r for r in ch.refused)
        assert any("claimed rank 0, which does not run on this node" in r for r in ch.refused)
    finally:
        ch.close()


def test_a_process_outside_the_job_cannot_report():
    """The launcher itself is not one of its own descendants: the same check refuses another team's job."""
    from harness.ranks.channel import ChannelClient

    ch = ChannelServer(expected_ranks=[0])
    try:
        client = ChannelClient(ch.path, 0)
        client.send("hello")
        client.send("train_end")
        settle(ch, 0, 1)
        assert ch.snapshot() == [] and "not a process of this job" in ch.refused[0]
    finally:
        ch.close()


def test_a_rank_without_a_launcher_never_blocks_or_raises():
    from harness.ranks.channel import ChannelClient

    c = ChannelClient("/nonexistent/harness.sock", 0)
    c.send("progress", step=1)
    assert c.dropped == 2  # the failed connection and the report
