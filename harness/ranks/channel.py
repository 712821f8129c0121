"""A rank's end of the control channel to its launcher (the launcher's end: harness/launcher/channel.py).

Ranks report here instead of writing results themselves; the launcher stamps each message on
arrival with its own clock. Sending never raises and never blocks training: a full or vanished
socket drops the message, and the drops are counted.
"""

from __future__ import annotations

import json
import socket
from typing import Any

MAX_DATAGRAM = 60_000  # well under the default socket buffer; long tracebacks are cut


class ChannelClient:
    """Rank side. Never raises and never blocks: reporting must not be able to stall a step."""

    def __init__(self, path: str | None, rank: int):
        self.path, self.rank = path, rank
        self.sock = None
        self.dropped = 0
        if path:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.sock.setblocking(False)

    def send(self, kind: str, **body: Any) -> None:
        if self.sock is None:
            return
        body = {"kind": kind, "rank": self.rank, **body}
        data = json.dumps(body, default=str).encode()
        if len(data) > MAX_DATAGRAM:
            for key in ("traceback", "message"):
                if isinstance(body.get(key), str):
                    body[key] = body[key][-20_000:]
            data = json.dumps(body, default=str).encode()
            if len(data) > MAX_DATAGRAM:
                data = json.dumps({"kind": kind, "rank": self.rank, "message": "report too large to send"}).encode()
        try:
            self.sock.sendto(data, self.path)
        except OSError:
            self.dropped += 1

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
