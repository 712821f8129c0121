"""The rank side: everything a process that runs a team's code imports. Training ranks and
evaluation ranks (started by torch elastic) and the submission check process live here.

This is the attack surface: whatever is imported here shares a process with the submission.
It imports nothing from harness/launcher or harness/results, nor click, pandas or matplotlib
(tests/test_architecture.py keeps that true).
"""
