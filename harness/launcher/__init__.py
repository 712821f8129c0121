"""The launcher: everything that runs in the `harness` command's own process, in five rooms.

- run/: one run, phase by phase: the check, training, evaluation, and the record assembled (runner.py);
- control/: a job's processes: started (torch elastic), watched against the clock, ended (watch.py,
  process_tree.py), and the channel, caps, guard and heartbeat around them;
- event/: the event's commands over many runs: the queue, SLURM, finalize, the rehearsal;
- doctor/: is this node ready for the event: the table of checks;
- scaling/: weak scaling, measured and predicted.

No submission code ever runs here: a submission is imported only in the processes under harness/ranks/.
A room imports only rooms listed after it above (tests/test_architecture.py): control imports none.
"""
