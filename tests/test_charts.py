"""What the charts show, read off the matplotlib figures before they become PNGs."""

import itertools
import math

import pandas as pd

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex, to_rgb

from harness.results.charts.colors import NOT_FINISHED, PALETTE, TeamColors, team_colors
from harness.results.compare import Side
from harness.results.charts.compare_chart import overlay_figure, side_colors
from harness.results.leaderboard import build_table, current_runs, load_rows, scored
from harness.results.charts.loss_charts import loss_figure, val_loss_figure
from harness.results.charts.rate_charts import scaling_figure, throughput_figure
from records_factory import make_run

NO_TEAMS = TeamColors([])  # charts of a track whose teams' order does not matter to the test: colours by hash


def _track(root, **kw):
    rows = load_rows(root, "local")
    table = build_table(rows, **kw)
    counted = {t: [r for r in runs if scored(r)] for t, runs in current_runs(rows).items()}
    return table, counted


def _line_colors(fig) -> list[str]:
    return [to_hex(line.get_color()) for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata())]


def _texts(fig) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_a_team_has_one_colour_in_every_chart_whatever_the_order(tmp_path):
    for seed in (1, 2):
        make_run(tmp_path, "alpha", 2.0 + seed / 100, seed=seed)
        make_run(tmp_path, "bravo", 2.3 + seed / 100, seed=seed, started_at="2026-11-29T09:00:00Z")
    table, counted = _track(tmp_path)
    colors = team_colors(load_rows(tmp_path, "local"))
    assert colors("bravo") == PALETTE[0] and colors("alpha") == PALETTE[1]  # bravo's first run came first
    board = loss_figure("local", table, {"bravo": counted["bravo"]}, "train_time_s", colors=colors)
    assert set(_line_colors(board)) == {colors("bravo")}
    for order in (["alpha", "bravo"], ["bravo", "alpha"]):  # compare's first side used to take the first colour
        sides = [Side(t, counted[t]) for t in order]
        fig = overlay_figure(sides, side_colors(sides))  # the track's colours, read from the records beside the runs
        drawn = _line_colors(fig)
        assert set(drawn) == {colors("alpha"), colors("bravo")}
        first_side_lines = drawn[: len(counted[order[0]])]
        assert set(first_side_lines) == {colors(order[0])}


def _lab(color: str) -> tuple[float, float, float]:
    """CIELAB (D65) of an sRGB colour, from the standard formulas: distances in it follow what people see."""
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(color)]
    x, y, z = (sum(w * c for w, c in zip(row, linear)) / white for row, white in zip(
        ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505)), (0.95047, 1.0, 1.08883)))
    f = [t ** (1 / 3) if t > (6 / 29) ** 3 else t / (3 * (6 / 29) ** 2) + 4 / 29 for t in (x, y, z)]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_twenty_teams_get_twenty_colours_people_can_tell_apart(tmp_path):
    """Teams take the palette in the order they arrived, so 20 teams have 20 colours, every two at least 25 apart
    in CIELAB (CIE76 Delta E: 2 is just noticeable, 25 a different colour), each far from the grey of teams that
    did not finish and from the white page. The old hash of a name into 14 colours gave these 20 teams 9."""
    names = [f"team-{i:02d}" for i in range(20)]
    for i, name in enumerate(reversed(names)):  # arrival order is not name order
        make_run(tmp_path, name, 2.0 + i / 100, started_at=f"2026-11-29T10:{i:02d}:00Z")
    colors = team_colors(load_rows(tmp_path, "local"))
    assigned = [colors(t) for t in names]
    assert len(set(assigned)) == 20
    closest = min(math.dist(_lab(a), _lab(b)) for a, b in itertools.combinations(assigned, 2))
    assert closest >= 25, closest
    assert min(math.dist(_lab(c), _lab(NOT_FINISHED)) for c in assigned) >= 20
    assert min(math.dist(_lab(c), _lab("#ffffff")) for c in assigned) >= 30  # a line on the page, not a ghost
    assert colors("team-19") == PALETTE[0]  # the first to arrive
    # A newcomer changes no one's colour; the first two teams get the two most different colours.
    make_run(tmp_path, "late", 2.5, started_at="2026-11-30T00:00:00Z")
    assert [team_colors(load_rows(tmp_path, "local"))(t) for t in names] == assigned
    assert math.dist(_lab(PALETTE[0]), _lab(PALETTE[1])) >= 80


