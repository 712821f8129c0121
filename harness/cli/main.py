"""The `harness` click group, and what its commands share: the usage error, the overrides, how the process
leaves (`entry`: no teardown once torch is loaded), and the leaderboard refreshed after a run."""

from __future__ import annotations

import sys

import click

from harness import __version__


class SetupError(click.ClickException):
    """A usage or setup problem: one line, exit code 2, no run record (nothing ran)."""

    exit_code = 2


def _overrides(**values) -> dict:
    return {k: v for k, v in values.items() if v is not None}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="harness")
def main() -> None:
    """speedrun-harness: train a submission on a hard clock, score it, rank it."""


def exit_without_teardown(code: int) -> None:
    """Leave as the interpreter's own exit does, less its teardown of the modules' objects.

    A command that ran ranks has torch loaded, and freeing every object of every module at exit
    costs about a CPU-second on a small CPU (`python -c "import torch"`: 3.0 s; with os._exit at
    the end: 2.2 s). The steps of a normal exit are taken in its order: the threading module's
    shutdown (its exit callbacks, such as concurrent.futures' pools, then a join of every
    non-daemon thread), the atexit callbacks (logging's flush, weakref finalizers such as
    temporary folders'), the standard streams flushed (a failed flush exits 120, as Python does).
    What is skipped: objects' __del__ and the closing of files still open at that point (the
    harness closes what it writes before a command returns), and the freeing of memory."""
    import atexit
    import os
    import threading

    if threading.current_thread() is not threading.main_thread():
        sys.exit(code)  # the normal exit, which would also wait for this very thread
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, say: Python's own exit says 120
            code = code or 120
    os._exit(code)


def entry() -> None:
    """The `harness` console script and `python -m harness`: the click group, then, where the command
    loaded torch (run, eval, scale), the exit without teardown. Only here, at the very end of the
    process, never inside a command, so that calling `main` from Python (click's CliRunner, a
    profiler) returns or raises as any click command does."""
    try:
        main()
    except SystemExit as done:
        if "torch" in sys.modules and (done.code is None or isinstance(done.code, int)):
            exit_without_teardown(done.code or 0)
        raise


def _refresh_leaderboard(runs_dir, track: str, reporter) -> None:
    """Keep the track's leaderboard current; a failure here never changes the run's outcome."""
    from harness.results.records import leaderboard_root, plots_root, runs_root
    from harness.results.views import rebuild

    try:
        root = runs_root(runs_dir)
        out = rebuild(root, track, leaderboard_root(runs=root), plots_root(runs=root))
        reporter.info(f"leaderboard {out.html} ({out.ranked} ranked of {out.teams} teams)")
        if out.chart_error:
            reporter.error(f"the leaderboard's charts could not be drawn ({out.chart_error}); the tables are written")
    except Exception as exc:  # the record is written; the view can be rebuilt with `harness leaderboard`
        reporter.error(f"leaderboard not refreshed ({type(exc).__name__}: {exc}); run `harness leaderboard`")
