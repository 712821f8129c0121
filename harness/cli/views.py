"""The commands of the results: leaderboard (the ranking, its page and charts) and compare (two sides, with statistics)."""

from __future__ import annotations


import click

from harness.cli.main import SetupError, main


@main.command()
@click.option("--track", "-t", "tracks", multiple=True,
              help="Track(s) to rank, by name or TOML file (its rules rank) [default: every track under runs/].")
@click.option("--all", "include_unofficial", is_flag=True, help="Include unofficial runs (writes <track>-all.*).")
@click.option("--runs-dir", envvar="HARNESS_RUNS_DIR", default=None, help="Where run records are [default: ./runs].")
@click.option("--out", "out_dir", envvar="HARNESS_LEADERBOARD_DIR", default=None,
              help="Where the CSV, Markdown and HTML go [default: beside the runs folder, named after it: "
                   "runs -> leaderboard, event-runs -> event-runs-leaderboard].")
@click.option("--plots-dir", envvar="HARNESS_PLOTS_DIR", default=None,
              help="Where charts go [default: beside the runs folder: runs -> plots, event-runs -> event-runs-plots].")
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
            out = rebuild(root, track, leaderboard_root(out_dir, root), plots_root(plots_dir, root), include_unofficial,
                          ranking, charts=not no_charts, refresh_s=watch_s, spec=chosen[track])
            click.echo(f"{track}: {out.ranked} ranked of {out.teams} teams -> {out.csv}, {out.markdown}, {out.html}"
                       + (f", {len(out.charts)} charts in {out.charts[0].parent}" if out.charts else ""))
            for reason in out.unreadable:
                click.echo(f"warning: {reason}", err=True)
            if out.chart_error:
                click.echo(f"warning: the charts of {track} could not be drawn ({out.chart_error}); the tables are "
                           "written", err=True)

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
              help="Where the overlay chart of loss curves goes [default: compare/<A>_vs_<B>.png in the plots folder beside the runs folder].")
def compare_cmd(sides, track, runs_dir, include_unofficial, max_steps, fmt, chart_path):
    """Compare SIDES (team names, run ids or run directories) against the first, with statistics."""
    import json
    from pathlib import Path

    import pandas as pd

    from harness.results.compare import compare, resolve_side, verdict
    from harness.results.charts.compare_chart import overlay_chart
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
    chart = overlay_chart(resolved, Path(chart_path) if chart_path else plots_root(runs=root) / "compare" / f"{safe}.png")
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
