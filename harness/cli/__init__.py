"""The `harness` command: a thin layer that parses options and calls the library. The commands of a
team and of the results are here; the event's (a queue of runs, SLURM, flags) in harness/cli/event.py."""

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
    from harness.launcher.console import ConsoleReporter
    from harness.submission.contract import SubmissionError
    from harness.data.shards import DataError
    from harness.launcher.assemble import repeat_summary, summary_lines
    from harness.launcher.runner import RunOptions, run_submission
    from harness.tracks.spec import TrackError

    if (repeat > 1 or len(submissions) > 1) and run_id:
        raise SetupError("--run-id names one run; it cannot be combined with --repeat or several submissions")
    if len(submissions) > 1 and (node_rank or rdzv_endpoint):
        raise SetupError("a queue of several submissions runs on one machine; on several nodes, "
                         "`harness slurm` writes the same queue as SLURM jobs")
    reporter = ConsoleReporter()
    overrides = _overrides(budget_s=budget_s, grace_s=grace_s, nproc_per_node=nproc_per_node, nnodes=nnodes,
                           val_tokens=val_tokens, max_steps=max_steps)
    from harness.cli.event import _pending_runs, _queue, _show_queue, _still_pending

    try:
        pending = _pending_runs(submissions, track, runs_dir, seed, repeat, overrides, resume, reporter)
        queue_now = _queue(submissions, track, runs_dir, seed, repeat, overrides) if resume else None  # hashed once
    except (TrackError, SubmissionError, ValueError, OSError, TimeoutError) as exc:
        raise SetupError(str(exc)) from None
    records, queue = [], len(pending) > 1
    for submission, run_seed in pending:
        if queue_now is not None and not _still_pending(queue_now, submission, run_seed, reporter):
            continue  # another queue took it, or settled it, while this one ran others
        opts = RunOptions(
            submission=submission, track=track, runs_dir=runs_dir, seed=run_seed,
            overrides=overrides, data_root=data_root, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, run_id=run_id,
            eval_nproc=eval_nproc_per_node, command=["harness", *sys.argv[1:]],
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
        _show_queue(submissions, track, runs_dir, seed, repeat, overrides, reporter)
    sys.exit(0 if all(r.status == "ok" for r in records) else 1)


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
        out = rebuild(runs_root(runs_dir), track, leaderboard_root(), plots_root())
        reporter.info(f"leaderboard {out.html} ({out.ranked} ranked of {out.teams} teams)")
    except Exception as exc:  # the record is written; the view can be rebuilt with `harness leaderboard`
        reporter.error(f"leaderboard not refreshed ({type(exc).__name__}: {exc}); run `harness leaderboard`")



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

    from harness.launcher.console import ConsoleReporter
    from harness.data.shards import DataError
    from harness.launcher.rescore import rescore
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
@click.option("--track", "-t", "tracks", multiple=True,
              help="Track(s) to rank, by name or TOML file (its rules rank) [default: every track under runs/].")
@click.option("--all", "include_unofficial", is_flag=True, help="Include unofficial runs (writes <track>-all.*).")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records are [default: ./runs].")
@click.option("--out", "out_dir", envvar="HARNESS_LEADERBOARD_DIR", default=None,
              help="Where the CSV, Markdown and HTML go [default: ./leaderboard].")
@click.option("--plots-dir", envvar="HARNESS_PLOTS_DIR", default=None, help="Where charts go [default: ./plots].")
@click.option("--ranking", type=click.Choice(["mean", "best"]), default=None,
              help="Override the track's ranking rule for this view.")
@click.option("--no-charts", is_flag=True, help="Only the table (faster).")
@click.option("--watch", "watch_s", type=click.FloatRange(min=1), default=None, is_flag=False, flag_value=10.0,
              help="Keep running: rebuild whenever records change, checking every N seconds (default 10); the "
                   "page reloads itself on the same period. Ctrl-C stops.")
def leaderboard(tracks, include_unofficial, runs_dir, out_dir, plots_dir, ranking, no_charts, watch_s):
    """Rank teams by validation loss from the run records: CSV, Markdown, an HTML page and charts."""
    from harness.results.records import leaderboard_root, plots_root, runs_root
    from harness.results.views import UnknownTrack, choose_tracks, rebuild, watch
    from harness.tracks.spec import TrackError

    root = runs_root(runs_dir)
    try:
        chosen = choose_tracks(root, list(tracks))  # name -> the TOML file given for it (its rules), or None
    except (UnknownTrack, TrackError) as exc:
        raise SetupError(str(exc)) from None
    tracks = list(chosen)
    if not tracks:
        raise SetupError(f"no run records under {root} (run `harness run SUBMISSION` first, or pass --runs-dir)")

    def rebuild_all() -> None:
        for track in tracks:
            out = rebuild(root, track, leaderboard_root(out_dir), plots_root(plots_dir), include_unofficial, ranking,
                          charts=not no_charts, refresh_s=watch_s, spec=chosen[track])
            click.echo(f"{track}: {out.ranked} ranked of {out.teams} teams -> {out.csv}, {out.markdown}, {out.html}"
                       + (f", {len(out.charts)} charts in {out.charts[0].parent}" if out.charts else ""))
            for reason in out.unreadable:
                click.echo(f"warning: {reason}", err=True)

    if watch_s is None:
        rebuild_all()
        return
    # What the watcher is doing goes to stderr; stdout has one line per rebuild, the result.
    click.echo(f"watching {root} for {', '.join(tracks)}: rebuilding when records change (every {watch_s:g} s; "
               "Ctrl-C stops)", err=True)
    try:
        watch(root, tracks, rebuild_all, every_s=watch_s)
    except KeyboardInterrupt:
        click.echo("stopped", err=True)



@main.command("compare")
@click.argument("sides", nargs=-1, required=True)
@click.option("--track", "-t", default=None,
              help="Track (name or TOML file) to look teams up in (needed when a team ran on several).")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records are [default: ./runs].")
@click.option("--all", "include_unofficial", is_flag=True, help="Count a team's unofficial runs too.")
@click.option("--max-steps", type=click.IntRange(min=0), default=None,
              help="Compare a team's runs bounded by N steps (unofficial: counted without --all); 0: its runs "
                   "bounded by the time budget. Without it, a team whose runs mix setups keeps its newest run's.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True)
@click.option("--chart", "chart_path", default=None,
              help="Where the overlay chart of loss curves goes [default: plots/compare/<A>_vs_<B>.png].")
def compare_cmd(sides, track, runs_dir, include_unofficial, max_steps, fmt, chart_path):
    """Compare SIDES (team names, run ids or run directories) against the first, with statistics."""
    import json
    from pathlib import Path

    import pandas as pd

    from harness.results.compare import compare, resolve_side, verdict
    from harness.results.compare_chart import overlay_chart
    from harness.results.records import plots_root, runs_root
    from harness.tracks.resolve import resolve_track_arg
    from harness.tracks.spec import TrackError

    if len(sides) < 2:
        raise SetupError("give at least two sides to compare: team names, run ids or run directories")
    root = runs_root(runs_dir)
    try:
        track = resolve_track_arg(track)[0] if track else None  # a TOML file's track is found by its name
        resolved = [resolve_side(key, root, track, include_unofficial, max_steps) for key in sides]
    except (LookupError, TrackError) as exc:
        raise SetupError(str(exc)) from None
    rows = compare(resolved)
    sentences = verdict(resolved)
    safe = "_vs_".join("".join(c if c.isalnum() or c in "-_" else "-" for c in s.label) for s in resolved)
    chart = overlay_chart(resolved, Path(chart_path) if chart_path else plots_root() / "compare" / f"{safe}.png")
    if fmt == "json":
        click.echo(json.dumps({"sides": [{"label": s.label, "run_ids": [r["run_id"] for r in s.runs]} for s in resolved],
                               "rows": rows, "verdict": sentences, "chart": str(chart)}, indent=2, default=str))
    elif fmt == "csv":
        click.echo(pd.DataFrame(rows).to_csv(index=False), nl=False)
    else:
        from harness.results.compare_table import compare_table

        click.echo(compare_table(resolved, rows))
        for line in sentences:
            click.echo(line)
        click.echo(f"chart: {chart}")


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
    from harness.launcher.console import ConsoleReporter
    from harness.submission.contract import SubmissionError
    from harness.data.shards import DataError
    from harness.launcher.scale import ScaleOptions, run_scale, scale_lines
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
    """Check SUBMISSION in seconds on a CPU, exactly as before a run; exit 0 when it would be accepted."""
    import json

    from harness.launcher.check import check, render
    from harness.ranks.scratch import ScratchError
    from harness.submission.contract import SubmissionError
    from harness.tracks.spec import TrackError

    try:
        result = check(submission, track, runs_dir=runs_dir)
    except (SubmissionError, TrackError, ScratchError) as exc:
        raise SetupError(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"accepted": result.accepted, "team": result.team, "command": result.command,
                               **{k: v for k, v in result.report.items() if k != "log_tail"},
                               "warnings": result.warnings}, indent=2, default=str))
    else:
        click.echo("\n".join(render(result)))
    sys.exit(0 if result.accepted else 1)



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


# The event's commands (queue, slurm, flag, unflag, finalize) register themselves on `main`.
from harness.cli import event  # noqa: E402,F401  (after `main` exists: the module adds its commands to it)

if __name__ == "__main__":
    main()