def test_val_loss_chart_shows_n_draws_no_interval_from_one_run_and_lists_non_finishers(tmp_path):
    for seed, v in enumerate((2.00, 2.02, 2.01), 1):
        make_run(tmp_path, "alpha", v, seed=seed)
    make_run(tmp_path, "bravo", 2.4)
    make_run(tmp_path, "delta", None, status="crashed", reason="rank 1: boom")
    table, counted = _track(tmp_path)
    fig = val_loss_figure("local", table, counted, colors=NO_TEAMS)
    text = _texts(fig)
    assert "n=3" in text and "2.4000   n=1: no interval" in text
    assert "did not finish: crashed\nrank 1: boom" in text
    ax = fig.axes[0]
    bars = [c for c in ax.collections if c.get_segments()]  # error bars: only alpha has one
    assert len(bars) == 1
    assert [t.get_text() for t in ax.get_yticklabels()] == ["#1 alpha", "#2 bravo", "delta"]


def test_loss_axes_show_the_curves_not_the_floor_or_the_first_steps(tmp_path):
    make_run(tmp_path, "alpha", 2.0, loss_floor=1.0)
    table, counted = _track(tmp_path)
    fig = loss_figure("local", table, counted, "tokens", colors=NO_TEAMS)
    bottom, top = fig.axes[0].get_ylim()
    assert bottom > 1.5 and top < 4.0  # curves run from 2.3 down to 2.0; the floor is 1.0, the start 5.0
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("loss floor 1.000, below the axis" in t for t in labels)
    assert any("first steps, above the axis" in t for t in labels)


def test_scaling_chart_before_any_scale_says_what_to_run():
    fig = scaling_figure("local", [], colors=NO_TEAMS)
    assert "harness scale submissions/<team> --track local" in _texts(fig)
    assert not fig.axes[0].axison


def test_scaling_chart_draws_measured_and_predicted_differently():
    record = {"team": "alpha", "device_name": "cpu", "track_world_size": 32, "created_at": "x",
              "points": [{"world_size": 1, "weak_scaling_efficiency": 1.0}, {"world_size": 2, "weak_scaling_efficiency": 0.7}],
              "prediction": {"1": {"efficiency": 1.0}, "2": {"efficiency": 0.72}, "32": {"efficiency": 0.5}}}
    fig = scaling_figure("local", [record], colors=NO_TEAMS)
    lines = fig.axes[0].get_lines()
    measured = next(line for line in lines if line.get_label().endswith("measured (cpu)"))
    predicted = next(line for line in lines if line.get_label().endswith("predicted (model)"))
    assert measured.get_linestyle() == "-" and predicted.get_linestyle() == "--"
    assert list(measured.get_xdata()) == [1, 2] and list(predicted.get_xdata()) == [1, 2, 32]
    assert "predicted 0.500\nat 32 devices" in _texts(fig)


def test_a_track_with_many_teams_keeps_its_charts_readable(tmp_path):
    from harness.results.charts.loss_charts import CURVE_TEAMS, ROW_TEAMS

    for i in range(40):
        make_run(tmp_path, f"team{i:02d}", 2.0 + i / 100)
    table, counted = _track(tmp_path)
    colors = team_colors(load_rows(tmp_path, "local"))
    loss = loss_figure("local", table, counted, "train_time_s", colors=colors)
    assert f"(top {CURVE_TEAMS} of 40 teams)" in loss.axes[0].get_title()
    assert len(set(_line_colors(loss))) == CURVE_TEAMS  # 12 teams drawn, 12 colours
    rows = val_loss_figure("local", table, counted, colors=colors)
    assert len(rows.axes[0].get_yticklabels()) == ROW_TEAMS and rows.get_size_inches()[1] < 25
    bars = throughput_figure("local", table, colors=colors)
    assert f"(top {ROW_TEAMS} of 40)" in bars.axes[0].get_title() and bars.get_size_inches()[1] < 16


