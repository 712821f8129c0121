"""Ranking rules, on records made by the tests (the leaderboard needs nothing but records)."""

import pytest

from harness.results.leaderboard import build_table, load_rows
from records_factory import make_run


def table(root, **kw):
    return build_table(load_rows(root, "local"), **kw)


def test_mean_ranking_with_intervals_and_ties(tmp_path):
    for seed, v in enumerate((2.00, 2.02, 2.01), 1):
        make_run(tmp_path, "alpha", v, seed=seed)
    for seed, v in enumerate((2.015, 2.005, 2.03), 1):
        make_run(tmp_path, "bravo", v, seed=seed)
    for seed, v in enumerate((3.0, 3.001), 1):
        make_run(tmp_path, "charlie", v, seed=seed)
    t = table(tmp_path)
    assert list(t["team"]) == ["alpha", "bravo", "charlie"] and list(t["rank"]) == [1, 2, 3]
    assert t.loc[0, "val_loss"] == pytest.approx(2.01) and t.loc[0, "n_runs"] == 3
    half = 4.303 * 0.01 / 3**0.5  # t(0.975, 2) * s / sqrt(n): 3 runs, the 95% t interval (the floor, 1.5, is far)
    assert t.loc[0, "interval_kind"] == "t95"
    assert (t.loc[0, "interval_low"], t.loc[0, "interval_high"]) == (pytest.approx(2.01 - half, rel=1e-4),
                                                                     pytest.approx(2.01 + half, rel=1e-4))
    assert t.loc[0, "tied_with"] == "#2" and t.loc[1, "tied_with"] == "#1"  # not significantly different
    assert t.loc[1, "p_vs_next"] < 0.05 and t.loc[2, "tied_with"] == ""


def test_the_boards_intervals_never_claim_a_loss_below_the_floor(tmp_path):
    """The issue's board: 2 runs (2.52, 2.88) over a floor of 1.64 had the interval 0.41 to 4.99. Its interval is
    now the runs' range; 3 runs near the floor have a t interval cut at the floor, and the Markdown says so. The
    ranking's statistics are the runs' as before: Welch's p to the next team, the ties it finds."""
    from harness.results.stats import welch
    from harness.results.tables import to_markdown

    for seed, v in enumerate((1.70, 2.30, 1.75), 1):
        make_run(tmp_path, "near", v, seed=seed, loss_floor=1.64)
    for seed, v in enumerate((2.52, 2.88), 1):
        make_run(tmp_path, "wide", v, seed=seed, loss_floor=1.64)
    for seed, v in enumerate((2.70, 2.71, 2.72), 1):
        make_run(tmp_path, "tight", v, seed=seed, loss_floor=1.64)
    t = table(tmp_path)
    by = {row["team"]: row for _, row in t.iterrows()}
    assert list(t["team"]) == ["near", "wide", "tight"]
    assert (by["wide"]["interval_low"], by["wide"]["interval_high"], by["wide"]["interval_kind"]) == (2.52, 2.88, "range")
    assert by["near"]["interval_low"] == 1.64 and by["near"]["interval_kind"] == "t95_floor"
    assert by["tight"]["interval_kind"] == "t95" and by["tight"]["interval_low"] > 2.6
    assert (t["interval_low"] >= 1.64).all()
    assert by["near"]["p_vs_next"] == pytest.approx(welch([1.70, 2.30, 1.75], [2.52, 2.88]).p_value, rel=1e-12)
    assert by["wide"]["p_vs_next"] == pytest.approx(welch([2.52, 2.88], [2.70, 2.71, 2.72]).p_value, rel=1e-12)
    assert by["wide"]["tied_with"] == "#1, #3" and by["tight"]["tied_with"] == "#2"  # p >= 0.05 both ways
    md = to_markdown(t, "local", "mean")
    assert "| 1.6400–" in md and "(cut at floor) |" in md and "| 2.5200–2.8800 (min–max) |" in md
    assert "0.41" not in md


