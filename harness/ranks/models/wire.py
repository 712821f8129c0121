"""The messages between a scorer and its model processes: two pipes and a shared buffer.

Little-endian; every message is a fixed header (magic, kind, three integers, payload length)
and a payload of at most MAX_PAYLOAD[kind] bytes. Nothing is pickled: neither side ever turns the other's bytes into objects that
could run code.

- scorer -> model process: `setup` (JSON: checkpoint, submission folder, device, precision,
  threads, the sandbox policy), `batch` (rows, seq_len; int64 tokens), `quit`;
- model process -> scorer: `sandbox` (JSON: the sandbox report, sent right after the sandbox is
  entered, before any team code is imported: the one the scorer records), `ready`
  (JSON: parameters), `logits` (rows,
  seq_len, dtype code; the values are in the shared buffer), `error` (JSON: status, reason,
  traceback).
"""

from __future__ import annotations

import os
import struct

MAGIC = b"HRNS"
HEADER = struct.Struct("<4sIIIIQ")  # magic, kind, a, b, c, payload bytes
SETUP, BATCH, QUIT = 1, 2, 3
READY, LOGITS, ERROR, SANDBOX = 11, 12, 13, 14
DTYPES = {1: "float32", 2: "bfloat16", 3: "float16"}
# The largest payload of each kind, checked before any of it is read: a model process runs team code
# and must not make the scorer read (and hold) whatever size its header names. Logits travel in the
# shared buffer, never in a payload.
MAX_PAYLOAD = {SETUP: 1 << 20, BATCH: 1 << 30, QUIT: 0,
               READY: 1 << 16, SANDBOX: 1 << 20, LOGITS: 0, ERROR: 1 << 22}


def read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the pipe")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def send(fd: int, kind: int, a: int = 0, b: int = 0, c: int = 0, payload: bytes = b"") -> None:
    write_all(fd, HEADER.pack(MAGIC, kind, a, b, c, len(payload)) + payload)


def receive(fd: int) -> tuple[int, int, int, int, bytes]:
    magic, kind, a, b, c, size = HEADER.unpack(read_exact(fd, HEADER.size))
    if magic != MAGIC:
        raise ValueError("not a harness message")
    if kind not in MAX_PAYLOAD:
        raise ValueError(f"unknown message kind {kind}")
    if size > MAX_PAYLOAD[kind]:
        raise ValueError(f"a message of kind {kind} with {size} bytes of payload (at most {MAX_PAYLOAD[kind]})")
    return kind, a, b, c, read_exact(fd, size) if size else b""


