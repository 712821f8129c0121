"""The `harness` command: a thin layer that parses options and calls the library.

main.py holds the click group and what the commands share; each other module adds its commands to it:
runs.py (run, check, eval, scale, data prepare), views.py (leaderboard, compare), event.py (queue, slurm,
rehearse, flag, unflag, finalize, doctor). queues.py is the queue's glue that run and the event share.
"""

from harness.cli.main import SetupError, entry, exit_without_teardown, main  # noqa: F401
from harness.cli import event, runs, views  # noqa: E402,F401  (each module adds its commands to `main`)

__all__ = ["SetupError", "entry", "exit_without_teardown", "main"]
