"""One training rank, started by torch elastic, never by hand:

    python -u -m harness.ranks.training.train <train_job.json>

The process around the fixed loop (harness/ranks/training/loop.py): it ties itself to the launcher, moves
into its private folder, sends its output to its own log, says hello on the control channel,
enters the sandbox (harness/ranks/confine/sandbox.py) while it still has one thread, then trains;
whatever happens becomes a report (a result, or an error with its traceback), and the process
leaves through the one clean exit path. Nothing that starts threads (numpy, torch) is imported
before the sandbox.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from harness.ranks.process import (RankEnv, SandboxMissing, describe_failure, die_with_launcher, enter_job,
                                   hello_and_sandbox, release_and_exit)


def main(argv: list[str]) -> None:
    from harness.ranks.confine import cgroup

    raw = json.loads(Path(argv[1]).read_text())  # plain JSON: nothing that starts threads before the sandbox
    env = RankEnv.from_environ()
    die_with_launcher()
    held = cgroup.join_from_environment()  # the very first act: all it starts is born in the job's cgroup
    job_ns = enter_job(raw.get("job_namespace"), raw.get("work_dir"))  # single-threaded, before anything else
    if raw.get("work_dir"):
        os.chdir(raw["work_dir"])  # the private folder: files a submission writes land there, not in runs/
    channel, box = hello_and_sandbox(raw, env, job_ns, held, "the job asked for no sandbox (track setting "
                                     "sandbox = \"off\", or harness scale)")
    holders: list = []
    code = 0
    try:
        if not box.active and raw.get("sandbox") == "required":
            raise SandboxMissing(f"the track requires the sandbox and it is not available here: {box.why}")
        if held and not held["active"]:  # the launcher made it, and it could not be joined: the machine's fault
            raise SandboxMissing(held["why"])
        if raw.get("job_namespace") and not job_ns["active"]:  # beside ranks that did: never a half-isolated job
            raise RuntimeError(f"this rank could not enter its job's namespace: {job_ns['why']}")
        from harness.ranks.jobs import TrainJob
        from harness.ranks.training.loop import train

        result = train(TrainJob.from_dict(raw), env, channel, holders)
        channel.send("result", **result)  # its sandbox report went first, before any team code ran
    except BaseException as exc:  # every failure becomes a report; SystemExit and Ctrl-C included
        report = describe_failure(exc, raw.get("submission_dir"), raw.get("device"))
        print(report["traceback"], file=sys.stderr, flush=True)
        channel.send("error", **report)
        code = 1
    channel.close()  # the last report (result or error) must reach the launcher before the process goes
    release_and_exit(code, holders)


if __name__ == "__main__":
    main(sys.argv)
