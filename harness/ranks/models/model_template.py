"""Evaluation's model processes, forked from clean copies of a template that imported torch once.

    python -u -m harness.ranks.models.model_template <run id> <scorer pid> <control fd> [<control fd> ...]

A scorer starts this process before it reads anything (harness/scoring/template.py: ModelTemplate),
with one control socket per model process it will start (two: the scoring one and the check one).
The template imports torch, numpy and the harness's model-process code, and then, before any
request exists, forks one copy per socket. Each copy holds only its own socket, serves exactly one
model process, and can start nothing else (harness/ranks/models/model_worker.py's `main`). It never
imports a submission. It never holds a token, a target or a checkpoint's weights.

Why copies, and not one template that forks twice: a template that had served the scoring process
would carry that history (its pid, its exit code) into the check process's memory, where team code
could read it. That would be a channel from the first model process to the second, and it would tell
each one its role. The copies are forked before either model process exists: they differ only in
which copy they are (the socket each holds, its number, their place in the loop that forked them).
The scorer draws which copy serves which role, so that says nothing of the role. (Timing can: a
check process may see that the template started long ago, as it could see the checkpoint's age
when each model process was a fresh interpreter. Knowing it is second does not let it look ahead
unseen: it never gets the tokens after the cut.)

A model process forked from a copy keeps the code that was loaded and nothing else:
- every descriptor is closed except those its request passed;
- its environment, working folder and first import path are the request's;
- it leads a session of its own;
- torch's and numpy's generators are seeded afresh (Python's `random` reseeds itself at fork).
Python's string-hash secret is the template's; it is fixed when an interpreter starts.
It then enters the sandbox as every model process does (namespaces, a root of its own, Landlock),
on one thread, before anything of the submission is imported. The template and its copies are not
dumpable, so no process of their user can read their memory through /proc. The run id on the
command line lets `ps` (and the tests) tell whose they are.

Messages (JSON, one per SOCK_SEQPACKET datagram, on a copy's socket):
- fork, at most once: {"op": "fork", "cwd", "env", "logits_bytes"}, with four descriptors (its log,
  the requests pipe's read end, the replies pipe's write end, the shared logits buffer)
  -> {"pid"};
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
    """What a model process would import anyway, none of it team code. (numpy's BLAS may start threads
    here; it stops them across a fork, and a forked child has one thread.) CUDA is not started: a
    forked child could not use it."""
    import numpy  # noqa: F401
    import torch

    from harness.ranks import checkpoint, process  # noqa: F401
    from harness.ranks.confine import namespaces, rootfs, sandbox  # noqa: F401
    from harness.ranks.models import model_worker, wire  # noqa: F401
    from harness.submission import contract  # noqa: F401

    sandbox.preload()

    # is_initialized() only: is_available() and device_count() start the driver on a CUDA build, and torch
    # refuses CUDA in every fork of a process that did ("Cannot re-initialize CUDA in forked subprocess").
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialised in the model-process template; its forks could not use it")


def _become_model_process(control: socket.socket, request: dict, fds: list[int]) -> None:
    """In the child: shed the copy's state, then run as a model process. Never returns."""
    try:
        control.close()  # the scorer's channel to the copy is not the model's
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
        import numpy.random
        import torch

        numpy.random.seed()  # Python's `random` reseeds itself in a forked child; these two do not
        torch.seed()
        sys.argv = ["-m", str(requests), str(replies), str(buffer), str(int(request["logits_bytes"]))]
        from harness.ranks.models import model_worker

        model_worker.main(sys.argv)  # leaves with os._exit
    except BaseException:  # noqa: BLE001  (the scorer sees the process die without a report)
        traceback.print_exc()
    finally:
        os._exit(1)


def serve_once(control: socket.socket) -> None:
    """One copy's life: fork one model process on request, then report its exit when asked."""
    child, code = 0, None
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
            if op == "fork" and not child and len(fds) == FORK_FDS:
                child = os.fork()
                if child == 0:
                    _become_model_process(control, request, fds)
                reply = {"pid": child}
            elif op == "wait" and child and int(request.get("pid", 0)) == child:
                deadline = time.monotonic() + max(0.0, float(request.get("timeout_s", 0.0)))
                pause_s = 0.001  # the scorer asks once it has killed the child: it is gone, or nearly
                while code is None:
                    got, status = os.waitpid(child, os.WNOHANG)
                    if got == child:
                        code = os.waitstatus_to_exitcode(status)  # negative: the signal, as subprocess says
                    elif time.monotonic() >= deadline:
                        break
                    else:
                        time.sleep(pause_s)
                        pause_s = min(0.02, pause_s * 2)
                reply = {"pid": child, "code": code}
            else:
                reply = {"error": f"refused: {op!r} with {len(fds)} descriptors (a copy forks once, and waits "
                                  "only for its own child)"}
        except (ValueError, TypeError, OSError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                os.close(fd)
        control.send(json.dumps(reply).encode())


def _fork_copy(mine: int, controls: list[int]) -> int:
    """A copy that keeps `mine` of the control sockets; in the parent, its pid."""
    template = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    for other in controls:
        if other != mine:
            os.close(other)
    _prctl(PR_SET_PDEATHSIG, 9)  # the template gone: so is this copy
    if os.getppid() != template:
        os._exit(1)
    try:
        serve_once(socket.socket(fileno=mine))
    finally:
        os._exit(0)


def main(argv: list[str]) -> None:
    scorer, controls = int(argv[2]), [int(a) for a in argv[3:]]
    _prctl(PR_SET_PDEATHSIG, 9)  # the scorer gone: so is the template (and, through theirs, its children)
    if os.getppid() != scorer:  # it went before the line above took effect
        os._exit(1)
    _prctl(PR_SET_DUMPABLE, 0)
    from harness.ranks.confine.cgroup import offer_to_oom_killer

    offer_to_oom_killer()  # its copies run team code: the first to go when memory runs out, never the scorer
    _preload()
    sys.stdout.flush()
    sys.stderr.flush()
    # Every copy before any request, none holding a list of the others: each is the same but for its socket.
    copies = [_fork_copy(mine, controls) for mine in controls]
    for fd in controls:
        os.close(fd)
    for pid in copies:  # then nothing but waiting: the scorer ends the template when it is done
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