def test_single_runs_are_never_silently_ordered(tmp_path):
    make_run(tmp_path, "alpha", 2.0)
    make_run(tmp_path, "bravo", 2.0000001)
    t = table(tmp_path)
    assert list(t["tied_with"]) == ["", ""] and t["p_vs_next"].isna().all()
    assert t.loc[0, "vs_next"] == "undetermined"  # no test can be made: the order is not evidence


@pytest.mark.parametrize("runs_per_team, expected", [(3, "tied"), (4, "ahead")])
def test_best_ranking_is_tested_on_the_best_runs(tmp_path, runs_per_team, expected):
    """With ranking = "best" the test is about the best runs, not the means: 3 runs a side can never be
    significant (p >= 0.1; Welch on these tight groups would say p < 1e-5), 4 can (p = 2/70 when every
    run of one side beats every run of the other)."""
    for seed in range(runs_per_team):
        make_run(tmp_path, "alpha", 1.90 + 0.01 * seed, seed=seed + 1, ranking="best")
        make_run(tmp_path, "bravo", 2.50 + 0.01 * seed, seed=seed + 1, ranking="best")
    t = table(tmp_path, ranking="best")
    assert list(t["team"]) == ["alpha", "bravo"] and t.loc[0, "vs_next"] == expected
    assert t.loc[0, "p_vs_next"] == pytest.approx(0.1 if runs_per_team == 3 else 2 / 70)


def test_non_finite_figures_never_rank_and_never_disorder_the_others(tmp_path):
    """A NaN compares false with everything: sorted by it, a 2.0 could land above a 1.0."""
    make_run(tmp_path, "alpha", 2.0)
    make_run(tmp_path, "nan-team", float("nan"))
    make_run(tmp_path, "bravo", 1.0)
    make_run(tmp_path, "inf-team", float("inf"))
    t = table(tmp_path)
    ranked = t[t["rank"].notna()]
    assert list(ranked["team"]) == ["bravo", "alpha"] and list(ranked["rank"]) == [1, 2]
    assert set(t[t["rank"].isna()]["team"]) == {"nan-team", "inf-team"}


def test_best_ranking_uses_each_teams_best_run(tmp_path):
    make_run(tmp_path, "alpha", 2.5, seed=1)
    make_run(tmp_path, "alpha", 1.9, seed=2)
    make_run(tmp_path, "bravo", 2.0, seed=1)
    make_run(tmp_path, "bravo", 2.1, seed=2)
    assert list(table(tmp_path, ranking="best")["team"]) == ["alpha", "bravo"]
    assert list(table(tmp_path, ranking="mean")["team"]) == ["bravo", "alpha"]


def test_teams_without_an_ok_run_are_listed_below_with_their_best_status(tmp_path):
    make_run(tmp_path, "alpha", 2.0)
    make_run(tmp_path, "delta", None, status="crashed", reason="rank 1: boom", seed=1)
    make_run(tmp_path, "delta", None, status="timeout", reason="killed at the hard limit", seed=2)
    make_run(tmp_path, "echo", None, status="invalid", reason="no get_model")
    t = table(tmp_path)
    assert list(t["team"]) == ["alpha", "delta", "echo"]
    assert t.loc[1, "status"] == "timeout" and "hard limit" in t.loc[1, "reason"] and t["rank"].isna()[1]
    assert t.loc[2, "status"] == "invalid"


def test_unofficial_and_flagged_runs_do_not_rank(tmp_path):
    make_run(tmp_path, "alpha", 2.0)
    make_run(tmp_path, "fast", 1.0, official=False)
    make_run(tmp_path, "sneaky", 0.5, flagged=True, flag_reason="non-causal")
    t = table(tmp_path)
    assert list(t["team"]) == ["alpha", "sneaky"] and t.loc[1, "status"] == "flagged"
    assert t.loc[1, "reason"] == "non-causal"
    assert list(table(tmp_path, include_unofficial=True)["team"]) == ["fast", "alpha", "sneaky"]


