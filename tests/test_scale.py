"""`harness scale`: the communication fit (unit) and a real probe at world sizes 1 and 2 (CLI)."""

import json

import pytest

from conftest import FIXTURES, TINY_TRACK
from harness.launcher.scale import fit_comm, predict


def test_fit_recovers_the_model_and_predicts():
    a, b, t1 = 0.002, 0.010, 0.100
    points = [{"world_size": n, "overhead_s": (a + b * 2 * (n - 1) / n) if n > 1 else 0.0} for n in (1, 2, 4, 8)]
    fit = fit_comm(points)
    assert fit["a_s"] == pytest.approx(a, rel=1e-2) and fit["b_s"] == pytest.approx(b, rel=1e-2)
    assert [i["world_size"] for i in fit["inputs"]] == [2, 4, 8] and fit["note"] == ""
    pred = predict(fit, t1, [1, 2, 256])
    assert pred["1"] == 1.0
    assert pred["256"] == pytest.approx(t1 / (t1 + a + b * 2 * 255 / 256), rel=1e-3)


def test_fit_with_one_size_above_one_says_so():
    fit = fit_comm([{"world_size": 1, "overhead_s": 0.0}, {"world_size": 2, "overhead_s": 0.01}])
    assert fit["a_s"] == 0.0 and fit["b_s"] == pytest.approx(0.01) and "fitted b only" in fit["note"]
    assert fit_comm([{"world_size": 1, "overhead_s": 0.0}])["b_s"] is None


def test_scale_through_the_cli(cli, tmp_path):
    result = cli("scale", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK), "--world-sizes", "2",
                 "--steps", "20", "--warmup-steps", "2", "--probe-steps", "2")
    assert result.code == 0, result.err
    (path,) = (tmp_path / "runs" / "tiny" / "ok_bigram").glob("scale-*/scale.json")
    record = json.loads(path.read_text())
    assert [p["world_size"] for p in record["points"]] == [1, 2]  # 1 is added: efficiency is relative to it
    assert record["points"][0]["efficiency"] == 1.0 and record["points"][1]["tokens_per_s"] > 0
    assert {"2", "32", "64", "256"} <= set(record["prediction"]["efficiency"])
    assert "measured at world sizes [2]" in record["prediction"]["note"]
    assert (path.parent / "scale.png").stat().st_size > 0
    assert "predicted efficiency" in result.out
