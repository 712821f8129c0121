"""The launcher's end of the control channel from its ranks (the ranks' end: harness/ranks/channel.py).

Each rank connects one SOCK_SEQPACKET Unix socket (message boundaries kept, never blocks the
rank: a full buffer drops the report, counted). The kernel tells the launcher who connected
(SO_PEERCRED: pid and uid, taken at connect time, which the sender cannot forge), so:

- a connection from a process that is not one of the launcher's own descendants (another team's
  job that found the socket, say) is refused and noted;
- a connection's first message must be `hello` for one of this node's ranks; that binds the
  connection to the rank, and every later message on it is that rank's, whatever it claims;
- a second connection claiming a rank already bound (a process the submission started,
  pretending to be rank 0) is refused and noted, and the run is flagged.

Every message is stamped on arrival with the launcher's own monotonic clock: its measurement of
the training window does not trust the ranks' clocks.

Messages (`kind`): hello (rank, pid), setup_start, train_start, progress (step, loss, tokens...),
train_end, result (what a rank measured), error (a rank's failure, with traceback), eval_result.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import socket
import struct
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from harness.ranks.channel import MAX_MESSAGE  # one limit for both ends of the protocol



@dataclass
class Message:
    kind: str
    body: dict[str, Any]
    received_s: float  # launcher's time.monotonic() at arrival


@dataclass
class _Peer:
    pid: int
    rank: int | None = None


def _peer_pid(conn: socket.socket) -> tuple[int, int]:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


def _is_descendant(pid: int, ancestor: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return any(p.pid == ancestor for p in proc.parents())
    except psutil.Error:
        return False


class ChannelServer:
    """Launcher side: listens in a private temporary folder and collects messages in a thread."""

    def __init__(self, expected_ranks: list[int] | None = None) -> None:
        # A short private path: Unix socket paths are limited to ~107 bytes, run dirs can be long.
        self.dir = Path(tempfile.mkdtemp(prefix="harness-ch-"))
        self.path = str(self.dir / "ch.sock")
        self.expected = set(expected_ranks) if expected_ranks is not None else None
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(self.path)
        self.sock.listen(256)
        self.sock.setblocking(False)
        self.messages: list[Message] = []
        self.refused: list[str] = []  # who tried to report and was turned away, and why
        self.lock = threading.Lock()
        self.new = threading.Condition(self.lock)
        self._bound: dict[int, int] = {}  # rank -> pid
        self._stop = threading.Event()
        self._me, self._uid = os.getpid(), os.getuid()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        self.thread = threading.Thread(target=self._serve, name="harness-channel", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ the thread

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._sel.select(timeout=0.2)
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.fileobj, key.data)

    def _refuse(self, why: str) -> None:
        with self.new:
            self.refused.append(why)
            self.new.notify_all()

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        try:
            pid, uid = _peer_pid(conn)
        except OSError:
            conn.close()
            return
        if uid != self._uid or not _is_descendant(pid, self._me):
            conn.close()
            self._refuse(f"a connection from pid {pid} (uid {uid}), not a process of this job")
            return
        conn.setblocking(False)
        self._sel.register(conn, selectors.EVENT_READ, _Peer(pid))

    def _drop(self, conn: socket.socket) -> None:
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def _read(self, conn: socket.socket, peer: _Peer) -> None:
        try:
            data = conn.recv(MAX_MESSAGE + 1024)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        if not data:  # the rank closed its end (it exited)
            self._drop(conn)
            return
        now = time.monotonic()
        try:
            body = json.loads(data.decode("utf-8", errors="replace"))
            kind = str(body.pop("kind"))
        except (ValueError, KeyError, AttributeError, TypeError):
            return  # garbled: ignore rather than crash the launcher
        if peer.rank is None:
            claimed = body.get("rank")
            if kind != "hello" or not isinstance(claimed, int):
                self._refuse(f"pid {peer.pid} sent {kind!r} before saying which rank it is")
                self._drop(conn)
                return
            if self.expected is not None and claimed not in self.expected:
                self._refuse(f"pid {peer.pid} claimed rank {claimed}, which does not run on this node")
                self._drop(conn)
                return
            with self.lock:
                holder = self._bound.get(claimed)
                if holder is None:
                    self._bound[claimed] = peer.pid
            if holder is not None:
                self._refuse(f"pid {peer.pid} claimed rank {claimed}, already reporting from pid {holder}")
                self._drop(conn)
                return
            peer.rank = claimed
        body["rank"] = peer.rank  # what the kernel vouches for, not what the message says
        with self.new:
            self.messages.append(Message(kind, body, now))
            self.new.notify_all()

    # ------------------------------------------------------------------ readers

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
