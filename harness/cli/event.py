"""The event's commands: a queue of runs and its view, the SLURM job array, flags, finalize, the nodes' doctor.
They add themselves to the `harness` group (harness/cli/main.py; harness/cli/__init__.py imports this module)."""

from __future__ import annotations

from pathlib import Path

import click

from harness.cli.main import SetupError, _overrides, _refresh_leaderboard, main
from harness.cli.queues import queue_of


@main.command("queue")
@click.argument("submissions", nargs=-1, required=True, metavar="SUBMISSION...")
@click.option("--track", "-t", default="local", show_default=True, help="Track name or path to a track TOML file.")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records are [default: ./runs].")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True, help="The queue's first seed.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True, help="Seeds per submission.")
@click.option("--max-steps", type=click.IntRange(min=1), help="A queue of runs bounded by steps (unofficial).")
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), help="The queue's budget override.")
@click.option("--grace-s", type=click.FloatRange(min=0), help="The queue's grace override.")
@click.option("--nproc-per-node", type=click.IntRange(min=1), help="The queue's ranks-per-node override.")
@click.option("--nnodes", type=click.IntRange(min=1), help="The queue's node-count override.")
@click.option("--val-tokens", type=click.IntRange(min=1), help="The queue's evaluated-tokens override.")
@click.option("--watch", "watch_s", type=click.FloatRange(min=1.0), default=None,
              help="Show it again every N seconds until Ctrl-C.")
def queue_cmd(submissions, track, runs_dir, seed, repeat, max_steps, budget_s, grace_s, nproc_per_node, nnodes,
              val_tokens, watch_s):
    """Where a queue of runs stands (the arguments of its `harness run`): queued, running, done, failed (the
    team's own result) and lost (the infrastructure's: --resume runs them again), per team, from the records."""
    import time

    from harness.launcher.event.queue import table
    from harness.submission.contract import SubmissionError
    from harness.tracks.spec import TrackError

    while True:
        try:
            lines = table(queue_of(submissions, track, runs_dir, seed, repeat, _overrides(
                max_steps=max_steps, budget_s=budget_s, grace_s=grace_s, nproc_per_node=nproc_per_node, nnodes=nnodes,
                val_tokens=val_tokens)).states())
        except (TrackError, SubmissionError, ValueError, OSError) as exc:
            raise SetupError(str(exc)) from None
        click.echo("\n".join(lines))
        if watch_s is None:
            return
        try:
            time.sleep(watch_s)
        except KeyboardInterrupt:
            return
        click.echo("")


def _flag_command(run: str, runs_dir, flagged: bool, reason: str, wait: bool) -> None:
    from harness.results.flags import set_flag
    from harness.results.records import runs_root

    try:
        record, run_dir = set_flag(runs_root(runs_dir), run, flagged=flagged, reason=reason,
                                   wait_s=None if wait else 10.0)
    except (FileNotFoundError, ValueError, TimeoutError) as exc:
        raise SetupError(f"{exc}" + (" (pass --wait to wait for it)" if isinstance(exc, TimeoutError) else "")) from None
    click.echo(f"{'flagged' if flagged else 'unflagged'} {record.team}/{record.run_id} ({run_dir})")
    _refresh_leaderboard(runs_dir, record.track_name, _plain_reporter())


def _plain_reporter():
    from harness.launcher.run.console import ConsoleReporter

    return ConsoleReporter()


@main.command()
@click.argument("run")
@click.option("--reason", required=True, help="Why the run is hidden (shown on the leaderboard).")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records are [default: ./runs].")
@click.option("--wait", is_flag=True, help="Wait for runs training on the track instead of giving up after 10 s.")
def flag(run, reason, runs_dir, wait):
    """Hide RUN (a run id or directory) from the ranking, keeping its record."""
    _flag_command(run, runs_dir, True, reason, wait)