def _legend(fig) -> list[str]:
    return [t.get_text() for t in fig.axes[0].get_legend().get_texts()]


def _ranked_marks(ax) -> dict[str, tuple[float, float, float]]:
    """Each error bar's colour -> (its centre, its bottom, its top): the ranked figures drawn beside the curves."""
    marks = {}
    for container in ax.containers:
        (line, _caps, bars) = container.lines
        y = float(line.get_ydata()[0])
        segments = bars[0].get_segments() if bars else []
        low, high = (float(segments[0][0][1]), float(segments[0][1][1])) if segments else (y, y)
        marks[to_hex(line.get_color())] = (y, min(low, high), max(low, high))
    return marks


def test_the_loss_charts_show_the_rankings_figure_and_say_what_the_bold_line_is(tmp_path):
    """A newcomer read the bold curve and its star as the team's result: one run, perhaps the luckiest. Beside the
    curves, each team's ranked figure (the mean with its 95% interval, n) is drawn and labelled, with 'tied' where
    the ranking says so; the legend says what bold, thin, a star and a diamond are; the bold run is the one nearest
    the mean, not the best."""
    for seed, v in enumerate((2.00, 2.01, 2.05), 1):
        make_run(tmp_path, "alpha", v, seed=seed)
    for seed, v in enumerate((2.02, 2.04, 2.06), 1):
        make_run(tmp_path, "bravo", v, seed=seed)
    make_run(tmp_path, "charlie", 2.6)
    table, counted = _track(tmp_path)
    colors = team_colors(load_rows(tmp_path, "local"))
    by_team = {row["team"]: row for _, row in table.iterrows()}
    assert by_team["alpha"]["tied_with"] == "#2"  # the ranking's own verdict, which the chart must repeat
    for x_col in ("train_time_s", "tokens"):
        fig = loss_figure("local", table, counted, x_col, colors=colors)
        legend = _legend(fig)
        assert legend[0] == "train loss: bold the run nearest the mean, thin other runs"
        assert legend[1:3] == ["a run's val loss", "the ranking's figure: mean val loss and its interval"]
        alpha, bravo = by_team["alpha"], by_team["bravo"]
        interval = {t: f"{by_team[t]['interval_low']:.4f}–{by_team[t]['interval_high']:.4f}" for t in ("alpha", "bravo")}
        assert f"#1 alpha: {alpha['val_loss']:.4f}, {interval['alpha']}, n=3, tied with #2" in legend
        assert f"#2 bravo: {bravo['val_loss']:.4f}, {interval['bravo']}, n=3, tied with #1" in legend
        assert "#3 charlie: 2.6000, n=1: no interval" in legend
        marks = _ranked_marks(fig.axes[0])
        for team in ("alpha", "bravo"):
            y, low, high = marks[colors(team)]
            row = by_team[team]
            assert math.isclose(y, row["val_loss"])
            assert math.isclose(low, row["interval_low"]) and math.isclose(high, row["interval_high"])
        assert marks[colors("charlie")][1:] == (2.6, 2.6)  # no interval from one run
        bold = [line for line in fig.axes[0].get_lines() if line.get_linewidth() > 2 and
                to_hex(line.get_color()) == colors("alpha")]
        assert len(bold) == 1 and math.isclose(bold[0].get_ydata()[-1], 2.01 + 3.0 / 92)  # the 2.01 run: the median
    best_table, _ = _track(tmp_path, ranking="best")
    best = loss_figure("local", best_table, counted, "train_time_s", colors=colors, ranking="best")
    assert _legend(best)[0] == "train loss: bold the best run, thin other runs"
    assert "#1 alpha: best 2.0000 of n=3, tied with #2" in _legend(best)  # 3 runs a side: never significant


