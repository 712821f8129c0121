"""MFU: computed one way, and never a share of the device's peak that no device reaches."""

import math

import pytest

from harness.results.metrics import implausible_mfu_note, mfu, peak_flops_per_device, raw_mfu


def test_mfu_is_flops_times_throughput_over_the_peak_and_none_where_a_factor_is_unknown():
    assert mfu(6e8, 1e5, 1e15) == pytest.approx(0.06)
    assert mfu(None, 1e5, 1e15) is None and mfu(6e8, None, 1e15) is None and mfu(6e8, 1e5, None) is None
    assert implausible_mfu_note(6e8, 1e5, 1e15) is None and implausible_mfu_note(6e8, 1e5, None) is None


@pytest.mark.parametrize("flops_per_token", [8.59e9, 1.7976931348623157e308])
def test_an_mfu_past_the_peak_or_not_finite_is_not_shown_and_the_record_says_why(flops_per_token):
    """FLOPs per token come from the check process, beside the team's code: a count inflated on the meta device
    made 1,032% (tests/fixtures/inflates_flops), a forged report.json inf, which is not even JSON."""
    raw = raw_mfu(flops_per_token, 1.2e3, 1e12)
    assert raw > 1.0 or not math.isfinite(raw)
    assert mfu(flops_per_token, 1.2e3, 1e12) is None
    note = implausible_mfu_note(flops_per_token, 1.2e3, 1e12)
    assert note.startswith("MFU not shown: the FLOPs per token counted in the check process")
    assert "which no device reaches" in note


def test_the_peak_is_the_tracks_figure_else_its_named_device_else_none():
    assert peak_flops_per_device(2e15, "", None) == 2e15
    assert peak_flops_per_device(0.0, "", "NVIDIA H100 80GB HBM3") is None
    with pytest.raises(ValueError, match="unknown device_peak"):
        peak_flops_per_device(0.0, "no-such-gpu", None)


@pytest.mark.slow
def test_a_flop_count_inflated_on_the_meta_device_shows_no_mfu_on_the_board(cli, tmp_path):
    """inflates_flops counts a free matmul on the meta device only: its run trains and scores as the bigram it is,
    and its MFU, 1,032% of a 1 TFLOP/s peak as counted, is not shown; the record's note says why."""
    import csv

    from conftest import FIXTURES, only_record, quick_track

    track = quick_track(tmp_path)
    track.write_text(track.read_text().replace("ranking = ", "peak_flops_per_device = 1.0e12\nranking = ", 1))
    result = cli("run", str(FIXTURES / "inflates_flops"), "--track", str(track))
    assert result.code == 0, result.err
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok" and record["peak_flops_per_device"] == 1.0e12
    assert record["flops_per_token"] > 1e9 and record["mfu"] is None
    assert any(n.startswith("MFU not shown") for n in record["notes"]), record["notes"]
    assert cli("leaderboard", "--no-charts").code == 0
    (row,) = list(csv.DictReader((tmp_path / "leaderboard" / "tiny.csv").open()))
    assert row["team"] == "inflates_flops" and row["rank"] == "1" and row["mfu"] == ""
