"""One training rank, started by torch elastic, never by hand:

    python -u -m harness.ranks.train <train_job.json>

The process around the fixed loop (harness/ranks/loop.py): it ties itself to the launcher, moves
into its private folder, sends its output to its own log, says hello on the control channel,
then trains; whatever happens becomes a report (a result, or an error with its traceback), and
the process leaves through the one clean exit path. Imports stay light until the loop starts.
"""

from __future__ import annotations

import os
import sys

from harness.ranks.process import RankEnv, describe_failure, die_with_launcher, redirect_output, release_and_exit


def main(argv: list[str]) -> None:
    from harness.ranks.channel import ChannelClient
    from harness.ranks.jobs import TrainJob

    job = TrainJob.load(argv[1])
    env = RankEnv.from_environ()
    die_with_launcher()
    if job.work_dir:
        os.chdir(job.work_dir)  # the private folder: files a submission writes land there, not in runs/
    redirect_output(f"{job.log_dir}/rank{env.rank}.log")
    channel = ChannelClient(job.channel_path, env.rank)
    channel.send("hello", pid=os.getpid(), local_rank=env.local_rank, group_rank=env.group_rank,
                 world_size=env.world_size)
    holders: list = []
    code = 0
    try:
        from harness.ranks.loop import train

        result = train(job, env, channel, holders)
        channel.send("result", **result)
    except BaseException as exc:  # every failure becomes a report; SystemExit and Ctrl-C included
        report = describe_failure(exc)
        print(report["traceback"], file=sys.stderr, flush=True)
        channel.send("error", **report)
        code = 1
    release_and_exit(code, holders)


if __name__ == "__main__":
    main(sys.argv)