def test_only_the_latest_submission_of_a_team_counts(tmp_path):
    make_run(tmp_path, "alpha", 1.5, sha="1" * 64, started_at="2026-11-29T09:00:00Z", seed=1)
    make_run(tmp_path, "alpha", 2.5, sha="2" * 64, started_at="2026-11-29T11:00:00Z", seed=2)
    t = table(tmp_path)
    assert t.loc[0, "val_loss"] == 2.5 and t.loc[0, "submission_sha256"] == "2" * 12


@pytest.mark.slow
def test_a_copied_runs_tree_gives_the_same_files(tmp_path, cli):
    import shutil

    runs = tmp_path / "runs"
    for seed, v in enumerate((2.0, 2.1), 1):
        make_run(runs, "alpha", v, seed=seed)
    make_run(runs, "bravo", None, status="crashed", reason="x")
    first = cli("leaderboard", "--runs-dir", str(runs), "--out", str(tmp_path / "lb1"), "--no-charts")
    shutil.copytree(runs, tmp_path / "copy")
    second = cli("leaderboard", "--runs-dir", str(tmp_path / "copy"), "--out", str(tmp_path / "lb2"), "--no-charts")
    assert first.code == 0 and second.code == 0
    assert (tmp_path / "lb1" / "local.csv").read_text() == (tmp_path / "lb2" / "local.csv").read_text()
    assert (tmp_path / "lb1" / "local.md").read_text() == (tmp_path / "lb2" / "local.md").read_text()


def test_an_unknown_track_is_an_error_with_the_near_name_and_writes_nothing(tmp_path, cli):
    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0)
    result = cli("leaderboard", "--track", "locall", "--runs-dir", str(runs), "--out", str(tmp_path / "lb"),
                 "--plots-dir", str(tmp_path / "plots"))
    assert result.code == 2
    assert "no run records for track 'locall'" in result.err and "Did you mean: local?" in result.err
    assert not (tmp_path / "lb" / "locall.csv").exists() and not (tmp_path / "plots" / "locall").exists()


def test_watch_rebuilds_when_records_change_and_only_then(tmp_path):
    from harness.results.views import watch

    make_run(tmp_path, "alpha", 2.0)
    rebuilt, ticks = [], iter(range(4))

    def tick(_seconds):  # between checks: a new record arrives once
        if len(rebuilt) == 1 and not (tmp_path / "local" / "bravo").exists():
            make_run(tmp_path, "bravo", 2.1)

    count = watch(tmp_path, ["local"], lambda: rebuilt.append(1), every_s=0.0,
                  keep_going=lambda: next(ticks, None) is not None, sleep=tick)
    assert count == 2  # the first look, then the new record; no rebuild when nothing changed
    assert len(rebuilt) == 3  # and one more when the watch ended: the pages without the reload


def _reloads(html_path) -> bool:
    return 'http-equiv="refresh"' in html_path.read_text()


