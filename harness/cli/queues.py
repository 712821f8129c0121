"""The queue's glue between the commands: the queue of a command line, what a resumed queue runs, and its table
(harness/launcher/event/queue.py is the queue itself). Used by `harness run` and by the event's commands."""

from __future__ import annotations


def queue_of(submissions, track, runs_dir, seed, repeat, overrides):
    """The queue of these arguments (harness/launcher/event/queue.py)."""
    from harness.launcher.event.queue import build
    from harness.results.records import runs_root

    return build(list(submissions), track, runs_root(runs_dir), seed, repeat, overrides)


def pending_runs(submissions, track, runs_dir, seed, repeat, overrides, resume, reporter) -> list[tuple[str, int]]:
    """Every submission x seed, interleaved (A B C A B C); with --resume only those not settled."""
    if not resume and len(submissions) == 1:
        return [(submissions[0], seed + i) for i in range(repeat)]
    if not resume:
        return [(submission, seed + i) for i in range(repeat) for submission in submissions]
    from harness.launcher.event.queue import pending

    return [(e.submission, e.seed) for e in pending(queue_of(submissions, track, runs_dir, seed, repeat, overrides),
                                                    reporter.info)]


def entry_of(queue, submission, run_seed):
    return next(e for e in queue.entries if e.submission == submission and e.seed == run_seed)


def still_pending(queue, submission, run_seed, reporter) -> bool:
    """Read the entry's records again just before it runs (under its claim: harness/launcher/event/queue.py
    claim), so that a queue never starts what another settled or is running."""
    from harness.launcher.event.queue import PENDING

    entry = entry_of(queue, submission, run_seed)
    state = queue.state(entry)
    if state.state not in PENDING:
        reporter.info(f"skipped {entry.team} seed {entry.seed}: {state.state} since the queue started ({state.run_dir})")
    return state.state in PENDING


def show_queue(submissions, track, runs_dir, seed, repeat, overrides, reporter) -> None:
    from harness.launcher.event.queue import table

    try:
        reporter.summary(table(queue_of(submissions, track, runs_dir, seed, repeat, overrides).states()))
    except Exception as exc:  # the runs are done and recorded: a view that fails changes none of them
        reporter.error(f"the queue's view could not be shown ({type(exc).__name__}: {exc}); run `harness queue`")
