"""The commands a team runs: run (one submission, or a queue of them), check, eval, scale, and data prepare."""

from __future__ import annotations

import sys

import click

from harness.cli.main import SetupError, _overrides, _refresh_leaderboard, main


@main.command()
@click.argument("submissions", nargs=-1, required=True, metavar="SUBMISSION...")
@click.option("--track", "-t", default="local", show_default=True, help="Track name or path to a track TOML file.")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records go [default: ./runs].")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True, help="Seed for model init and data order.")
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), help="Override the training budget (unofficial).")
@click.option("--grace-s", type=click.FloatRange(min=0), help="Override the grace before the hard kill (unofficial).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), help="Override ranks per node (unofficial).")
@click.option("--nnodes", type=click.IntRange(min=1), help="Override the number of nodes (unofficial).")
@click.option("--val-tokens", type=click.IntRange(min=1), help="Override the evaluated tokens (unofficial).")
@click.option("--max-steps", type=click.IntRange(min=1),
              help="Train exactly N steps instead of to the time budget; the hard limit still holds (unofficial).")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True,
              help="This node's rank when running on several nodes (torchrun semantics).")
@click.option("--rdzv-endpoint", default="", help="HOST:PORT of node 0, for several nodes.")
@click.option("--run-id", default=None, help="Run id (needed on several nodes so all agree; SLURM's job id works).")
@click.option("--data-root", default=None, help="Folder the track's shard globs are relative to (or HARNESS_DATA_ROOT).")
@click.option("--eval-nproc-per-node", type=click.IntRange(min=1), default=None,
              help="Ranks for evaluation [default: the training ranks per node].")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run N times with consecutive seeds (seed, seed+1, ...), for statistics.")
@click.option("--no-leaderboard", is_flag=True, help="Do not refresh the track's leaderboard after the run.")
@click.option("--resume", is_flag=True,
              help="A queue started again: skip each team x seed already settled (ok, or the team's own failure); "
                   "re-run what the infrastructure lost (aborted, or left running by a dead launcher).")
def run(submissions, track, runs_dir, seed, budget_s, grace_s, nproc_per_node, nnodes, val_tokens, max_steps,
        node_rank, rdzv_endpoint, run_id, data_root, eval_nproc_per_node, repeat, no_leaderboard, resume):
    """Train each SUBMISSION on the track's fixed setup (--repeat N: N seeds each), evaluate it, and write its
    run record: one after another, a queue that --resume takes up where it stopped."""
    from harness.launcher.run.console import ConsoleReporter
    from harness.submission.contract import SubmissionError
    from harness.data.shards import DataError
    from harness.launcher.run.console import repeat_summary, summary_lines
    from harness.launcher.run.runner import RunOptions, run_submission
    from harness.tracks.spec import TrackError

    if (repeat > 1 or len(submissions) > 1) and run_id:
        raise SetupError("--run-id names one run; it cannot be combined with --repeat or several submissions")
    if len(submissions) > 1 and (node_rank or rdzv_endpoint):
        raise SetupError("a queue of several submissions runs on one machine; on several nodes, "
                         "`harness slurm` writes the same queue as SLURM jobs")
    reporter = ConsoleReporter()
    overrides = _overrides(budget_s=budget_s, grace_s=grace_s, nproc_per_node=nproc_per_node, nnodes=nnodes,
                           val_tokens=val_tokens, max_steps=max_steps)
    from contextlib import ExitStack

    from harness.cli.queues import entry_of, pending_runs, queue_of, show_queue, still_pending
    from harness.launcher.event.queue import claim

    try:
        pending = pending_runs(submissions, track, runs_dir, seed, repeat, overrides, resume, reporter)
        queue_now = queue_of(submissions, track, runs_dir, seed, repeat, overrides) if resume else None  # hashed once
    except (TrackError, SubmissionError, ValueError, OSError, TimeoutError) as exc:
        raise SetupError(str(exc)) from None
    records, queue = [], len(pending) > 1
    for submission, run_seed in pending:
        with ExitStack() as held:  # a resumed queue's claim on the entry, held until its run has ended
            if queue_now is not None:
                taken = held.enter_context(claim(queue_now, entry_of(queue_now, submission, run_seed)))
                if taken:
                    reporter.info(f"skipped {submission} seed {run_seed}: {taken}")
                    continue
                if not still_pending(queue_now, submission, run_seed, reporter):
                    continue  # another queue settled it while this one ran others
            opts = RunOptions(
                submission=submission, track=track, runs_dir=runs_dir, seed=run_seed,
                overrides=overrides, data_root=data_root, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                run_id=run_id, eval_nproc=eval_nproc_per_node, command=["harness", *sys.argv[1:]],
            )
            try:
                record, run_dir = run_submission(opts, reporter)
            except (TrackError, DataError, SubmissionError, ValueError, RuntimeError, FileExistsError) as exc:
                if not queue:
                    raise SetupError(str(exc)) from None
                reporter.error(f"{submission} seed {run_seed} did not start: {exc}")  # the rest of the queue goes on
                continue
            except Exception as exc:  # noqa: BLE001  (the run's record says what happened; one team never ends the queue)
                if not queue:
                    raise
                reporter.error(f"{submission} seed {run_seed}: harness error {type(exc).__name__}: {exc}; the queue goes on")
                continue
        if node_rank == 0:
            reporter.summary(summary_lines(record, run_dir))
        else:  # node 0 writes the record; this node wrote its own account
            reporter.summary([f"node {node_rank}: {record.status}" + (f" ({record.reason})" if record.reason else ""),
                              f"node report {run_dir / 'nodes' / f'node{node_rank}.json'} (node 0 writes the record)"])
        records.append(record)
        if record.status == "aborted" and record.reason.startswith("stopped by SIG"):
            break  # the organiser stopped this launcher (Ctrl-C, scancel): the queue stops with it
        if not no_leaderboard and node_rank == 0:
            _refresh_leaderboard(runs_dir, record.track_name, reporter)
    by_team: dict[str, list] = {}
    for record in records:
        by_team.setdefault(record.team, []).append(record)
    for team_records in by_team.values():
        if len(team_records) > 1:
            reporter.summary([f"{team_records[0].team}: " + line for line in repeat_summary(team_records)]
                             if len(by_team) > 1 else repeat_summary(team_records))
    if resume or len(submissions) > 1:
        show_queue(submissions, track, runs_dir, seed, repeat, overrides, reporter)
    sys.exit(0 if all(r.status == "ok" for r in records) else 1)


