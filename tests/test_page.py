"""The leaderboard page in a real headless browser (Debian's Chromium, through Selenium)."""

import csv
import shutil

import pytest

from records_factory import make_run


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver_path, "Chromium and ChromeDriver are needed (scripts/test installs them)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1600,1200"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def test_page_loads_with_rows_in_order_and_images_that_resolve(tmp_path, cli, browser):
    runs = tmp_path / "runs"
    for seed, v in enumerate((2.30, 2.32, 2.31), 1):
        make_run(runs, "gamma", v, seed=seed)
    for seed, v in enumerate((2.00, 2.01), 1):
        make_run(runs, "alpha", v, seed=seed)
    make_run(runs, "beta", 2.6)
    make_run(runs, "delta", None, status="crashed", reason="rank 1: deliberate")
    result = cli("leaderboard", "--runs-dir", str(runs), "--out", str(tmp_path / "leaderboard"),
                 "--plots-dir", str(tmp_path / "plots"))
    assert result.code == 0, result.err
    with open(tmp_path / "leaderboard" / "local.csv") as fh:
        expected = [row["team"] for row in csv.DictReader(fh)]
    assert expected == ["alpha", "gamma", "beta", "delta"]

    browser.get((tmp_path / "leaderboard" / "local.html").as_uri())
    assert browser.title == "Leaderboard: local"
    rows = browser.find_elements("css selector", "#leaderboard tbody tr")
    assert [r.get_attribute("data-team") for r in rows] == expected
    assert rows[0].find_element("css selector", "td.rank").text == "1"
    assert rows[3].find_element("css selector", "td.status").text == "crashed"
    images = browser.find_elements("css selector", ".charts img")
    assert len(images) == 5
    for img in images:
        loaded = browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", img)
        assert loaded, f"chart {img.get_attribute('src')} did not load"
