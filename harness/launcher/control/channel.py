"""The launcher's end of the control channel from its ranks (the ranks' end: harness/ranks/channel.py).

Each rank connects one Unix stream socket and sends length-prefixed JSON frames. The kernel tells
the launcher who connected (Linux SO_PEERCRED, macOS LOCAL_PEERPID: the pid at connect time,
which the sender cannot forge), so:

- a connection from a living process that is not one of the launcher's own descendants (another
  team's job that found the socket, say) is refused and noted;
- a connection's first message must be `hello` for one of this node's ranks; that binds the
  connection to the rank, and every later message on it is that rank's, whatever it claims;
- a second connection claiming a rank already bound (a process the submission started,
  pretending to be rank 0) is refused and noted, and the run is flagged.

Nothing a connection sends can stop the channel: malformed or oversized frames, connections that
never say hello, floods of messages and too many connections are cut off and noted, and any
other error is caught per event. `alive` says whether the channel still listens; the watchdog
ends the job if it does not.

Every message must fit its kind's schema (harness/launcher/control/reports.py: types, ranges, lengths);
one that does not is dropped and noted in `malformed`, which flags the run. Each connection may
send at most `MAX_BYTES_PER_CONNECTION`: past it the connection is cut and `violation` says so,
and the watchdog ends the job (`invalid`): the launcher's memory is never the ranks' to fill.

Every message is stamped on arrival with the launcher's own monotonic clock: its measurement of
the training window does not trust the ranks' clocks.

Messages (`kind`): hello (rank, pid), setup_start, train_start, progress (step, loss, tokens...),
train_end, result (what a rank measured), error (a rank's failure, with traceback), eval_result. The launcher
says one word the other way (`tell`): to ranks started beside the check of their submission, go or stop.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.launcher.control import reports
from harness.launcher.control.process_tree import descends_from
from harness.ranks.channel import FRAME, MAX_MESSAGE  # one protocol for both ends

MAX_UNBOUND = 64  # connections that have not said hello yet
HELLO_WITHIN_S = 10.0  # a connection that says nothing for this long is cut off
MAX_MESSAGES_PER_CONNECTION = 20_000  # an honest rank sends one progress report a log interval: hundreds a run
MAX_BYTES_PER_CONNECTION = 4 << 20  # an honest rank sends a few kB a minute; 4 MiB is a thousand times that


@dataclass
class Message:
    kind: str
    body: dict[str, Any]
    received_s: float  # launcher's time.monotonic() at arrival


@dataclass
class _Peer:
    pid: int | None
    since_s: float
    rank: int | None = None
    buffer: bytes = b""
    count: int = 0
    bytes_in: int = 0


def peer_pid(conn: socket.socket) -> int | None:
    """The pid of the process at the other end, as the kernel recorded it when it connected."""
    if sys.platform.startswith("linux"):
        pid, _uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                               struct.calcsize("3i")))
        return pid
    if sys.platform == "darwin":
        return struct.unpack("i", conn.getsockopt(0, 0x002, struct.calcsize("i")))[0]  # SOL_LOCAL, LOCAL_PEERPID
    return None


def _outside_the_job(pid: int | None, ancestor: int) -> bool:
    """True when the peer is alive and not a descendant of the launcher. A peer that has already
    exited cannot be checked; it still has to bind to a rank no other process holds."""
    return pid is not None and descends_from(pid, ancestor) is False


def _send_word(conn: socket.socket, frame: bytes) -> None:
    """One small frame to a rank that has sent, and never read: its socket's buffer takes it whole. A rank gone
    meanwhile hears nothing, which it cannot mind."""
    try:
        conn.send(frame)
    except OSError:
        pass


class ChannelServer:
    """Launcher side: listens in a private temporary folder and collects messages in a thread."""

    def __init__(self, expected_ranks: list[int] | None = None, hello_within_s: float = HELLO_WITHIN_S) -> None:
        # A short private path: Unix socket paths are limited to ~107 bytes, run dirs can be long.
        self.dir = Path(tempfile.mkdtemp(prefix="harness-ch-"))
        self.path = str(self.dir / "ch.sock")
        self.expected = set(expected_ranks) if expected_ranks is not None else None
        self.hello_within_s = hello_within_s
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(256)
        self.sock.setblocking(False)
        self.messages: list[Message] = []
        self.refused: list[str] = []  # who tried to report and was turned away, and why
        self.malformed: list[str] = []  # reports that broke their schema (dropped), and what was wrong
        self.violation: str | None = None  # a cap a rank broke: the watchdog ends the job
        self.lock = threading.Lock()
        self.new = threading.Condition(self.lock)
        self._bound: dict[int, int | None] = {}  # rank -> pid
        self._conns: dict[int, socket.socket] = {}  # rank -> its connection: where `tell` reaches it
        self._word: bytes | None = None  # the launcher's word to every rank, once said (tell)
        self._open = 0  # connections registered (read by drain from another thread)
        self._stop = threading.Event()
        self._me = os.getpid()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._serve, name="harness-channel", daemon=True)
        self.thread.start()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() or self._stop.is_set()

    # ------------------------------------------------------------------ the thread

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=0.2)
            except (OSError, ValueError):
                return
            for key, _ in events:
                try:
                    if key.data is None:
                        self._accept()
                    else:
                        self._read(key.fileobj, key.data)
                except Exception as exc:  # nothing a connection sends may stop the channel
                    if key.data is not None:
                        self._drop(key.fileobj)
                    self._refuse(f"a connection was cut off after an error ({type(exc).__name__}: {exc})"[:300])
            self._expire_silent()

    def _refuse(self, why: str) -> None:
        with self.new:
            if len(self.refused) < 1000:
                self.refused.append(why)
            self.new.notify_all()

    def _violate(self, why: str) -> None:
        with self.new:
            self.violation = self.violation or why
            self.new.notify_all()

    def _malformed(self, why: str) -> None:
        with self.new:
            if len(self.malformed) < 100:
                self.malformed.append(why)
            self.new.notify_all()

    def _unbound(self) -> list:
        return [k for k in self._sel.get_map().values() if k.data is not None and k.data.rank is None]

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except BlockingIOError:
            return
        except OSError as exc:  # out of file descriptors: shed the silent connections first
            self._refuse(f"could not accept a connection ({exc})")
            for key in self._unbound():
                self._drop(key.fileobj)
            time.sleep(0.05)
            return
        if len(self._unbound()) >= MAX_UNBOUND:
            conn.close()
            self._refuse("too many connections that have not said which rank they are")
            return
        try:
            pid = peer_pid(conn)
        except OSError:
            pid = None
        if _outside_the_job(pid, self._me):
            conn.close()
            self._refuse(f"a connection from pid {pid}, not a process of this job")
            return
        conn.setblocking(False)
        self._sel.register(conn, selectors.EVENT_READ, _Peer(pid, time.monotonic()))
        self._open += 1

    def _expire_silent(self) -> None:
        now = time.monotonic()
        for key in self._unbound():
            if now - key.data.since_s > self.hello_within_s:
                self._drop(key.fileobj)
                self._refuse(f"pid {key.data.pid} connected and never said which rank it is")

    def _drop(self, conn: socket.socket) -> None:
        try:
            self._sel.unregister(conn)
            self._open -= 1
        except (KeyError, ValueError):
            pass
        conn.close()

    def _read(self, conn: socket.socket, peer: _Peer) -> None:
        try:
            data = conn.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        if not data:  # the rank closed its end (it exited)
            self._drop(conn)
            return
        now = time.monotonic()
        peer.bytes_in += len(data)
        if peer.bytes_in > MAX_BYTES_PER_CONNECTION:
            self._drop(conn)
            who = f"rank {peer.rank}" if peer.rank is not None else f"pid {peer.pid}"
            self._violate(f"{who} sent more than {MAX_BYTES_PER_CONNECTION >> 20} MiB of reports (the cap per rank)")
            return
        peer.buffer += data
        while len(peer.buffer) >= FRAME.size:
            (size,) = FRAME.unpack_from(peer.buffer)
            if size > MAX_MESSAGE + 1024:
                self._drop(conn)
                self._refuse(f"pid {peer.pid} sent a message of {size} bytes")
                return
            if len(peer.buffer) < FRAME.size + size:
                return
            frame, peer.buffer = peer.buffer[FRAME.size:FRAME.size + size], peer.buffer[FRAME.size + size:]
            peer.count += 1
            if peer.count > MAX_MESSAGES_PER_CONNECTION:
                self._drop(conn)
                self._refuse(f"rank {peer.rank} (pid {peer.pid}) sent more than {MAX_MESSAGES_PER_CONNECTION} messages")
                return
            if not self._accept_message(conn, peer, frame, now):
                return

    def _accept_message(self, conn: socket.socket, peer: _Peer, frame: bytes, now: float) -> bool:
        try:
            body = json.loads(frame.decode("utf-8", errors="replace"))
            kind = str(body.pop("kind"))
        except (ValueError, KeyError, AttributeError, TypeError, RecursionError):
            self._malformed(f"rank {peer.rank} (pid {peer.pid}): a frame that is not a JSON report")
            return True  # garbled: dropped, noted, the connection kept
        if peer.rank is None:
            claimed = body.get("rank")
            if kind != "hello" or not isinstance(claimed, int) or isinstance(claimed, bool):
                self._refuse(f"pid {peer.pid} sent {kind!r} before saying which rank it is")
                self._drop(conn)
                return False
            if self.expected is not None and claimed not in self.expected:
                self._refuse(f"pid {peer.pid} claimed rank {claimed}, which does not run on this node")
                self._drop(conn)
                return False
            with self.lock:
                taken = claimed in self._bound
                holder = self._bound.get(claimed)
                if not taken:
                    self._bound[claimed] = peer.pid
                    self._conns[claimed] = conn
                    if self._word is not None:  # said before this rank connected: it hears it now
                        _send_word(conn, self._word)
            if taken:
                self._refuse(f"pid {peer.pid} claimed rank {claimed}, already reporting from pid {holder}")
                self._drop(conn)
                return False
            peer.rank = claimed
        problem = reports.check(kind, body)
        if problem:  # dropped: nothing downstream ever reads a value of the wrong type or range
            self._malformed(f"rank {peer.rank} (pid {peer.pid}): {problem}")
            return True
        body["rank"] = peer.rank  # what the kernel vouches for, not what the message says
        with self.new:
            self.messages.append(Message(kind, body, now))
            self.new.notify_all()
        return True

    # ------------------------------------------------------------------ the launcher's word

    def tell(self, kind: str, **body: Any) -> None:
        """Says one word to every rank bound now and to each that binds later, on its own connection: the verdict
        of the check its start-up waits for (harness/ranks/training/loop.py `await_check`). Said once; later words are
        ignored."""
        data = json.dumps({"kind": kind, **body}).encode()
        with self.lock:
            if self._word is not None:
                return
            self._word = FRAME.pack(len(data)) + data
            for conn in self._conns.values():
                _send_word(conn, self._word)

    def bound_ranks(self) -> set[int]:
        with self.lock:
            return set(self._bound)

    # ------------------------------------------------------------------ readers

    def drain(self, timeout_s: float = 3.0) -> None:
        """After the job: wait until every rank's connection has been read to its end (or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.thread.is_alive() and self._open > 0:
            time.sleep(0.02)

    def snapshot(self) -> list[Message]:
        with self.lock:
            return list(self.messages)

    def first(self, kind: str, **match: Any) -> Message | None:
        with self.lock:
            for m in self.messages:
                if m.kind == kind and all(m.body.get(k) == v for k, v in match.items()):
                    return m
        return None

    def all(self, kind: str) -> list[Message]:
        with self.lock:
            return [m for m in self.messages if m.kind == kind]

    def wait(self, timeout_s: float) -> None:
        """Sleep until a new message arrives or the timeout passes."""
        with self.new:
            self.new.wait(timeout_s)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=1.0)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()
        self._sel.close()
        shutil.rmtree(self.dir, ignore_errors=True)  # the socket and the job files beside it
