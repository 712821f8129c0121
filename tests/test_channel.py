"""The control channel: reports are tied by the kernel to the process that sent them."""

import pytest
import json
import subprocess
import sys
import time

from harness.launcher.control.channel import ChannelServer

CLIENT = r"""
import os, sys
from harness.ranks.channel import ChannelClient
rank = int(sys.argv[2])
c = ChannelClient(sys.argv[1], rank)
BODIES = {  # what a harness rank sends of each kind (each fits its schema: harness/launcher/control/reports.py)
    "hello": dict(pid=os.getpid(), local_rank=rank, group_rank=0, world_size=2),
    "progress": dict(step=3, train_time_s=0.5, train_loss=2.5, lr_scale=1.0, tokens=384, tokens_per_s=768.0,
                     grad_norm=None),
    "train_end": dict(step=4, tokens=512, train_time_s=0.7),
}
for kind in sys.argv[3:]:
    c.send(kind, **BODIES.get(kind, {}))
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


@pytest.mark.slow
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


MALFORMED = r"""
import json, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect(sys.argv[1])
def send(body):
    data = json.dumps(body).encode()
    s.sendall(struct.pack('<I', len(data)) + data)
send({"kind": "hello", "rank": 0, "pid": os.getpid(), "local_rank": 0, "group_rank": 0, "world_size": 1})
for body in json.loads(sys.argv[2]):
    send(body)
s.close()
"""


def test_a_report_that_breaks_its_schema_is_dropped_and_noted():
    """A rank's report is hostile input: a `steps` of "many" once crashed the leaderboard for every team.
    Every field is typed and range-checked on arrival; a bad one drops the message, noted (it flags the
    run), and the channel goes on with the good ones."""
    bad = [
        {"kind": "progress", "step": "many", "train_time_s": 1.0, "tokens": 5, "lr_scale": 1.0, "train_loss": 2.0},
        {"kind": "train_end", "step": -4, "tokens": 5, "train_time_s": 1.0},
        {"kind": "train_end", "step": 4, "tokens": 5, "train_time_s": float("inf")},
        {"kind": "result", "steps": 4, "params": True},
        {"kind": "progress", "step": 1, "train_time_s": 1.0, "tokens": 5, "lr_scale": 1.0, "pwned": 1},
        {"kind": "error", "status": "crashed", "reason": "x" * 60_500},  # fits a frame, not the schema
        {"kind": "victory"},
        {"kind": "train_end", "step": 4, "tokens": 512, "train_time_s": 0.7},  # the one good report
    ]
    ch = ChannelServer(expected_ranks=[0])
    try:
        subprocess.run([sys.executable, "-c", MALFORMED, ch.path, json.dumps(bad)], check=True, timeout=60)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(ch.snapshot()) < 2:
            time.sleep(0.02)
        time.sleep(0.2)
        assert [m.kind for m in ch.snapshot()] == ["hello", "train_end"]
        assert len(ch.malformed) == 7, ch.malformed
        text = " | ".join(ch.malformed)
        for part in ("step = 'many' is not a count", "step = -4 is not a count", "train_time_s = inf is not seconds",
                     "params = True is not a count", "an unknown field 'pwned'", "reason = 'xxx",
                     "an unknown kind of report 'victory'"):
            assert part in text, part
        assert ch.violation is None
    finally:
        ch.close()


def test_a_rank_that_floods_the_channel_is_cut_off_and_the_job_is_ended():
    """Report volume is capped per connection: past it the connection is cut and `violation` says so (the
    watchdog then ends the job as invalid), and the launcher holds no more than the cap."""
    from harness.launcher.control import channel as channel_module

    flood = json.dumps([{"kind": "progress", "step": 1, "train_time_s": 1.0, "tokens": 5, "lr_scale": 1.0,
                         "pad": "x" * 50}] * 2)
    ch = ChannelServer(expected_ranks=[0])
    code = MALFORMED.replace("for body in json.loads(sys.argv[2]):\n    send(body)",
                             "body = {'kind': 'sandbox', 'active': True, 'why': 'y' * 1500}\n"
                             "for _ in range(4000):\n    send(body)")
    try:
        subprocess.run([sys.executable, "-c", code, ch.path, flood], timeout=60)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and ch.violation is None:
            time.sleep(0.02)
        assert ch.violation == f"rank 0 sent more than {channel_module.MAX_BYTES_PER_CONNECTION >> 20} MiB of reports (the cap per rank)"
        held = sum(len(json.dumps(m.body)) for m in ch.snapshot())
        assert held <= channel_module.MAX_BYTES_PER_CONNECTION
    finally:
        ch.close()


def test_an_object_nested_past_a_few_levels_breaks_its_schema():
    """Red team (issue 29): a config nested 600 deep (4 kB) passed json on the channel's thread, then
    dataclasses.asdict in save_record raised RecursionError: the record stayed `running`, a free re-run. Every
    object a report carries is measured without recursion and refused past MAX_DEPTH levels."""
    from harness.launcher.control import reports

    deep: dict = {}
    inner = deep
    for _ in range(600):
        inner["x"] = {}
        inner = inner["x"]
    assert not reports.obj().ok(deep)
    assert reports.obj().ok({"n_layer": 2, "betas": [0.9, 0.95], "nested": {"a": {"b": [1, {"c": 2}]}}})
    assert "levels" in reports.obj().what


LISTENER = r"""
import os, sys
from harness.ranks.channel import ChannelClient
rank = int(sys.argv[2])
c = ChannelClient(sys.argv[1], rank)
c.send("hello", pid=os.getpid(), local_rank=rank, group_rank=0, world_size=2)
print(c.wait_for_word(), flush=True)
"""


def test_the_launchers_word_reaches_each_rank_on_its_own_connection_and_no_impostor():
    """A rank started beside the check of its submission waits for the launcher's word (harness/ranks/training/loop.py
    `await_check`): said to the ranks bound then, and to a rank that binds later; a process claiming a rank already
    bound is cut off and hears nothing but the end of its connection."""
    ch = ChannelServer(expected_ranks=[0, 1])
    listen = lambda rank: subprocess.Popen([sys.executable, "-c", LISTENER, ch.path, str(rank)],
                                           stdout=subprocess.PIPE, text=True)
    try:
        first = listen(0)
        deadline = time.monotonic() + 30
        while ch.bound_ranks() != {0} and time.monotonic() < deadline:
            time.sleep(0.02)
        impostor = listen(0)
        settle(ch, 1, 1)
        ch.tell("go")
        ch.tell("stop", why="a second word is never said")
        late = listen(1)
        assert first.communicate(timeout=60)[0].strip() == "{'kind': 'go'}"
        assert late.communicate(timeout=60)[0].strip() == "{'kind': 'go'}"
        heard = impostor.communicate(timeout=60)[0].strip()
        assert "'kind': 'stop'" in heard and "closed the control channel" in heard
        assert "claimed rank 0, already reporting from pid" in ch.refused[0]
    finally:
        ch.close()