def _tick_labels(axis) -> list[str]:
    FigureCanvasAgg(axis.get_figure())
    axis.get_figure().canvas.draw()
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def test_token_axes_are_written_in_tokens(tmp_path):
    """An engineering suffix wrote 200,000 tokens as "200k", and a fraction as "200m", which reads as milli: the
    tick labels are plain numbers and the axis label says the unit in words."""
    make_run(tmp_path, "alpha", 2.0, tokens=27_300)  # curves to 27,300 tokens: ticks in thousands
    table, counted = _track(tmp_path)
    fig = loss_figure("local", table, counted, "tokens", colors=NO_TEAMS)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "tokens seen (thousands)"
    labels = _tick_labels(ax.xaxis)
    assert labels and all(label.replace(",", "").replace(".", "").lstrip("−-").isdigit() for label in labels), labels
    assert "25" in labels
    big = tmp_path / "big"
    metrics = make_run(big, "alpha", 2.0, tokens=250_000_000, tokens_per_s=8_000_000.0) / "metrics.csv"
    curve = pd.read_csv(metrics)
    curve["tokens"] *= 10_000  # 3 million to 273 million tokens
    curve.to_csv(metrics, index=False)
    table, counted = _track(big)
    fig = loss_figure("local", table, counted, "tokens", colors=NO_TEAMS)
    assert fig.axes[0].get_xlabel() == "tokens seen (millions)"
    assert "200" in _tick_labels(fig.axes[0].xaxis)
    bars = throughput_figure("local", table, colors=NO_TEAMS)
    assert bars.axes[0].get_xlabel() == "tokens per second, all devices (millions)"
    assert all("m" not in label and "M" not in label for label in _tick_labels(bars.axes[0].xaxis))


def test_empty_charts_say_why_and_what_to_type(tmp_path):
    """Every run so far unofficial (a --max-steps seed, say): the charts say so and name the command that shows them,
    instead of empty axes or 'no finished runs yet'."""
    from harness.results.charts.empty import empty_state

    make_run(tmp_path, "alpha", 2.0, official=False)
    rows = load_rows(tmp_path, "local")
    table = build_table(rows)
    empty = empty_state(rows, table, "local", include_unofficial=False)
    for fig in (loss_figure("local", table, {}, "train_time_s", colors=NO_TEAMS, empty=empty),
                loss_figure("local", table, {}, "tokens", colors=NO_TEAMS, empty=empty),
                val_loss_figure("local", table, {}, colors=NO_TEAMS, empty=empty),
                throughput_figure("local", table, colors=NO_TEAMS, empty=empty)):
        text = _texts(fig)
        assert "No official runs yet." in text and "harness leaderboard --track local --all" in text
        assert "1 unofficial run of 1 team" in text and not fig.axes[0].axison


def _dashed(ax) -> list:
    return [line for line in ax.get_lines() if line.get_linestyle() == "--"]


def test_the_axes_fit_the_data_and_the_floor_when_it_is_near(tmp_path):
    """The val_loss axis ran to 10 for figures near 2.7: a t interval from 2 runs (0.41 to 4.99) and room for text
    inside the axes. The axis spans the intervals with a margin, the floor with them when it is near (else the label
    says it is left of the axis), and the figures are written right of the axes; the loss charts alike."""
    for seed, v in enumerate((2.52, 2.88), 1):
        make_run(tmp_path, "wide", v, seed=seed, loss_floor=1.64)
    for seed, v in enumerate((2.70, 2.71, 2.72), 1):
        make_run(tmp_path, "tight", v, seed=seed, loss_floor=1.64)
    table, counted = _track(tmp_path)
    fig = val_loss_figure("local", table, counted, colors=NO_TEAMS)
    ax = fig.axes[0]
    left, right = ax.get_xlim()
    assert 2.88 < right < 2.88 + 0.1 and 2.3 < left < 2.52, (left, right)  # the data and a margin: 2.52 to 2.88
    assert "loss floor 1.640, left of this axis" in ax.get_xlabel() and not _dashed(ax)  # 2.4 spans below: not drawn
    texts = [t for t in ax.texts if "n=2" in t.get_text()]
    assert texts and texts[0].xy[0] == 1.0  # at the right edge of the axes (axes fraction), never inside the data
    assert "2.5200–2.8800 (min–max)" in texts[0].get_text()
    for x_col in ("train_time_s", "tokens"):
        bottom, top = loss_figure("local", table, counted, x_col, colors=NO_TEAMS).axes[0].get_ylim()
        assert 2.3 < bottom and top < 3.3, (x_col, bottom, top)  # the curves end near 2.5 to 2.9
    near = tmp_path / "near"
    for seed, v in enumerate((1.90, 2.00, 1.95), 1):
        make_run(near, "alpha", v, seed=seed, loss_floor=1.64)
    table, counted = _track(near)
    ax = val_loss_figure("local", table, counted, colors=NO_TEAMS).axes[0]
    left, right = ax.get_xlim()
    assert 1.55 < left < 1.64 and right < 2.2, (left, right)  # the floor is in, with a margin, and nothing far right
    assert [line.get_xdata()[0] for line in _dashed(ax)] == [1.64]  # the floor's dashed line