@main.command()
@click.argument("run")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records are [default: ./runs].")
@click.option("--wait", is_flag=True, help="Wait for runs training on the track instead of giving up after 10 s.")
def unflag(run, runs_dir, wait):
    """Return RUN to the ranking."""
    _flag_command(run, runs_dir, False, "", wait)


@main.command()
@click.argument("run")
@click.option("--reason", default="", help="Why (the record's reason: 'finalized by the organiser: REASON').")
@click.option("--force", is_flag=True,
              help="Finalize when this host cannot tell that the launcher is gone (another host, no pid recorded).")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records are [default: ./runs].")
@click.option("--no-leaderboard", is_flag=True, help="Do not refresh the track's leaderboard afterwards.")
def finalize(run, reason, force, runs_dir, no_leaderboard):
    """End RUN (a run id or directory), left `running` or `evaluating` by a launcher that is gone, as `aborted`."""
    from harness.launcher.event.finalize import FinalizeRefused, finalize_run
    from harness.results.records import runs_root

    try:
        record, run_dir = finalize_run(runs_root(runs_dir), run, reason=reason, force=force)
    except (OSError, ValueError, FinalizeRefused) as exc:
        raise SetupError(str(exc)) from None
    click.echo(f"finalized {record.team}/{record.run_id} as aborted ({run_dir}): {record.reason}")
    if not no_leaderboard:  # the tree the record is in, even when named by a path outside --runs-dir
        _refresh_leaderboard(str(run_dir.resolve().parents[2]), record.track_name, _plain_reporter())



@main.command("slurm")
@click.argument("submissions", nargs=-1, metavar="SUBMISSION...")
@click.option("--track", "-t", default="paris2026", show_default=True, help="Track name or path to a track TOML file.")
@click.option("--output", "-o", "script_path", default=None,
              help="Where the sbatch script goes [default: slurm-<team>.sbatch, or slurm-queue.sbatch for a queue].")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True, help="The first seed of each team.")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Seeds per submission: the queue is an array of one job per team x seed.")
@click.option("--resume", is_flag=True, help="Only the team x seed runs not settled yet (as `harness run --resume`).")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=1, show_default=True,
              help="At most N runs of the queue at once: runs side by side share the network and the file system, "
                   "so one at a time measures every team alike.")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default="runs", show_default=True,
              help="Records folder on the shared file system.")
@click.option("--log-dir", default="slurm-logs", show_default=True, help="Folder for the per-node SLURM logs.")
@click.option("--partition", default=None, help="SLURM partition.")
@click.option("--account", default=None, help="SLURM account.")
@click.option("--time", "time_limit", default=None, help="Wall time HH:MM:SS [default: computed from the track].")
@click.option("--port", type=int, default=None,
              help="Node 0's rendezvous port [default: 29500 + the job id mod 1000, a port of each job's own].")
@click.option("--no-check", is_flag=True,
              help="Queue every submission without running `harness check` on it first.")
@click.option("--submit", is_flag=True, help="Hand the script to sbatch.")
@click.option("--doctor", is_flag=True,
              help="Instead of runs: `harness doctor` on every node of the track's allocation (no SUBMISSION).")
