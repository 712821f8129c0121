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


def _raw(channel: ChannelServer, *frames: bytes):
    import socket
    import struct

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(channel.path)
    for f in frames:
        s.sendall(struct.pack("<I", len(f)) + f)
    return s


def test_nothing_a_connection_sends_stops_the_channel():
    """Deep JSON, an oversized frame, a silent connection and a flood of connections are cut off and
    noted; the channel keeps listening and a real rank is still heard afterwards."""
    ch = ChannelServer(expected_ranks=[0], hello_within_s=1.0)
    try:
        # From this process (not a descendant) everything is refused at once: make children do it.
        code = (
            "import socket, struct, sys, time\n"
            "def c(*frames):\n"
            "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])\n"
            "    for f in frames: s.sendall(struct.pack('<I', len(f)) + f)\n"
            "    return s\n"
            "keep = [c(b'[' * 25000 + b']' * 25000), c(), c(b'x' * 10)]\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])\n"
            "s.sendall(struct.pack('<I', 10 ** 9))\n"
            "keep += [c() for _ in range(100)]\n"
            "time.sleep(2.5)\n"
        )
        subprocess.run([sys.executable, "-c", code, ch.path], check=True, timeout=60)
        report(ch, 0, "hello", "progress")
        settle(ch, 2)
        assert ch.alive and [(m.kind, m.body["rank"]) for m in ch.snapshot()] == [("hello", 0), ("progress", 0)]
        text = " | ".join(ch.refused)
        assert "sent a message of 1000000000 bytes" in text and "never said which rank" in text
        assert "too many connections" in text
    finally:
        ch.close()