def test_a_panel_without_figures_is_not_drawn_and_the_figure_fits_the_panels(tmp_path):
    """On a CPU no team has an MFU: the MFU panel was an empty frame with a sentence in it. It is not drawn; the
    sentence is said once under the panels, and the figure is as tall as the two panels drawn. With MFU figures, the
    panel is drawn."""
    make_run(tmp_path, "alpha", 2.0, comm_overlap_efficiency=0.9)
    make_run(tmp_path, "bravo", 2.1, comm_overlap_efficiency=0.8)
    table, _ = _track(tmp_path)
    cpu = throughput_figure("local", table, colors=NO_TEAMS)
    assert [ax.get_title() for ax in cpu.axes] == ["Throughput: track local",
                                                   "Comm overlap (probe at the run's world size)"]
    assert any("MFU n/a" in t.get_text() for t in cpu.texts)
    gpu_runs = tmp_path / "gpu"
    make_run(gpu_runs, "alpha", 2.0, comm_overlap_efficiency=0.9, mfu=0.41)
    make_run(gpu_runs, "bravo", 2.1, comm_overlap_efficiency=0.8, mfu=0.38)
    gpu_table, _ = _track(gpu_runs)
    gpu = throughput_figure("local", gpu_table, colors=NO_TEAMS)
    assert [ax.get_title() for ax in gpu.axes][1] == "Model FLOPs utilisation" and len(gpu.axes) == 3
    assert cpu.get_size_inches()[1] < gpu.get_size_inches()[1] * 0.75


def test_a_missing_measurement_reads_the_same_in_the_tables_the_page_and_the_charts(tmp_path):
    """The open division's comm overlap (its own train.py runs no probe) was blank in the table and "n/a" on the
    chart; MFU on a CPU "n/a" on the page and blank in the Markdown. A ranked team's missing measurement reads
    cells.NOT_MEASURED everywhere; a figure reads the same everywhere too (≈100% above 1)."""
    from harness.results.cells import NOT_MEASURED, cell
    from harness.results.page import to_html
    from harness.results.tables import MARKDOWN_COLUMNS, to_markdown

    make_run(tmp_path, "fixed", 2.0, comm_overlap_efficiency=1.02)
    make_run(tmp_path, "open", 2.1, division="open")
    table, _ = _track(tmp_path)
    fig = throughput_figure("local", table, colors=NO_TEAMS)
    comm = next(ax for ax in fig.axes if ax.get_title().startswith("Comm overlap"))
    on_chart = [t.get_text() for t in comm.texts]  # the bars' labels, top team first
    by = {row["team"]: row for _, row in table.iterrows()}
    assert on_chart == [cell("comm_overlap_efficiency", by["fixed"]), cell("comm_overlap_efficiency", by["open"])]
    assert on_chart == ["≈100%", NOT_MEASURED]
    md = to_markdown(table, "local", "mean")
    open_row = next(line for line in md.splitlines() if line.startswith("| 2 | open |"))
    cells = dict(zip(MARKDOWN_COLUMNS, (c.strip() for c in open_row.strip("|").split("|"))))
    assert cells["comm_overlap_efficiency"] == cells["mfu"] == NOT_MEASURED and cells["tokens_per_s"] == "1,000"
    page = to_html(table, "local", "mean", [], "now", colors=lambda team: "#000000")
    assert f'<td class="comm_overlap_efficiency wide">{NOT_MEASURED}</td>' in page
    assert '<td class="comm_overlap_efficiency wide">≈100%</td>' in page
    assert f'<td class="mfu wide">{NOT_MEASURED}</td>' in page
