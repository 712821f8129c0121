"""A rank's end of the control channel to its launcher (the launcher's end: harness/launcher/control/channel.py).

Ranks report here instead of writing results themselves; the launcher stamps each message on
arrival with its own clock and knows, from the kernel, which process sent it. One Unix stream
connection per rank, opened before any submission code is imported; each message is a frame:
4 bytes of length (little-endian), then JSON.

Sending never raises and never blocks training: what the socket cannot take now waits in a small
queue that later sends flush; when the queue is full, new reports are dropped and counted. At
exit, `flush` waits briefly for the queue to drain, so a rank's last report (its result or its
error) is not lost.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any

MAX_MESSAGE = 60_000  # bytes of JSON; long tracebacks are cut to fit
MAX_QUEUED = 1 << 20  # bytes waiting for the launcher before new reports are dropped
FRAME = struct.Struct("<I")


class ChannelClient:
    def __init__(self, path: str | None, rank: int):
        self.path, self.rank = path, rank
        self.sock = None
        self.dropped = 0
        self.queued = b""
        if path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(path)
            except OSError:  # no launcher to report to: every report will count as dropped
                self.sock.close()
                self.sock = None
                self.dropped += 1
                return
            self.sock.setblocking(False)

    def send(self, kind: str, **body: Any) -> None:
        if self.sock is None:
            if self.path:
                self.dropped += 1
            return
        body = {"kind": kind, "rank": self.rank, **body}
        data = json.dumps(body, default=str).encode()
        if len(data) > MAX_MESSAGE:
            for key in ("traceback", "message"):
                if isinstance(body.get(key), str):
                    body[key] = body[key][-20_000:]
            data = json.dumps(body, default=str).encode()
            if len(data) > MAX_MESSAGE:  # said as an error: a result the launcher never sees is not a success
                data = json.dumps({"kind": "error", "rank": self.rank, "status": "crashed", "cause": "exception",
                                   "reason": f"the {kind} report was too large to send ({len(data)} bytes: a CONFIG "
                                             "this large?)", "traceback": ""}).encode()
        if len(self.queued) + len(data) + FRAME.size > MAX_QUEUED:
            self.dropped += 1
            self._push()
            return
        self.queued += FRAME.pack(len(data)) + data
        self._push()

    def _push(self) -> None:
        """Send what the socket takes now; keep the rest (never half a frame lost: a stream keeps order)."""
        while self.queued:
            try:
                sent = self.sock.send(self.queued)
            except BlockingIOError:
                return
            except OSError:  # the launcher is gone: nothing more can be reported
                self.dropped += 1
                self.queued = b""
                return
            self.queued = self.queued[sent:]

    def wait_for_word(self) -> dict[str, Any]:
        """The launcher's one message to this rank (harness/launcher/control/channel.py `tell`), waited for while
        the reports queued so far keep leaving; a launcher that closes the channel says stop."""
        if self.sock is None:
            return {"kind": "stop", "why": "no control channel to hear the launcher's word on"}
        buffer = b""
        while True:
            self._push()
            ready, _, _ = select.select([self.sock], [], [], 0.05 if self.queued else 1.0)
            if not ready:
                continue
            try:
                data = self.sock.recv(1 << 12)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                return {"kind": "stop", "why": "the launcher closed the control channel before training"}
            buffer += data
            if len(buffer) >= FRAME.size:
                (size,) = FRAME.unpack_from(buffer)
                if len(buffer) >= FRAME.size + size:
                    word = json.loads(buffer[FRAME.size:FRAME.size + size])
                    return word if isinstance(word, dict) else {"kind": "stop", "why": "an unreadable word"}

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait (briefly) until every queued report has left; True when none is left behind."""
        deadline = time.monotonic() + timeout_s
        while self.sock is not None and self.queued and time.monotonic() < deadline:
            self._push()
            if self.queued:
                time.sleep(0.01)
        return not self.queued

    def close(self) -> None:
        if self.sock is not None:
            self.flush()
            self.sock.close()
            self.sock = None