@main.command("eval")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=None,
              help="Ranks to evaluate with [default: the run's ranks per node, on a GPU at most the GPUs this "
                   "machine shows]. The figure does not depend on it.")
@click.option("--data-root", default=None, help="Where the run's data lives, if not where the track says.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def eval_cmd(run_dir, nproc_per_node, data_root, as_json):
    """Score RUN_DIR's checkpoint again, the same way, and print the figure (the record is not changed)."""
    import json

    from harness.launcher.run.console import ConsoleReporter
    from harness.data.shards import DataError
    from harness.launcher.run.rescore import rescore
    from harness.tracks.spec import TrackError

    try:
        result = rescore(run_dir, nproc_per_node, data_root, ConsoleReporter())
    except (FileNotFoundError, DataError, TrackError, ValueError) as exc:
        raise SetupError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.__dict__, indent=2))
    elif result.status != "ok":  # the outcome is the result, as a run's summary is; exit 1 says it failed
        click.echo(f"evaluation {result.status}: {result.reason}")
    else:
        line = f"val_loss {result.val_loss:.6f} over {result.val_tokens} tokens with {result.world_size} rank(s)"
        if result.recorded_val_loss is not None:
            line += f"; recorded {result.recorded_val_loss:.6f} (difference {result.val_loss - result.recorded_val_loss:+.2e})"
        click.echo(line)
        c = result.causality
        if c:
            click.echo(f"causality: {c.get('verdict', 'causal')}: {c['checked_batches']} of {c['batches']} scoring batches "
                       f"re-run with their ends replaced; largest change before a cut {c['worst_deviation']:.3g} nats "
                       f"(tolerance {c['tolerance']:.3g})"
                       + (f"; a scoring batch re-run unchanged differed by {c['reproduction_deviation']:.3g}"
                          if c.get("reproduction_deviation") is not None else ""))
            if result.reason:
                click.echo(result.reason)
    sys.exit(0 if result.status == "ok" else 1)


@main.command()
@click.argument("submission")
@click.option("--track", "-t", default="local", show_default=True, help="Track name or path to a track TOML file.")
@click.option("--world-sizes", default="1,2", show_default=True, help="Comma-separated world sizes (1 is always added).")
@click.option("--steps", type=click.IntRange(min=1), default=20, show_default=True, help="Timed steps per world size.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=3, show_default=True,
              help="Steps before timing starts.")
