"""The leaderboard page in a real headless browser (Debian's Chromium, through Selenium)."""

import csv
import shutil

import pytest

from records_factory import make_run

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _driver(width: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver_path, "Chromium and ChromeDriver are needed (scripts/test installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--window-size={width},1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver_path), options=options)


@pytest.fixture
def browser():
    driver = _driver(1400)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(tmp_path, cli):
    """A track with a clear winner, a tie, a single-run team (undetermined) and a crash, as a page."""
    runs = tmp_path / "runs"
    for seed, v in enumerate((2.00, 2.01), 1):
        make_run(runs, "alpha", v, seed=seed, params=425984, tokens=1196032 + seed)
    for seed, v in enumerate((2.30, 2.32, 2.31), 1):
        make_run(runs, "gamma", v, seed=seed)
    for seed, v in enumerate((2.305, 2.315, 2.325), 1):
        make_run(runs, "kappa", v, seed=seed)
    make_run(runs, "beta", 2.6)
    make_run(runs, "delta", None, status="crashed", reason="rank 1: RuntimeError: deliberate crash on rank 1")
    result = cli("leaderboard", "--runs-dir", str(runs), "--out", str(tmp_path / "leaderboard"),
                 "--plots-dir", str(tmp_path / "plots"))
    assert result.code == 0, result.err
    return tmp_path / "leaderboard" / "local.html"


def test_page_loads_with_rows_in_order_and_embedded_charts(page, browser, tmp_path):
    with open(page.with_suffix(".csv")) as fh:
        expected = [row["team"] for row in csv.DictReader(fh)]
    assert expected == ["alpha", "gamma", "kappa", "beta", "delta"]
    # The page travels alone: moved to another folder, away from plots/, every chart still shows.
    moved = tmp_path / "elsewhere" / "board.html"
    moved.parent.mkdir()
    shutil.copy(page, moved)
    shutil.rmtree(tmp_path / "plots")
    browser.get(moved.as_uri())
    assert browser.title == "Leaderboard: local"
    rows = browser.find_elements("css selector", "#leaderboard tbody tr[data-team]")
    assert [r.get_attribute("data-team") for r in rows] == expected
    assert rows[0].find_element("css selector", "td.rank").text == "1"
    images = browser.find_elements("css selector", ".charts img")
    assert len(images) == 5
    for img in images:
        assert img.get_attribute("src").startswith("data:image/png;base64,"), "charts must be embedded"
        loaded = browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
        assert loaded, f"chart {img.get_attribute('alt')} did not load"
    assert page.stat().st_size < 1_000_000


def test_ties_undetermined_orders_and_reasons_are_on_the_page(page, browser):
    browser.get(page.as_uri())
    by_team = {r.get_attribute("data-team"): r for r in browser.find_elements("css selector", "#leaderboard tbody tr[data-team]")}
    assert by_team["alpha"].find_element("css selector", ".badge").text == "ahead"
    assert by_team["gamma"].find_element("css selector", ".badge").text == "tied with #3"
    assert by_team["kappa"].find_element("css selector", ".badge").text == "undetermined"  # beta has one run
    assert by_team["kappa"].find_element("css selector", ".badge").is_displayed()
    assert {t for t, r in by_team.items() if "tied" in r.get_attribute("class").split()} == {"gamma", "kappa"}
    notice = by_team["delta"].find_element("css selector", "td.notice")
    assert notice.find_element("css selector", ".status").text == "crashed"
    assert "deliberate crash on rank 1" in notice.text and notice.is_displayed()


def test_intervals_and_run_counts_are_on_the_page(page, browser):
    """The interval of each mean, beside n: from 2 runs their range, from 3 the 95% t interval; none for a single
    run. Half-widths computed here from the runs and the t table (t(0.975, 2) = 4.303), not by the harness's code."""
    browser.get(page.as_uri())
    by_team = {r.get_attribute("data-team"): r for r in browser.find_elements("css selector", "#leaderboard tbody tr[data-team]")}

    def cell(team, col):
        element = by_team[team].find_element("css selector", f"td.{col}")
        assert element.is_displayed(), (team, col)
        return element.text

    def half_width(values, t):
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        return t * std / len(values) ** 0.5

    assert cell("alpha", "interval") == "2.0000–2.0100 (min–max)" and cell("alpha", "n_runs") == "2"
    half = half_width([2.30, 2.32, 2.31], 4.303)
    assert cell("gamma", "interval") == f"{2.31 - half:.4f}–{2.31 + half:.4f}" and cell("gamma", "n_runs") == "3"
    assert cell("alpha", "val_loss") == "2.0050"
    assert cell("beta", "interval") == "" and cell("beta", "n_runs") == "1"  # one run: no interval, and n says why


def test_details_open_on_demand(page, browser):
    browser.get(page.as_uri())
    row = browser.find_element("css selector", "#leaderboard tbody tr[data-team='alpha']")
    panel = browser.find_element("css selector", "#leaderboard tbody tr[data-details-for='alpha'] .panel")
    assert not panel.is_displayed()
    row.find_element("css selector", "summary").click()
    assert panel.is_displayed()
    text = panel.text
    assert "run_id" in text and "submission_sha256" in text and "425,984" in text and "1,196,034" in text


def _box(browser, element) -> dict:
    return browser.execute_script("const r = arguments[0].getBoundingClientRect();"
                                  "return {top: r.top, bottom: r.bottom, left: r.left, right: r.right};", element)


@pytest.mark.parametrize("width", [1400, 800])
def test_a_teams_details_push_the_next_team_down_instead_of_covering_it(page, width):
    """The details used to be a box laid over the table: opening the winner's hid the teams under it. They open in
    a row of their own; every other team's row stays visible, below the panel, at either width."""
    driver = _driver(width)
    try:
        driver.get(page.as_uri())
        rows = driver.find_elements("css selector", "#leaderboard tbody tr[data-team]")
        for i, row in enumerate(rows[:-1]):
            row.find_element("css selector", "summary").click()
            team = row.get_attribute("data-team")
            # Wherever the page puts a team's panel (in its row before, in a row of its own now):
            panel = driver.find_element("css selector", f"tr[data-team='{team}'] .panel, "
                                                         f"tr[data-details-for='{team}'] .panel")
            assert panel.is_displayed()
            box, below = _box(driver, panel), _box(driver, rows[i + 1])
            assert box["bottom"] <= below["top"] + 0.5, (team, box, below)  # no overlap: the next row is under it
            assert box["top"] >= _box(driver, row)["bottom"] - 0.5
            row.find_element("css selector", "summary").click()  # closed again: the next team moves back up
            assert not panel.is_displayed()
            assert abs(_box(driver, rows[i + 1])["top"] - _box(driver, row)["bottom"]) < 2
    finally:
        driver.quit()


def test_each_team_has_its_chart_colour_beside_its_name(page, browser, tmp_path):
    """The table ties to the charts: each ranked team's name has its chart colour beside it, five different ones
    here; a team that did not finish has the grey the charts list it in."""
    from harness.results.charts.colors import NOT_FINISHED, team_colors
    from harness.results.leaderboard import load_rows

    colors = team_colors(load_rows(tmp_path / "runs", "local"))
    browser.get(page.as_uri())
    shown = {}
    for row in browser.find_elements("css selector", "#leaderboard tbody tr[data-team]"):
        swatch = row.find_element("css selector", "summary .swatch")
        rgb = browser.execute_script("return getComputedStyle(arguments[0]).backgroundColor", swatch)
        r, g, b = (int(c) for c in rgb[rgb.index("(") + 1:rgb.index(")")].split(",")[:3])
        shown[row.get_attribute("data-team")] = f"#{r:02x}{g:02x}{b:02x}"
    assert shown == {"alpha": colors("alpha"), "gamma": colors("gamma"), "kappa": colors("kappa"),
                     "beta": colors("beta"), "delta": NOT_FINISHED}
    assert len(set(shown.values())) == 5


@pytest.mark.parametrize("width", [1400, 800])
def test_the_page_fits_the_window_without_horizontal_scrolling(page, width):
    driver = _driver(width)
    try:
        driver.get(page.as_uri())
        scroll, client = driver.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        assert scroll <= client, f"at {width} px the page scrolls sideways ({scroll} > {client})"
        table = driver.find_element("css selector", "#leaderboard")
        assert table.size["width"] <= client
        headers = [h.text for h in driver.find_elements("css selector", "#leaderboard th") if h.is_displayed()]
        assert headers[:4] == ["#", "team", "val loss", "interval"]  # what a room ranks by, first
        if width == 1400:
            assert "tokens/s" in headers and "comm overlap" in headers
    finally:
        driver.quit()


@pytest.mark.parametrize("width", [1400, 800])
def test_no_chart_leaves_a_blank_beside_a_taller_one(page, width):
    """In a grid of rows, the short val-loss chart sat beside the tall throughput chart with a blank under it as tall
    as the difference. The charts stand in two columns, each under the shorter column: every chart is followed in
    its column by the next one, a gap apart. On a narrow screen, one column in the charts' own order."""
    driver = _driver(width)
    try:
        driver.get(page.as_uri())
        figures = driver.find_elements("css selector", ".charts figure")
        names = [f.find_element("css selector", "img").get_attribute("alt") for f in figures]
        assert sorted(names) == ["loss_vs_time", "loss_vs_tokens", "scaling", "throughput", "val_loss"]
        boxes = {name: _box(driver, f) for name, f in zip(names, figures)}
        gap = driver.execute_script("return parseFloat(getComputedStyle(document.querySelector('.charts')).rowGap)")
        for name, box in boxes.items():
            below = [b for b in boxes.values() if abs(b["left"] - box["left"]) < 2 and b["top"] > box["bottom"] - 1]
            if below:  # the next chart in its column starts a gap under it, not under a taller neighbour
                assert min(b["top"] for b in below) - box["bottom"] <= gap + 2, (name, box, below)
        if width == 1400:
            assert len({round(b["left"]) for b in boxes.values()}) == 2  # two columns
        else:
            order = sorted(boxes, key=lambda n: boxes[n]["top"])
            assert order == ["loss_vs_time", "loss_vs_tokens", "val_loss", "throughput", "scaling"]
    finally:
        driver.quit()


def test_the_page_states_the_measured_weak_scaling_not_the_prediction():
    """Under the scaling chart, in words: the measured efficiency per world size and the measurement's own notes;
    the model's predicted figures appear only on the chart, drawn as a prediction."""
    from harness.results.page import scaling_caption

    record = {"team": "alpha", "created_at": "2026-11-30T13:22:39Z", "device_name": "cpu",
              "points": [{"world_size": 1, "weak_scaling_efficiency": 1.0},
                         {"world_size": 2, "weak_scaling_efficiency": 0.8771}],
              "prediction": {"2": {"efficiency": 0.9971}, "32": {"efficiency": 0.9432}},
              "notes": ["the machine was busy"]}
    older = {**record, "created_at": "2026-11-29T00:00:00Z",
             "points": [{"world_size": 2, "weak_scaling_efficiency": 0.5}], "notes": []}
    text = scaling_caption([record, older])
    assert "0.877 at 2 devices" in text and "alpha" in text and "the machine was busy" in text
    assert "0.997" not in text and "0.943" not in text and "0.500" not in text  # no prediction, no stale record
    assert scaling_caption([]) == ""


def test_a_chart_file_cut_short_is_placed_as_a_square(tmp_path):
    from harness.results.page import png_aspect

    (tmp_path / "short.png").write_bytes(b"\x89PNG")
    assert png_aspect(tmp_path / "short.png") == 1.0 and png_aspect(tmp_path / "gone.png") == 1.0