def slurm_cmd(submissions, track, script_path, seed, repeat, resume, max_concurrent, runs_dir, log_dir, partition,
              account, time_limit, port, no_check, submit, doctor):
    """Write an sbatch script that runs each SUBMISSION on the track's nodes (and submit it with --submit):
    one job for one run, or, for several submissions or seeds, a job array of one run per team x seed.
    Each submission is checked first (as `harness check`): one the check rejects is named and left out.
    With --doctor, a job that runs `harness doctor` on every node of one run's allocation."""
    from pathlib import Path

    from harness.submission.contract import SubmissionError, find_submission, team_slug
    from harness.launcher.event.slurm import SlurmOptions, node_local_warnings, rejected, render, render_doctor, render_queue
    from harness.launcher.event.slurm import submit as sbatch_submit
    from harness.ranks.confine.scratch import ScratchError
    from harness.tracks.spec import TrackError, load_track

    if doctor == bool(submissions):
        raise SetupError("give the SUBMISSION folder(s) to run, or --doctor (and no submission) for the nodes' doctor")
    one_run = len(submissions) == 1 and repeat == 1 and not resume and seed == 1
    try:
        opts = SlurmOptions(submission=submissions[0] if submissions else "", track=track, runs_dir=runs_dir,
                            log_dir=log_dir, partition=partition, account=account, time_limit=time_limit, port=port)
        folders = [find_submission(s) for s in submissions]
        refused = {} if doctor or no_check else rejected(folders, track, runs_dir, lambda t: click.echo(t, err=True))
        for folder, why in refused.items():
            click.echo(f"left out: {folder} would be rejected on track {track!r}: {why}", err=True)
        if doctor:
            text, resolved = render_doctor(opts)
        elif one_run:
            if refused:
                raise SetupError(f"{folders[0]} would be rejected before its run (above): fix it, or pass --no-check "
                                 "to queue it anyway (it would end `invalid`)")
            text, resolved, team = render(opts)
        else:
            from harness.launcher.event.queue import pending

            queue = queue_of(submissions, track, runs_dir, seed, repeat, {})
            entries = pending(queue, lambda text: click.echo(text, err=True)) if resume else queue.entries
            entries = [e for e in entries if e.folder not in refused]
            if not entries:  # done, not a usage error
                click.echo("nothing left to run: every team x seed of the queue is settled or running"
                           + (", or left out by the check" if refused else "")
                           + " (`harness queue` with the same arguments shows them)")
                return
            runs = [(e.folder, e.team, e.seed) for e in entries]
            text, resolved = render_queue(opts, runs, max_concurrent)
        warnings = node_local_warnings(opts, folders, load_track(track))
    except (SubmissionError, TrackError, ValueError, OSError, ScratchError) as exc:
        raise SetupError(str(exc)) from None
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)
    default = "slurm-doctor.sbatch" if doctor else f"slurm-{team_slug(team)}.sbatch" if one_run else "slurm-queue.sbatch"
    path = Path(script_path or default)
    Path(log_dir).mkdir(parents=True, exist_ok=True)  # SLURM opens --output before the script runs
    path.write_text(text)
    path.chmod(0o755)
    if doctor:
        click.echo(f"wrote {path}: `harness doctor` on each of {resolved.nnodes} node(s), the all-reduce between them "
                   f"through the first; each node's table in {Path(log_dir).resolve()}/harness-doctor-<job>-node<N>.out, "
                   "and the job fails when a node fails a check")
    elif one_run:
        click.echo(f"wrote {path}: {resolved.nnodes} node(s), one launcher each, run id = the SLURM job id")
    else:
        click.echo(f"wrote {path}: an array of {len(runs)} run(s), each on {resolved.nnodes} exclusive node(s), at most "
                   f"{max_concurrent} at once, run id = <array job id>_<task>; `harness queue ...` shows where it stands")
    if submit:
        try:
            click.echo(sbatch_submit(path))
        except RuntimeError as exc:
            raise SetupError(str(exc)) from None


@main.command("rehearse")
@click.argument("submissions", nargs=-1, required=True, metavar="SUBMISSION...")
@click.option("--track", "-t", required=True, help="A CPU copy of the event's track (its nnodes, device cpu): name or file.")
@click.option("--workdir", "-w", default="rehearsal", show_default=True,
              help="Where everything goes: runs/, slurm-logs/, leaderboard/, report.md.")
@click.option("--repeat", type=click.IntRange(min=1), default=2, show_default=True, help="Seeds per team.")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True, help="The first seed.")
@click.option("--fault", "faults", multiple=True, type=click.Choice(["node-lost", "cancel", "fs-stall", "scratch-full",
                                                                    "team-hangs"]),
              help="Inject this fault once (repeatable): a node's processes killed mid-run, scancel of the array, the "
                   "records' file system frozen, the scratch filled, one more team that hangs.")