@click.option("--probe-steps", type=click.IntRange(min=1), default=6, show_default=True,
              help="Synchronised vs compute-only step pairs for the all-reduce time.")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where records go [default: ./runs].")
@click.option("--data-root", default=None, help="Folder the track's shard globs are relative to.")
def scale(submission, track, world_sizes, steps, warmup_steps, probe_steps, seed, runs_dir, data_root):
    """Weak-scaling efficiency of SUBMISSION measured at several world sizes, and the model's prediction beyond."""
    from harness.launcher.run.console import ConsoleReporter
    from harness.submission.contract import SubmissionError
    from harness.data.shards import DataError
    from harness.launcher.scaling.scale import ScaleOptions, run_scale, scale_lines
    from harness.tracks.spec import TrackError

    try:
        sizes = [int(x) for x in world_sizes.split(",") if x.strip()]
        opts = ScaleOptions(submission=submission, track=track, world_sizes=sizes, steps=steps,
                            warmup_steps=warmup_steps, probe_steps=probe_steps, seed=seed, runs_dir=runs_dir,
                            data_root=data_root)
        record, out_dir = run_scale(opts, ConsoleReporter())
    except (TrackError, DataError, SubmissionError, ValueError, RuntimeError) as exc:
        raise SetupError(str(exc)) from None
    for line in scale_lines(record, out_dir):
        click.echo(line)
    _refresh_leaderboard(runs_dir, record["track"], ConsoleReporter())  # the track's scaling chart shows it



@main.command("check")
@click.argument("submission")
@click.option("--track", "-t", default="local", show_default=True, help="The track it will run on.")
@click.option("--json", "as_json", is_flag=True, help="Print the full report as JSON.")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None,
              help="Run records to check the team name against [default: ./runs].")
def check_cmd(submission, track, as_json, runs_dir):
    """Check SUBMISSION in seconds on a CPU, exactly as before a run; exit 0 when it is accepted (1 when it is
    rejected, or when lines of it will not run on the track's device)."""
    import json

    from harness.launcher.run.check import check, render
    from harness.ranks.confine.scratch import ScratchError
    from harness.submission.contract import SubmissionError
    from harness.tracks.spec import TrackError

    try:
        result = check(submission, track, runs_dir=runs_dir)
    except (SubmissionError, TrackError, ScratchError) as exc:
        raise SetupError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"accepted": result.accepted, "verdict": result.verdict, "team": result.team,
                               "command": result.command,
                               **{k: v for k, v in result.report.items() if k != "log_tail"},
                               "warnings": result.warnings}, indent=2, default=str))
    else:
        click.echo("\n".join(render(result)))
    sys.exit(0 if result.verdict == "accepted" else 1)



@main.group("data")
def data_group() -> None:
    """Token data: make shards like the event's from text."""


@data_group.command("prepare")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--tokenizer", required=True, type=click.Path(exists=True, dir_okay=False),
              help="A `tokenizers` JSON file (tokenizer.json).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for the shards.")
@click.option("--format", "fmt", type=click.Choice(["raw_uint16", "llmc_uint16"]), default="raw_uint16",
              show_default=True, help="raw_uint16: Paris 2026 (no header); llmc_uint16: llm.c's header.")
@click.option("--shard-tokens", type=click.IntRange(min=1), default=100_000_000, show_default=True,
              help="Tokens per shard (the last one holds the rest).")
def data_prepare(inputs, tokenizer, out_dir, fmt, shard_tokens):
    """Tokenize INPUTS (.txt/.md files, or .parquet with a `text` column) into shards chunk_0001.bin, ..."""
    from pathlib import Path

    from harness.data.from_text import ShardPlan, prepare_shards
    from harness.data.shards import DataError, inspect_shard

    total = sum(Path(p).stat().st_size for p in inputs)
    try:
        plan = ShardPlan(out_dir=Path(out_dir), fmt=fmt, shard_tokens=shard_tokens)
        with click.progressbar(length=total, label="tokenizing", file=sys.stderr) as bar:
            shards = prepare_shards(inputs, tokenizer, plan, progress=bar.update)
    except DataError as exc:
        raise SetupError(str(exc)) from None
    tokens = sum(inspect_shard(s).num_tokens for s in shards)
    click.echo(f"wrote {len(shards)} shard(s), {tokens:,} tokens, {fmt}, to {out_dir}")
