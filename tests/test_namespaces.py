"""Evaluation's model processes in their own namespaces: what the scoring process leaves behind is
not there for the check process that runs after it (harness/ranks/namespaces.py)."""

import json
import subprocess
import sys
import time

import psutil

WRITER = """
import ctypes, json, os, sys
from harness.ranks.namespaces import isolate
why = isolate()
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x5EC12E7, 4096, 0o1666)  # IPC_CREAT: a segment the next process could open
key = libc.syscall(248, b"user", b"answers", b"next=17", 7, -4)  # add_key to the user keyring
print(json.dumps({"why": why, "pid": os.getpid(), "shm": shm, "key": key}), flush=True)
"""
READER = """
import ctypes, json, socket
from harness.ranks.namespaces import isolate
why = isolate()
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x5EC12E7, 4096, 0o666)
key = libc.syscall(250, 10, -4, b"user", b"answers", 0)  # KEYCTL_SEARCH in the user keyring
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
    udp = "sent"
except OSError as exc:
    udp = str(exc)
print(json.dumps({"why": why, "shm": shm, "key": key, "udp": udp}), flush=True)
"""
HOPPER = """
import os, time
from harness.ranks.namespaces import isolate
assert isolate() == ""
print(os.getpid(), flush=True)  # 1: the namespace's init
if os.fork() == 0:  # a chain that forks its successor and lets its parent die, faster than any scan
    while True:
        if os.fork() == 0:
            os.setsid()
            time.sleep(0.002)
            continue
        os._exit(0)
time.sleep(60)
"""


def run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_what_one_model_process_leaves_in_kernel_ipc_the_next_cannot_see():
    wrote = run(WRITER)
    assert wrote["why"] == "" and wrote["pid"] == 1, wrote  # isolated: PID 1 of its own namespace
    assert wrote["shm"] >= 0 and wrote["key"] > 0  # it could make them, in its own namespaces
    read = run(READER)
    assert read["shm"] == -1 and read["key"] == -1, read  # gone with the namespaces they were made in
    assert "unreachable" in read["udp"].lower(), read  # no loopback to talk over either


def test_a_process_that_forks_faster_than_anyone_looks_dies_with_the_model_process():
    proc = subprocess.Popen([sys.executable, "-c", HOPPER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "1"
    time.sleep(0.5)
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert tree, "the model process forked nothing"
    proc.kill()  # what the scorer does to a model process: the waiting parent goes, then its child, PID 1
    proc.wait(timeout=10)
    time.sleep(0.5)
    alive = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and HOPPER.strip()[:20] in " ".join(p.info["cmdline"])]
    assert alive == [], f"{len(alive)} process(es) of the namespace survived"