def test_the_page_reloads_itself_while_watched_and_stops_when_the_watch_stops(tmp_path):
    """A page written with a reload kept reloading after `--watch` stopped, for as long as a screen showed it. While
    a watch runs, every page rebuilt from its records reloads, a `harness run`'s refresh included (one written
    without the reload stopped the screen mid-event); after it stops, the page is rebuilt without the reload,
    whether it ended or was stopped by Ctrl-C."""
    from harness.results.views import rebuild, watch

    runs, board = tmp_path / "runs", tmp_path / "lb"
    make_run(runs, "alpha", 2.0)
    html = board / "local.html"
    seen = []

    def rebuild_all():  # as `harness leaderboard --watch 15` does
        rebuild(runs, "local", board, tmp_path / "plots", charts=False, refresh_s=15)

    def tick(_seconds):
        seen.append(_reloads(html))
        rebuild(runs, "local", board, tmp_path / "plots", charts=False)  # a `harness run` finishing meanwhile
        seen.append(_reloads(html))

    ticks = iter(range(2))
    watch(runs, ["local"], rebuild_all, every_s=15, keep_going=lambda: next(ticks, None) is not None, sleep=tick)
    assert seen == [True, True, True, True] and '<meta http-equiv="refresh" content="15">' not in html.read_text()
    assert not _reloads(html) and not list(runs.glob(".leaderboard-watch-*"))

    def interrupt(_seconds):
        assert _reloads(html)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        watch(runs, ["local"], rebuild_all, every_s=15, sleep=interrupt)
    assert not _reloads(html)

    def interrupted_mid_rebuild():  # Ctrl-C after the first page is written, before its line is printed (seen in CI)
        rebuild_all()
        if not list(runs.glob(".leaderboard-watch-*")):  # the last rebuild, after the watch: it finishes
            return
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        watch(runs, ["local"], interrupted_mid_rebuild, every_s=15)
    assert not _reloads(html)
    rebuild(runs, "local", board, tmp_path / "plots", charts=False, refresh_s=15)  # no watcher: no reload
    assert not _reloads(html)


def test_ctrl_c_on_harness_leaderboard_watch_leaves_a_page_that_does_not_reload(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    runs, board = tmp_path / "runs", tmp_path / "lb"
    make_run(runs, "alpha", 2.0)
    html = board / "local.html"
    def as_a_terminal_starts_it():  # Ctrl-C's SIGINT neither blocked nor ignored, whatever this worker inherited
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "harness", "leaderboard", "--watch", "1", "--no-charts",
                             "--runs-dir", str(runs), "--out", str(board)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=as_a_terminal_starts_it)
    try:
        deadline = time.monotonic() + 60
        while not (html.exists() and _reloads(html)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        assert '<meta http-equiv="refresh" content="1">' in html.read_text()
        first = proc.stdout.readline()  # the first rebuild's line: the page is written before it is printed
        assert "local: 1 ranked of 1 teams" in first, first
        status = {line.split(":")[0]: line.split(":")[1].strip() for line in
                  open(f"/proc/{proc.pid}/status").read().splitlines() if line.startswith(("SigBlk", "SigIgn"))}
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"Ctrl-C did not stop the watch (its signal masks before it: {status})") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopped" in err and out.count("local: 1 ranked of 1 teams") == 1  # the watch's last rebuild
    assert not _reloads(html)


def test_an_unreadable_record_is_listed_not_dropped(tmp_path, cli):
    """A run.json cut off mid-write, or garbage, may hide a team's best run or its only one: the
    leaderboard lists it (status `unreadable`, the file in the reason) instead of acting as if the run
    never happened."""
    import csv

    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0, seed=1)
    cut = make_run(runs, "alpha", 1.5, seed=2) / "run.json"
    cut.write_text(cut.read_text()[:40])
    garbage = make_run(runs, "charlie", 2.5) / "run.json"
    garbage.write_bytes(b"\xff\xfe\x00 not json")
    make_run(runs, "bravo", 2.2)
    result = cli("leaderboard", "--runs-dir", str(runs), "--no-charts")
    assert result.code == 0, result.err
    rows = {r["team"]: r for r in csv.DictReader((tmp_path / "leaderboard" / "local.csv").open())}
    assert [rows[t]["rank"] for t in ("alpha", "bravo")] == ["1", "2"]
    assert str(cut) in rows["alpha"]["reason"] and "unreadable" in rows["alpha"]["reason"]
    assert rows["charlie"]["status"] == "unreadable" and rows["charlie"]["rank"] == ""
    assert str(garbage) in rows["charlie"]["reason"]
    assert str(cut) in result.err and str(garbage) in result.err  # said when the leaderboard is built, too


