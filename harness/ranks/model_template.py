"""Evaluation's model processes, forked from a clean template that imported torch once.

    python -u -m harness.ranks.model_template <control socket fd> <scorer pid>

A scorer starts this process before it reads anything (harness/scoring/workers.py: ModelTemplate).
It imports what every model process loads before its sandbox (torch, numpy and the harness's own
model-process code), then only waits on the one socket its scorer holds. It never imports a
submission, never holds a token, a target or a checkpoint's weights, and can start nothing but a
model process (harness/ranks/model_worker.py's `main`). Each of the scorer's two model processes is
a fork of it: as clean as a fresh `python -m harness.ranks.model_worker`, without paying torch's
import again (seconds per process on a small CPU), and the check process starts the moment the
scoring one is dead.

What a child keeps of the template is the code it loaded and nothing else: every descriptor but
those its request passed is closed, its environment, working directory and import path are the
request's, it leads a session of its own, its random generators are seeded afresh, and it then
enters the sandbox as every model process does (namespaces, a root of its own, Landlock) before
anything of the submission is imported. The template itself is not dumpable: no process of its user
can read or write its memory through /proc.

Messages (JSON, one per SOCK_SEQPACKET datagram):
- fork: {"op": "fork", "cwd", "env", "logits_bytes"} with four descriptors (its log, the requests
  pipe's read end, the replies pipe's write end, the shared logits buffer) -> {"pid"}
- wait: {"op": "wait", "pid", "timeout_s"} -> {"pid", "code"}: the exit code as subprocess reports
  it (negative: killed by that signal), null if it is still running after `timeout_s`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback

FORK_FDS = 4  # log, requests, replies, logits buffer
MESSAGE_MAX_BYTES = 1 << 20
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _preload() -> None:
    """What every model process imports before its sandbox and before the submission: nothing here
    runs team code, and none of it starts a thread that must survive a fork."""
    import numpy  # noqa: F401
    import torch  # noqa: F401

    from harness.ranks import checkpoint, model_worker, namespaces, rootfs, sandbox, wire  # noqa: F401
    from harness.submission import contract  # noqa: F401


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)


def _wait(pid: int, timeout_s: float, codes: dict[int, int]) -> int | None:
    deadline = time.monotonic() + max(0.0, timeout_s)
    while pid not in codes:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return None
        if got == pid:
            codes[pid] = _exit_code(status)
            break
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
    return codes[pid]


def _become_model_process(control: socket.socket, request: dict, fds: list[int]) -> None:
    """In the child: shed the template's state, then run as a model process. Never returns."""
    try:
        control.close()  # the scorer's channel to the template is not the model's
        log, requests, replies, buffer = fds
        os.setsid()
        _prctl(PR_SET_DUMPABLE, 1)  # its own /proc files are its own again (namespaces.isolate writes them)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        keep = {0, 1, 2, requests, replies, buffer}
        for name in os.listdir("/proc/self/fd"):
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass  # the listing's own descriptor, closed already
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in request["env"].items()})
        sys.path[0] = request["cwd"]  # as `python -m` in that folder would have it
        import numpy.random  # Python's `random` reseeds itself in a forked child; numpy's generator does not

        numpy.random.seed()
        sys.argv = ["-m", str(requests), str(replies), str(buffer), str(int(request["logits_bytes"]))]
        from harness.ranks import model_worker

        model_worker.main(sys.argv)  # leaves with os._exit
    except BaseException:  # noqa: BLE001  (the scorer sees the process die without a report)
        traceback.print_exc()
    finally:
        os._exit(1)


def serve(control: socket.socket) -> None:
    codes: dict[int, int] = {}
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(control, MESSAGE_MAX_BYTES, FORK_FDS)
        except OSError:
            return
        if not data:  # the scorer closed its end
            for fd in fds:
                os.close(fd)
            return
        try:
            request = json.loads(data)
            op = request.get("op") if isinstance(request, dict) else None
            if op == "fork" and len(fds) == FORK_FDS:
                pid = os.fork()
                if pid == 0:
                    _become_model_process(control, request, fds)
                reply = {"pid": pid}
            elif op == "wait":
                pid = int(request["pid"])
                reply = {"pid": pid, "code": _wait(pid, float(request.get("timeout_s", 0.0)), codes)}
            else:
                reply = {"error": f"unknown request {op!r} with {len(fds)} descriptors"}
        except (ValueError, KeyError, TypeError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        control.send(json.dumps(reply).encode())


def main(argv: list[str]) -> None:
    control = socket.socket(fileno=int(argv[1]))
    _prctl(PR_SET_PDEATHSIG, 9)  # the scorer gone: so is the template (and, through theirs, its children)
    if os.getppid() != int(argv[2]):  # it went before the line above took effect
        os._exit(1)
    _prctl(PR_SET_DUMPABLE, 0)
    _preload()
    sys.stdout.flush()
    sys.stderr.flush()
    serve(control)
    os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
