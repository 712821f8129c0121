"""What the charts show, read off the matplotlib figures before they become PNGs."""

from matplotlib.colors import to_hex

from harness.results.compare import Side
from harness.results.compare_chart import overlay_figure
from harness.results.leaderboard import build_table, current_runs, load_rows, scored
from harness.results.loss_charts import loss_figure, val_loss_figure
from harness.results.plots import team_color
from harness.results.rate_charts import scaling_figure
from records_factory import make_run


def _track(root):
    rows = load_rows(root, "local")
    table = build_table(rows)
    counted = {t: [r for r in runs if scored(r)] for t, runs in current_runs(rows).items()}
    return table, counted


def _line_colors(fig) -> list[str]:
    return [to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata())]


def _texts(fig) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_a_team_has_one_colour_in_every_chart_whatever_the_order(tmp_path):
    for seed in (1, 2):
        make_run(tmp_path, "alpha", 2.0 + seed / 100, seed=seed)
        make_run(tmp_path, "bravo", 2.3 + seed / 100, seed=seed)
    table, counted = _track(tmp_path)
    board = loss_figure("local", table, {"bravo": counted["bravo"]}, "train_time_s")
    assert set(_line_colors(board)) == {team_color("bravo")}
    for order in (["alpha", "bravo"], ["bravo", "alpha"]):  # compare's first side used to take the first colour
        fig = overlay_figure([Side(t, counted[t]) for t in order])
        colors = _line_colors(fig)
        assert set(colors) == {team_color("alpha"), team_color("bravo")}
        first_side_lines = colors[: len(counted[order[0]])]
        assert set(first_side_lines) == {team_color(order[0])}
    assert team_color("alpha") == team_color("alpha") and team_color("alpha") != team_color("bravo")


def test_val_loss_chart_shows_n_draws_no_interval_from_one_run_and_lists_non_finishers(tmp_path):
    for seed, v in enumerate((2.00, 2.02, 2.01), 1):
        make_run(tmp_path, "alpha", v, seed=seed)
    make_run(tmp_path, "bravo", 2.4)
    make_run(tmp_path, "delta", None, status="crashed", reason="rank 1: boom")
    table, counted = _track(tmp_path)
    fig = val_loss_figure("local", table, counted)
    text = _texts(fig)
    assert "n=3" in text and "2.4000   n=1: no interval" in text
    assert "did not finish: crashed (rank 1: boom)" in text
    ax = fig.axes[0]
    bars = [c for c in ax.collections if c.get_segments()]  # error bars: only alpha has one
    assert len(bars) == 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["#1 alpha", "#2 bravo", "delta"]


def test_loss_axes_show_the_curves_not_the_floor_or_the_first_steps(tmp_path):
    make_run(tmp_path, "alpha", 2.0, loss_floor=1.0)
    table, counted = _track(tmp_path)
    fig = loss_figure("local", table, counted, "tokens")
    bottom, top = fig.axes[0].get_ylim()
    assert bottom > 1.5 and top < 4.0  # curves run from 2.3 down to 2.0; the floor is 1.0, the start 5.0
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("loss floor 1.000, below the axis" in t for t in labels)
    assert any("first steps, above the axis" in t for t in labels)


def test_scaling_chart_before_any_scale_says_what_to_run():
    fig = scaling_figure("local", [])
    assert "harness scale submissions/<team> --track local" in _texts(fig)
    assert not fig.axes[0].axison


def test_scaling_chart_draws_measured_and_predicted_differently():
    record = {"team": "alpha", "device_name": "cpu", "track_world_size": 32, "created_at": "x",
              "points": [{"world_size": 1, "weak_scaling_efficiency": 1.0}, {"world_size": 2, "weak_scaling_efficiency": 0.7}],
              "prediction": {"1": {"efficiency": 1.0}, "2": {"efficiency": 0.72}, "32": {"efficiency": 0.5}}}
    fig = scaling_figure("local", [record])
    lines = fig.axes[0].get_lines()
    measured = next(line for line in lines if line.get_label().endswith("measured (cpu)"))
    predicted = next(line for line in lines if line.get_label().endswith("predicted (model)"))
    assert measured.get_linestyle() == "-" and predicted.get_linestyle() == "--"
    assert list(measured.get_xdata()) == [1, 2] and list(predicted.get_xdata()) == [1, 2, 32]
    assert "predicted 0.500\nat 32 devices" in _texts(fig)


def test_a_track_with_many_teams_keeps_its_charts_readable(tmp_path):
    from harness.results.loss_charts import CURVE_TEAMS, ROW_TEAMS
    from harness.results.rate_charts import throughput_figure

    for i in range(40):
        make_run(tmp_path, f"team{i:02d}", 2.0 + i / 100)
    table, counted = _track(tmp_path)
    loss = loss_figure("local", table, counted, "train_time_s")
    assert f"(top {CURVE_TEAMS} of 40 teams)" in loss.axes[0].get_title()
    assert len(set(_line_colors(loss))) <= CURVE_TEAMS
    rows = val_loss_figure("local", table, counted)
    assert len(rows.axes[0].get_yticklabels()) == ROW_TEAMS and rows.get_size_inches()[1] < 25
    bars = throughput_figure("local", table)
    assert f"(top {ROW_TEAMS} of 40)" in bars.axes[0].get_title() and bars.get_size_inches()[1] < 16