@pytest.mark.slow
def test_a_record_with_fields_of_the_wrong_type_is_one_unreadable_row(tmp_path, cli):
    """A figure in a record may have come from a rank (`steps = "many"` once crashed the leaderboard for
    every team), or a file edited by hand: such a record is one unreadable row, naming the field and
    the file; every other team is ranked as before, and the page and charts are built."""
    import csv

    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0)
    bad = make_run(runs, "bravo", 1.5, steps="many") / "run.json"
    odd = make_run(runs, "delta", 1.7) / "run.json"
    odd.write_text(odd.read_text().replace('"status": "ok"', '"status": "victorious"'))
    make_run(runs, "charlie", 2.2)
    huge = make_run(runs, "echo", 1.9, params=2**64) / "run.json"  # beyond int64: once failed the whole table
    result = cli("leaderboard", "--runs-dir", str(runs))
    assert result.code == 0, result.err
    rows = {r["team"]: r for r in csv.DictReader((tmp_path / "leaderboard" / "local.csv").open())}
    assert [rows[t]["rank"] for t in ("alpha", "charlie")] == ["1", "2"]
    assert rows["bravo"]["status"] == "unreadable" and rows["bravo"]["rank"] == ""
    assert str(bad) in rows["bravo"]["reason"] and "field steps is 'many', not a number" in rows["bravo"]["reason"]
    assert rows["delta"]["status"] == "unreadable" and "'victorious' is not a run status" in rows["delta"]["reason"]
    assert str(odd) in rows["delta"]["reason"]
    assert rows["echo"]["status"] == "unreadable" and "not a count from 0 to 2**62" in rows["echo"]["reason"]
    assert str(huge) in rows["echo"]["reason"]
    assert (tmp_path / "leaderboard" / "local.html").is_file()


def test_divisions_are_shown_and_ranked_together_or_apart(tmp_path):
    """Open-division runs (a team's own train.py) sit on the same leaderboard with a division column,
    or are ranked on their own when the track says divisions = "separate"; their throughput is
    marked as reported on the page."""
    from harness.results.views import rebuild

    runs = tmp_path / "runs"
    for seed, loss in ((1, 2.0), (2, 2.01)):
        make_run(runs, "fixed-a", loss, seed=seed)
    for seed, loss in ((1, 1.5), (2, 1.51)):
        make_run(runs, "open-b", loss, seed=seed, division="open", throughput_source="reported")
    for seed, loss in ((1, 3.0), (2, 3.01)):
        make_run(runs, "open-c", loss, seed=seed, division="open", throughput_source="reported")
    rows = load_rows(runs, "local")
    together = build_table(rows)
    assert list(together["team"]) == ["open-b", "fixed-a", "open-c"] and list(together["rank"]) == [1, 2, 3]
    assert list(together["division"]) == ["open", "fixed", "open"]
    apart = build_table(rows, divisions="separate")
    assert list(zip(apart["team"], apart["rank"])) == [("fixed-a", 1), ("open-b", 1), ("open-c", 2)]
    assert apart.loc[apart["team"] == "fixed-a", "vs_next"].isna().all()  # nothing to be compared with in its division
    page = rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots", charts=False).html.read_text()
    assert page.count('class="badge division"') == 2 and page.count("(reported)") == 2
    assert "division" in (tmp_path / "lb" / "local.csv").read_text().splitlines()[0]


@pytest.mark.slow
def test_compare_works_across_divisions(tmp_path, cli):
    runs = tmp_path / "runs"
    for seed, loss in ((1, 2.0), (2, 2.02), (3, 2.01)):
        make_run(runs, "fixed-a", loss, seed=seed)
        make_run(runs, "open-b", loss + 0.5, seed=seed, division="open", throughput_source="reported")
    result = cli("compare", "fixed-a", "open-b", "--runs-dir", str(runs))
    assert result.code == 0, result.text
    assert "fixed-a" in result.out and "open-b" in result.out and "significant" in result.out.lower()


