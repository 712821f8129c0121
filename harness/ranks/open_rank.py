"""One open-division rank, started by torch elastic, never by hand:

    python -u -m harness.ranks.open_rank <open_job.json>

The same process around the team's script as harness/ranks/training/train.py puts around the fixed loop:
tied to the launcher, output to its own log, hello on the control channel, the sandbox entered
while the process has one thread; then the team's `train.py` runs as `__main__` with the starter
kit's arguments (runpy, in this process: torch elastic's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT are in the environment, and the script starts its own process group).

The script's clock is its own; the launcher's is the one enforced (harness/launcher/control/watch.py):
this wrapper says when the rank started ("setup_start"), the script may say when its first
forward ran (harness/ranks/open_api.py), and the hard kill holds whatever it says. A script that
returns (or exits with code 0) is a finished rank, once its non-daemon threads are done (told to
stop first, as Python's exit tells them: an idle thread pool is not a running save); an
exception or a non-zero exit is a failure report, as in the fixed loop. A script that leaves with
os._exit skips its report and ends `crashed`.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
from pathlib import Path

from harness.ranks.process import (RankEnv, SandboxMissing, describe_failure, die_with_launcher, enter_job,
                                   hello_and_sandbox, release_and_exit)


class ScriptExit(RuntimeError):
    """The script called sys.exit with a failure code."""


def _peak_mem_gib() -> float | None:
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux: the process's peak


def run_script(job: dict) -> None:
    folder = Path(job["submission_dir"])
    script = folder / job["script"]
    sys.argv = [str(script), *job["argv"]]
    sys.path.insert(0, str(folder))  # `from model import GPT`, as under `python train.py`
    os.chdir(folder)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise ScriptExit(f"{job['script']} exited with code {exc.code!r}") from None
    finish_threads()


def finish_threads() -> None:
    """What the interpreter's own exit does with the script's threads, in its order: first the
    callbacks that tell helper threads to stop (concurrent.futures registers one: the idle pool
    torch.compile leaves behind waits on its queue until told, and would be joined forever), then a
    join of every non-daemon thread (an asynchronous checkpoint save finishes). The launcher's hard
    limit bounds the wait."""
    for call in reversed(list(threading._threading_atexits)):  # CPython 3.9+: an AttributeError, never a silent hang
        try:
            call()
        except Exception:  # noqa: BLE001  (one helper's failure must not keep the others running)
            pass
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()


def main(argv: list[str]) -> None:
    from harness.ranks import open_api
    from harness.ranks.confine import cgroup

    job = json.loads(Path(argv[1]).read_text())  # plain JSON: nothing that starts threads before the sandbox
    env = RankEnv.from_environ()
    die_with_launcher()
    held = cgroup.join_from_environment()  # the very first act: all it starts is born in the job's cgroup
    job_ns = enter_job(job.get("job_namespace"))  # single-threaded, before anything else
    channel, box = hello_and_sandbox(job, env, job_ns, held,
                                     "the job asked for no sandbox (track setting sandbox = \"off\")")
    code = 0
    try:
        if not box.active and job.get("sandbox") == "required":
            raise SandboxMissing(f"the track requires the sandbox and it is not available here: {box.why}")
        if held and not held["active"]:  # the launcher made it, and it could not be joined: the machine's fault
            raise SandboxMissing(held["why"])
        if job.get("job_namespace") and not job_ns["active"]:  # beside ranks that did: never a half-isolated job
            raise RuntimeError(f"this rank could not enter its job's namespace: {job_ns['why']}")
        # torch elastic's error file (the starter kits' @record writes it when the script raises) is in the
        # launcher's folder, which no rank may write: the write's own error would replace the team's. In the
        # rank's temporary folder it is written and read by no one; the failure report carries the error.
        os.environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(os.environ.get("TMPDIR") or job["submission_dir"],
                                                             f"torchelastic-error-rank{env.rank}.json")
        open_api._channel = channel
        channel.send("setup_start")  # the rank is up: the team's start-up allowance runs from here
        run_script(job)
        open_api._ended = True  # nothing the script's leftovers report counts now
        open_api._channel = None
        channel.send("result", peak_mem_gib=_peak_mem_gib(), division="open")
    except BaseException as exc:  # every failure becomes a report; SystemExit and Ctrl-C included
        open_api._channel = None
        report = describe_failure(exc, job.get("submission_dir"), job.get("device"))
        print(report["traceback"], file=sys.stderr, flush=True)
        channel.send("error", **report)
        code = 1
    channel.close()
    release_and_exit(code, [])


if __name__ == "__main__":
    main(sys.argv)
