"""The rank side: every process that runs a team's code, and what it imports; the attack surface.

- here: what every such process shares (process.py: start-up and exit, interpreter.py, jobs.py,
  channel.py, the checkpoint, the FLOP counter), the open division's rank (open_rank.py, and
  open_api.py, which a team's script imports) and the doctor's rank;
- training/: the fixed loop's training ranks (train.py, the loop in loop.py, the ranks' clock in clock.py);
- confine/: what confines every process that runs team code: Landlock, seccomp, namespaces, its own
  root, the scratch folders;
- models/: the processes that load a team's model outside training: the check before a run
  (preflight.py) and evaluation's model processes (model_worker.py, forked from model_template.py).

It imports nothing from harness/launcher, harness/results or harness/scoring, nor click, pandas or
matplotlib (tests/test_architecture.py keeps that true).
"""