@pytest.mark.parametrize("status, sha, flagged", [
    ("running", "2" * 64, False),  # a new submission's first run, its launcher SIGKILLed
    ("running", None, False),  # killed before the submission was even hashed
    ("evaluating", "2" * 64, True),  # flagging the stuck record once did not help either
    ("aborted", "2" * 64, False),  # the launcher stopped: scancel, Ctrl-C, a node without the required sandbox
])
def test_a_newer_run_in_progress_or_aborted_never_unranks_a_team(tmp_path, status, sha, flagged):
    """Issue 24: a team ranked #1 on two ok runs became 'running, unranked' once its newest record was left
    `running` by a launcher killed with SIGKILL. Only a final run the team answers for chooses its submission;
    the newer run is said on its entry, and `harness compare` finds the same runs."""
    from harness.results.compare import resolve_side

    for seed, v in ((1, 2.00), (2, 2.02)):
        make_run(tmp_path, "alpha", v, seed=seed, sha="1" * 64, started_at=f"2026-11-29T10:0{seed}:00Z")
    for seed, v in ((1, 2.50), (2, 2.52)):
        make_run(tmp_path, "bravo", v, seed=seed)
    newer = make_run(tmp_path, "alpha", None, status=status, sha=sha, seed=3, flagged=flagged,
                     flag_reason="clock disagreed" if flagged else "", started_at="2026-11-29T11:00:00Z",
                     reason="stopped by SIGTERM" if status == "aborted" else "")
    t = table(tmp_path)
    assert list(t["team"]) == ["alpha", "bravo"] and list(t["rank"]) == [1, 2]
    assert t.loc[0, "status"] == "ok" and t.loc[0, "n_runs"] == 2 and t.loc[0, "val_loss"] == pytest.approx(2.01)
    assert f"run {newer.name} {status}" in t.loc[0, "reason"] and "not counted" in t.loc[0, "reason"]
    assert len(resolve_side("alpha", tmp_path, "local", False).runs) == 2


def test_a_newer_run_the_team_answers_for_still_replaces_its_submission(tmp_path):
    """The other side of the rule: a crash of a new submission is the team's, and it is what the team now has."""
    make_run(tmp_path, "alpha", 2.0, sha="1" * 64, started_at="2026-11-29T10:00:00Z")
    make_run(tmp_path, "alpha", None, status="crashed", reason="rank 0: boom", sha="2" * 64, seed=2,
             started_at="2026-11-29T11:00:00Z")
    t = table(tmp_path)
    assert t.loc[0, "status"] == "crashed" and t["rank"].isna().all() and t.loc[0, "reason"] == "rank 0: boom"


def test_a_team_whose_only_run_is_in_progress_is_listed_as_not_finished_since_its_start(tmp_path):
    make_run(tmp_path, "alpha", 2.0)
    make_run(tmp_path, "zulu", None, status="running", started_at="2026-11-29T09:30:00Z")
    t = table(tmp_path)
    assert list(t["team"]) == ["alpha", "zulu"] and t["rank"].isna()[1]
    assert t.loc[1, "status"] == "running" and t.loc[1, "reason"] == "since 2026-11-29T09:30:00Z"


