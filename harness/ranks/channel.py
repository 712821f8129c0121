"""A rank's end of the control channel to its launcher (the launcher's end: harness/launcher/channel.py).

Ranks report here instead of writing results themselves; the launcher stamps each message on
arrival with its own clock and knows, from the kernel, which process sent it. One connected
SOCK_SEQPACKET socket per rank, opened before any submission code is imported. Sending never
raises and never blocks training: a full or vanished socket drops the message, counted.
"""

from __future__ import annotations

import json
import socket
from typing import Any

MAX_MESSAGE = 60_000  # under the launcher's receive size and the socket buffer; long tracebacks are cut


class ChannelClient:
    def __init__(self, path: str | None, rank: int):
        self.path, self.rank = path, rank
        self.sock = None
        self.dropped = 0
        if path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
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
            if len(data) > MAX_MESSAGE:
                data = json.dumps({"kind": kind, "rank": self.rank, "message": "report too large to send"}).encode()
        try:
            self.sock.send(data)
        except OSError:
            self.dropped += 1

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
