"""The launcher's end of the control channel from its ranks: small JSON datagrams over a Unix socket.

Ranks report here instead of writing results themselves: the launcher stamps every message
with its own clock on arrival (its measurement of the training window does not trust the
ranks' clocks) and is the only process that writes records.

Messages (`kind`): hello (rank, pid), train_start, progress (step, loss, tokens...),
train_end, result (what a rank measured), error (a rank's failure, with traceback),
eval_result. The ranks' end is harness/ranks/channel.py.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_DATAGRAM = 60_000  # well under the default socket buffer; long tracebacks are cut


@dataclass
class Message:
    kind: str
    body: dict[str, Any]
    received_s: float  # launcher's time.monotonic() at arrival


class ChannelServer:
    """Launcher side: binds a socket in a private temporary folder and collects messages."""

    def __init__(self) -> None:
        # A short private path: Unix socket paths are limited to ~107 bytes, run dirs can be long.
        self.dir = Path(tempfile.mkdtemp(prefix="harness-ch-"))
        self.path = str(self.dir / "ch.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[Message] = []
        self.lock = threading.Lock()
        self.new = threading.Condition(self.lock)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="harness-channel", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(MAX_DATAGRAM + 1024)
            except socket.timeout:
                continue
            except OSError:
                return
            now = time.monotonic()
            try:
                body = json.loads(data.decode("utf-8", errors="replace"))
                kind = str(body.pop("kind"))
            except (ValueError, KeyError, AttributeError):
                continue  # not ours, or garbled: ignore rather than crash the launcher
            with self.new:
                self.messages.append(Message(kind, body, now))
                self.new.notify_all()

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
        try:
            self.sock.close()
        finally:
            self.thread.join(timeout=1.0)
            shutil.rmtree(self.dir, ignore_errors=True)  # the socket and the job files beside it