@pytest.mark.parametrize("field, official, other, counted", [
    ("budget_s", 30.0, 10.0, "a 10s budget at world size 2"),
    ("world_size", 2, 4, "a 30s budget at world size 4"),
    ("max_steps", 0, 200, "--max-steps 200 at world size 2"),
])
def test_all_never_averages_runs_of_different_setups(tmp_path, field, official, other, counted):
    """`--all` adds a team's unofficial runs: made with another budget, world size or step bound, their losses are
    of another kind, and a mean of both kinds is the figure of no run. The newest run's setup is counted, the rest
    is named in the reason, and the charts are drawn from the same runs."""
    base = {"budget_s": 30.0, "world_size": 2, "max_steps": 0}
    for seed, v in ((1, 2.00), (2, 2.02)):
        make_run(tmp_path, "alpha", v, seed=seed, started_at=f"2026-11-29T10:0{seed}:00Z", **{**base, field: official})
    for seed, v in ((3, 3.00), (4, 3.10)):  # later, with an override (unofficial)
        make_run(tmp_path, "alpha", v, seed=seed, official=False, started_at=f"2026-11-29T11:0{seed}:00Z",
                 **{**base, field: other})
    t = table(tmp_path)
    assert t.loc[0, "n_runs"] == 2 and t.loc[0, "val_loss"] == pytest.approx(2.01) and t.loc[0, "reason"] == ""
    every = table(tmp_path, include_unofficial=True)
    assert every.loc[0, "n_runs"] == 2 and every.loc[0, "val_loss"] == pytest.approx(3.05)
    assert every.loc[0, "reason"] == (f"counted: 2 ok run(s) with {counted} (its newest run's setup); "
                                      "left out: 2 with a 30s budget at world size 2")
    from harness.results.leaderboard import counted_runs

    charted = counted_runs(load_rows(tmp_path, "local"))["alpha"]
    assert sorted(r["val_loss"] for r in charted) == [3.00, 3.10]


def test_a_ranking_with_nobody_in_it_says_why_and_what_to_type(tmp_path):
    """Only unofficial runs (seeds at --max-steps, say): the page and the Markdown said '0 ranked of 0 teams' over an
    empty table. They say no official run exists yet and the command that shows the unofficial ones."""
    from harness.results.views import rebuild

    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0, official=False)
    out = rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots", charts=False)
    page, markdown = out.html.read_text(), out.markdown.read_text()
    assert ('<p class="empty"><b>No official runs yet.</b> <code>harness leaderboard --track local --all</code> '
            "shows 1 unofficial run of 1 team (in local-all.html): a run made with a command-line override "
            "(<code>--max-steps</code>, <code>--budget-s</code>, ...) is unofficial and never ranked.</p>") in page
    assert ("**No official runs yet.** `harness leaderboard --track local --all` shows 1 unofficial run of 1 team "
            "(in local-all.html)") in markdown
    everything = rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots", include_unofficial=True, charts=False)
    assert 'class="empty"' not in everything.html.read_text()  # --all ranks it
    # Teams that ran officially and none finished: the table lists them; the note says so, and that --all shows
    # the unofficial run that did finish.
    make_run(runs, "bravo", None, status="crashed", reason="rank 1: boom")
    page = rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots", charts=False).html.read_text()
    assert "<b>No official run has finished yet.</b> <code>harness leaderboard --track local --all</code> shows " \
           "1 unofficial run that finished" in page
    assert "The 1 team in the table ran officially without finishing: each row says why." in page


def test_two_runs_folders_never_overwrite_each_others_board(tmp_path, cli):
    """`harness run` into runs/ and `harness leaderboard --runs-dir event-runs` once both wrote
    leaderboard/local.*: each board is now beside its runs folder and named after it."""
    import csv

    make_run(tmp_path / "runs", "alpha", 2.0)
    make_run(tmp_path / "event-runs", "bravo", 2.5)
    for runs in ("runs", "event-runs"):
        result = cli("leaderboard", "--runs-dir", str(tmp_path / runs), "--no-charts")
        assert result.code == 0, result.err
    mine = [r["team"] for r in csv.DictReader((tmp_path / "leaderboard" / "local.csv").open())]
    event = [r["team"] for r in csv.DictReader((tmp_path / "event-runs-leaderboard" / "local.csv").open())]
    assert mine == ["alpha"] and event == ["bravo"]
    assert str(tmp_path / "event-runs-leaderboard" / "local.csv") in result.out
    # An explicit --out still wins.
    result = cli("leaderboard", "--runs-dir", str(tmp_path / "event-runs"), "--no-charts", "--out", str(tmp_path / "x"))
    assert result.code == 0 and (tmp_path / "x" / "local.csv").is_file()


