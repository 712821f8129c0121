"""`harness scale`: a real measurement at world sizes 1 and 2 through the CLI, and the record it leaves."""

import json

from conftest import FIXTURES, TINY_TRACK


def test_scale_through_the_cli(cli, tmp_path):
    result = cli("scale", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK), "--world-sizes", "2",
                 "--steps", "20", "--warmup-steps", "2", "--probe-steps", "2")
    assert result.code == 0, result.err
    (path,) = (tmp_path / "runs" / "tiny" / "ok_bigram").glob("scale-*/scale.json")
    record = json.loads(path.read_text())
    points = record["points"]
    assert [p["world_size"] for p in points] == [1, 2]  # 1 is added: efficiency is relative to it
    assert points[0]["weak_scaling_efficiency"] == 1.0 and points[1]["tokens_per_s"] > 0
    assert "probe_comm_overlap_efficiency" in points[1]  # the run probe's quantity, kept apart and named apart
    model = record["model"]
    assert model["grad_bytes"] == 4 * record["params"] == 4 * 256 * 256  # the bigram table at vocabulary 256
    assert any("measured at 1 device" in a for a in model["assumptions"])
    assert "one node cannot measure it" in model["inter_node_from"]
    pred = record["prediction"]
    assert {"1", "2", "32", "64", "256"} <= set(pred) and pred["1"]["efficiency"] == 1.0
    assert pred["256"]["nodes"] == 128 and pred["256"]["devices_per_node"] == 2  # the track's nodes of 2 ranks
    assert all(0 < p["efficiency"] <= 1 for p in pred.values())
    assert (path.parent / "scale.png").stat().st_size > 0
    assert "PREDICTION (a model, not a measurement)" in result.out and "weak-scaling eff." in result.out
    # The track's charts are refreshed: its scaling chart now shows this measurement.
    assert (tmp_path / "plots" / "tiny" / "scaling.png").is_file()
