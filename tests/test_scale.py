"""`harness scale`: a real measurement at world sizes 1 and 2 through the CLI, and the record it leaves."""

import json

import pytest

from conftest import FIXTURES, TINY_TRACK


@pytest.mark.slow
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
    from harness.launcher.scaling.scale import build_model
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
    from harness.launcher.scaling.scale import build_model
    from harness.tracks.spec import load_track

    track = load_track("local")
    summary = build_model(track, 2, _points(1.02), params=425984).pop("summary")
    assert summary["intra_node_from"] == "the track's [interconnect]"
    assert summary["links"] == summary["track_links"]
    assert summary["fit"]["note"].startswith("not used: the communication probe found no exposed all-reduce (1.020 at 2)")


def test_measurements_the_probe_or_arithmetic_contradicts_are_flagged():
    from harness.launcher.scaling.scale import measurement_notes

    def point(n, eff, probe):
        return {"world_size": n, "weak_scaling_efficiency": eff, "probe_comm_overlap_efficiency": probe}

    assert measurement_notes([point(1, 1.0, 1.0), point(2, 0.95, 0.9)]) == []
    (above,) = measurement_notes([point(1, 1.0, 1.0), point(2, 1.13, 0.93)])
    assert above.startswith("1.130 at 2 is above 1: the one-device measurement ran slower")
    (contention,) = measurement_notes([point(1, 1.0, 1.0), point(2, 0.42, 1.026)])
    assert "probe found no exposed all-reduce (1.026)" in contention and "fell to 0.420" in contention


def test_a_fit_the_measurement_cannot_support_is_refused_and_the_record_and_report_say_why(tmp_path):
    """On a busy CPU the steps at 1 and 2 ranks spread by more than the step grew: the prediction keeps the
    track's intra-node figures, `model.fit.refused` says why, and so does the printed report."""
    from harness.launcher.scaling.scale import build_model, scale_lines
    from harness.tracks.spec import load_track

    points = _points(0.55)
    for p in points:
        p["step_s_spread"] = 0.25
    model = build_model(load_track("local"), 2, points, params=425984)
    summary = model.pop("summary")
    assert summary["intra_node_from"] == "the track's [interconnect]"
    assert summary["links"] == summary["track_links"] and model["links"].describe() == summary["track_links"]
    assert summary["fit"]["refused"].startswith("the step-time overheads (300.00 ms at 2 (noise ±707.11 ms)) are "
                                                "within 2 standard deviations of the step times")
    record = {"device_name": "cpu", "notes": [], "model": summary, "prediction": {},
              "points": [{**p, "tokens_per_s": 1000.0, "weak_scaling_efficiency": 1.0} for p in points]}
    lines = scale_lines(record, tmp_path)
    assert f"  - fit refused: {summary['fit']['refused']}; the prediction uses the track's intra-node figures" in lines


def test_the_step_times_are_the_gaps_between_rank_0s_reports_after_warm_up():
    from harness.launcher.control.channel import Message
    from harness.launcher.scaling.scale import timed_step_times

    def progress(rank: int, step: int, t: float) -> Message:
        return Message("progress", {"rank": rank, "step": step, "train_time_s": t}, 0.0)

    times = [0.0, 0.5, 0.6, 0.7, 0.9, 1.0, 1.3]  # agreement before steps 0..6: steps 0-1 warm up
    messages = [progress(0, s, t) for s, t in enumerate(times) if s != 5]  # step 5's report never arrived
    messages += [progress(1, 3, 99.0), Message("result", {"rank": 0, "step": 4, "train_time_s": 0.0}, 0.0)]
    assert timed_step_times(messages[::-1], warmup_steps=2) == [pytest.approx(0.1), pytest.approx(0.2)]