def test_team_text_that_reads_as_math_never_stops_the_board(tmp_path, cli):
    """A team name or a crash reason with `$\\q$` in it was read by the chart library as a formula, raised, and
    no table of the track was written (the board frozen for every team). Text is text in every chart; a chart
    that fails all the same leaves the tables written and says so."""
    import csv

    runs = tmp_path / "runs"
    make_run(runs, "Team $\\q$", 2.0, seed=1)
    make_run(runs, "Team $\\q$", 2.1, seed=2)
    make_run(runs, "bravo", None, status="crashed", reason="rank 0: m.py:4: E: $\\q$ and $\\frac{$")
    make_run(runs, "charlie", 2.2)
    result = cli("leaderboard", "--runs-dir", str(runs))
    assert result.code == 0, result.text
    assert "could not be drawn" not in result.err
    rows = {r["team"]: r for r in csv.DictReader((tmp_path / "leaderboard" / "local.csv").open())}
    assert rows["Team $\\q$"]["rank"] == "1" and rows["bravo"]["status"] == "crashed"
    assert (tmp_path / "plots" / "local" / "val_loss.png").is_file()


def test_a_chart_that_fails_leaves_the_tables_written(tmp_path, monkeypatch):
    from harness.results import views
    from harness.results.charts import plots

    make_run(tmp_path / "runs", "alpha", 2.0)

    def broken(*args, **kwargs):
        raise ValueError("a chart that cannot be drawn")

    monkeypatch.setattr(plots, "draw_track", broken)
    out = views.rebuild(tmp_path / "runs", "local", tmp_path / "lb", tmp_path / "plots")
    assert out.csv.is_file() and out.html.is_file() and out.charts == []
    assert out.chart_error == "ValueError: a chart that cannot be drawn"


def test_two_folders_never_share_a_teams_entry(tmp_path):
    """Runs of a second folder under a team's name (made before the identity rule refused them, or planted) are
    shown apart as "name [folder]": the folder whose run used the name first keeps the entry, and a later crash
    of the other folder never takes its place as the team's latest submission."""
    runs = tmp_path / "runs"
    make_run(runs, "Rapides", 2.0, seed=1, submission_dir="/event/submissions/theirs", started_at="2026-11-29T10:00:00Z")
    make_run(runs, "Rapides", None, seed=1, sha="b" * 64, status="crashed", reason="boom",
             submission_dir="/home/x/mine", started_at="2026-11-29T11:00:00Z")
    entries = {row["team"]: row for row in table(runs).to_dict("records")}
    assert entries["Rapides"]["rank"] == 1 and entries["Rapides"]["val_loss"] == 2.0
    assert entries["Rapides [mine]"]["status"] == "crashed"


def test_a_refused_run_owns_no_name_on_the_board(tmp_path):
    """Review of 2026-12-03: folder beta was refused for claiming another folder's name and its run recorded as
    "beta"; folder alpha then took the name "beta" (a refused run owns none, identity.py). The board gave the name
    to the refused run, and showed the team that owns it as "beta [alpha]"."""
    runs = tmp_path / "runs"
    make_run(runs, "beta", None, status="invalid", reason="team name 'Alpha' belongs to folder 'gamma'",
             submission_dir="/event/submissions/beta", started_at="2026-11-29T10:00:00Z",
             extra={"identity": {"claimed": "Alpha", "folder": "beta", "refused": "team name 'Alpha' belongs to ..."}})
    make_run(runs, "beta", 2.0, sha="b" * 64, submission_dir="/event/submissions/alpha", started_at="2026-11-29T11:00:00Z")
    entries = {row["team"]: row for row in table(runs).to_dict("records")}
    assert entries["beta"]["rank"] == 1 and entries["beta"]["val_loss"] == 2.0
    assert entries["beta [beta]"]["status"] == "invalid"