@click.option("--max-concurrent", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs at once (each on the track's nodes, exclusive).")
@click.option("--nodes", type=click.IntRange(min=1, max=64), default=None,
              help="The cluster's nodes [default: the track's nodes x --max-concurrent].")
@click.option("--max-rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Rounds of `--resume` at most (round 1 is the whole queue).")
@click.option("--stall-s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="How long --fault fs-stall freezes the records' file system [default: the time that makes a "
                   "node lost on the track, + 2 s].")
@click.option("--keep-cluster", is_flag=True, help="Leave the cluster up afterwards (scripts/slurm-cluster down stops it).")
def rehearse_cmd(submissions, track, workdir, repeat, seed, faults, max_concurrent, nodes, max_rounds, stall_s,
                 keep_cluster):
    """The event's day on this machine, the week before: a real SLURM cluster of several nodes started here, every
    team x seed queued as `harness slurm` queues it, the faults you ask for injected, the queue resumed as an
    organiser would, the board built, the cluster stopped, and a report of what happened to each entry
    (WORKDIR/report.md). Exit 1 when an entry or a fault did not end as it must. Needs root."""
    import sys

    from harness.launcher.event.cluster import ClusterError
    from harness.launcher.event.rehearsal import RehearsalOptions, render, run_rehearsal
    from harness.submission.contract import SubmissionError
    from harness.tracks.spec import TrackError

    try:
        opts = RehearsalOptions(submissions=tuple(submissions), track=track, workdir=workdir, repeat=repeat, seed=seed,
                                faults=tuple(dict.fromkeys(faults)), max_concurrent=max_concurrent, nodes=nodes,
                                max_rounds=max_rounds, stall_s=stall_s, keep_cluster=keep_cluster)
        report = run_rehearsal(opts, say=lambda text: click.echo(text, err=True))
    except (TrackError, SubmissionError, ValueError, ClusterError) as exc:
        raise SetupError(str(exc)) from None
    click.echo("\n".join(render(report)))
    click.echo(f"report: {Path(report.workdir) / 'report.md'}")
    sys.exit(0 if report.ok else 1)


@main.command("doctor")
@click.option("--track", "-t", default="local", show_default=True, help="Track name or path to a track TOML file.")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None,
              help="The records folder whose locks and disk are checked [default: ./runs].")
@click.option("--data-root", default=None, help="Folder the track's shard globs are relative to (or HARNESS_DATA_ROOT).")
@click.option("--data-fingerprint", default=None,
              help="The fingerprint the data must have (a rehearsal record's data_fingerprint): a mismatch fails.")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True,
              help="This node's rank, for the all-reduce between the track's nodes.")
@click.option("--rdzv-endpoint", default="", help="HOST:PORT of node 0: measure between the nodes too.")
@click.option("--skip", "skip", multiple=True, metavar="CHECK", help="Leave a check out (repeatable): its table name.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor_cmd(track, runs_dir, data_root, data_fingerprint, node_rank, rdzv_endpoint, skip, as_json):
    """Check this node for the track: GPUs, driver, sandbox (Landlock, user namespaces), locks, disk, data,
    all-reduce bandwidth, InfiniBand from inside the sandbox, clocks. One line per check with what to do; exit
    1 when any check fails. `harness slurm --doctor` runs it on every node of the track's allocation."""
    import sys

    from harness.launcher.run.console import ConsoleReporter
    from harness.launcher.doctor.checkup import render, run_doctor, to_json
    from harness.launcher.doctor.table import DoctorOptions
    from harness.tracks.spec import TrackError

    try:
        opts = DoctorOptions(track=track, runs_dir=runs_dir, data_root=data_root, data_fingerprint=data_fingerprint,
                             node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, skip=tuple(skip))
        report = run_doctor(opts, ConsoleReporter())
    except (TrackError, ValueError) as exc:
        raise SetupError(str(exc)) from None
    click.echo(to_json(report) if as_json else "\n".join(render(report)))
    sys.exit(report.exit_code)
