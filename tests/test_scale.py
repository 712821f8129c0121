"""`harness scale`: a real measurement at world sizes 1 and 2 through the CLI, and the record it leaves."""

import json

import pytest

from conftest import FIXTURES, TINY_TRACK


def test_scale_through_the_cli(cli, tmp_path):
    result = cli("scale", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK), "--world-sizes", "2",
                 "--steps", "20", "--warmup-steps", "2", "--probe-steps", "2")
    assert result.code == 0, result.err
    (path,) = (tmp_path / "runs" / "tiny" / "ok_bigram").glob("scale-*/scale.json")
    record = json.loads(path.read_text())
    points = record["points"]
    assert [p["world_size"] for p in points] == [1, 2]  # 1 is added: efficiency is relative to it
    one, two = points
    assert one["tokens_per_s"] > 0 and two["tokens_per_s"] > 0
    # Weak-scaling efficiency is the measured throughput at 2 against twice the throughput at 1, from the
    # record's own figures, with the same work per device at both sizes.
    assert two["weak_scaling_efficiency"] == pytest.approx(two["tokens_per_s"] / (2 * one["tokens_per_s"]), rel=1e-9)
    assert two["tokens_per_step"] == 2 * one["tokens_per_step"]
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


def _points(probe_at_2: float) -> list[dict]:
    return [{"world_size": 1, "step_s": 0.2, "overhead_s": 0.0, "probe_compute_step_s": 0.2, "device_name": "cpu",
             "probe_comm_overlap_efficiency": 1.0},
            {"world_size": 2, "step_s": 0.5, "overhead_s": 0.3, "probe_compute_step_s": 0.25, "device_name": "cpu",
             "probe_comm_overlap_efficiency": probe_at_2}]


def test_the_link_is_fitted_to_overheads_the_probe_blames_on_communication():
    from harness.launcher.scale import build_model
    from harness.tracks.spec import load_track

    model = build_model(load_track("local"), 2, _points(0.55), params=425984)
    summary = model.pop("summary")
    assert summary["intra_node_from"] == "fitted to the overheads measured on cpu"
    assert model["links"].intra_bytes_per_s < 0.1e9  # 1.7 MB taking ~0.3 s of exposed time
    assert model["grad_bytes"] == 4 * 425984 and model["step_s"] == 0.2
    assert model["backward_s"] == 2 / 3 * 0.2  # from the probe's forward + backward at one device


def test_overheads_the_probe_finds_hidden_are_not_blamed_on_the_link():
    """A slower step with two ranks on a busy machine is not a slow link: the probe (synchronised against
    compute-only steps) tells the two apart."""
    from harness.launcher.scale import build_model
    from harness.tracks.spec import load_track

    track = load_track("local")
    summary = build_model(track, 2, _points(1.02), params=425984).pop("summary")
    assert summary["intra_node_from"] == "the track's [interconnect]"
    assert summary["links"] == summary["track_links"]
    assert summary["fit"]["note"].startswith("not used: the communication probe found no exposed all-reduce (1.020 at 2)")


def test_measurements_the_probe_or_arithmetic_contradicts_are_flagged():
    from harness.launcher.scale import measurement_notes

    def point(n, eff, probe):
        return {"world_size": n, "weak_scaling_efficiency": eff, "probe_comm_overlap_efficiency": probe}

    assert measurement_notes([point(1, 1.0, 1.0), point(2, 0.95, 0.9)]) == []
    (above,) = measurement_notes([point(1, 1.0, 1.0), point(2, 1.13, 0.93)])
    assert above.startswith("1.130 at 2 is above 1: the one-device measurement ran slower")
    (contention,) = measurement_notes([point(1, 1.0, 1.0), point(2, 0.42, 1.026)])
    assert "probe found no exposed all-reduce (1.026)" in contention and "fell to 0.420" in contention
