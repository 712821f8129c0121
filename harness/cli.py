"""The `harness` command: a thin layer that parses options and calls the library."""

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


@main.command()
@click.argument("submission")
@click.option("--track", "-t", default="local", show_default=True, help="Track name or path to a track TOML file.")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records go [default: ./runs].")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True, help="Seed for model init and data order.")
@click.option("--budget-s", type=click.FloatRange(min=0, min_open=True), help="Override the training budget (unofficial).")
@click.option("--grace-s", type=click.FloatRange(min=0), help="Override the grace before the hard kill (unofficial).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), help="Override ranks per node (unofficial).")
@click.option("--nnodes", type=click.IntRange(min=1), help="Override the number of nodes (unofficial).")
@click.option("--val-tokens", type=click.IntRange(min=1), help="Override the evaluated tokens (unofficial).")
@click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True,
              help="This node's rank when running on several nodes (torchrun semantics).")
@click.option("--rdzv-endpoint", default="", help="HOST:PORT of node 0, for several nodes.")
@click.option("--run-id", default=None, help="Run id (needed on several nodes so all agree; SLURM's job id works).")
@click.option("--data-root", default=None, help="Folder the track's shard globs are relative to (or HARNESS_DATA_ROOT).")
@click.option("--eval-nproc-per-node", type=click.IntRange(min=1), default=None,
              help="Ranks for evaluation [default: the training ranks per node].")
def run(submission, track, runs_dir, seed, budget_s, grace_s, nproc_per_node, nnodes, val_tokens, node_rank,
        rdzv_endpoint, run_id, data_root, eval_nproc_per_node):
    """Train SUBMISSION on the track's fixed setup, evaluate it, and write its run record."""
    from harness.console import ConsoleReporter
    from harness.contract import SubmissionError
    from harness.data.shards import DataError
    from harness.runner import RunOptions, run_submission, summary_lines
    from harness.track import TrackError

    opts = RunOptions(
        submission=submission, track=track, runs_dir=runs_dir, seed=seed,
        overrides=_overrides(budget_s=budget_s, grace_s=grace_s, nproc_per_node=nproc_per_node, nnodes=nnodes,
                             val_tokens=val_tokens),
        data_root=data_root, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, run_id=run_id,
        eval_nproc=eval_nproc_per_node, command=["harness", *sys.argv[1:]],
    )
    reporter = ConsoleReporter()
    try:
        record, run_dir = run_submission(opts, reporter)
    except (TrackError, DataError, SubmissionError, ValueError, RuntimeError, FileExistsError) as exc:
        raise SetupError(str(exc)) from None
    reporter.summary(summary_lines(record, run_dir))
    sys.exit(0 if record.status == "ok" else 1)



@main.command("eval")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=None,
              help="Ranks to evaluate with [default: the run's ranks per node]. The figure does not depend on it.")
@click.option("--data-root", default=None, help="Where the run's data lives, if not where the track says.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def eval_cmd(run_dir, nproc_per_node, data_root, as_json):
    """Score RUN_DIR's checkpoint again, the same way, and print the figure (the record is not changed)."""
    import json

    from harness.console import ConsoleReporter
    from harness.data.shards import DataError
    from harness.rescore import rescore
    from harness.track import TrackError

    try:
        result = rescore(run_dir, nproc_per_node, data_root, ConsoleReporter())
    except (FileNotFoundError, DataError, TrackError, ValueError) as exc:
        raise SetupError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.__dict__, indent=2))
    elif result.status != "ok":
        click.echo(f"evaluation {result.status}: {result.reason}", err=True)
    else:
        line = f"val_loss {result.val_loss:.6f} over {result.val_tokens} tokens with {result.world_size} rank(s)"
        if result.recorded_val_loss is not None:
            line += f"; recorded {result.recorded_val_loss:.6f} (difference {result.val_loss - result.recorded_val_loss:+.2e})"
        click.echo(line)
    sys.exit(0 if result.status == "ok" else 1)


if __name__ == "__main__":
    main()
