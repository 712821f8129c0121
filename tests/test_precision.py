"""Precision on CPU tracks: bf16 autocast only where the CPU computes bf16 natively."""

import pytest

from harness.tracks import precision
from harness.tracks.spec import load_track


def test_flags_are_read_from_cpuinfo_lines():
    text = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\nprocessor\t: 1\nflags\t: fpu amx_bf16\n"
    assert {"avx2", "avx512_bf16", "amx_bf16"} <= precision._cpuinfo_flags(text)
    assert "bf16" in precision._cpuinfo_flags("Features\t: fp asimd bf16 i8mm\n")  # arm64


@pytest.mark.parametrize("evidence, expected", [("avx512_bf16", "bfloat16"), ("", "float32")])
def test_auto_follows_the_cpu(monkeypatch, evidence, expected):
    monkeypatch.setattr(precision, "cpu_bf16_evidence", lambda: evidence)
    chosen, why = precision.resolve_precision("auto", "cpu")
    assert chosen == expected and why.startswith("auto: ")
    assert (evidence in why) if evidence else ("no native bf16" in why)


def test_gpus_and_explicit_settings_are_kept(monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_evidence", lambda: "")
    assert precision.resolve_precision("auto", "cuda")[0] == "bfloat16"
    assert precision.resolve_precision("bfloat16", "cpu")[0] == "bfloat16"
    assert precision.resolve_precision("float32", "cuda")[0] == "float32"
    with pytest.raises(ValueError):
        precision.resolve_precision("fp8", "cpu")


def test_the_cpu_track_is_auto_and_the_gpu_tracks_bf16():
    assert load_track("local").dtype == "auto"
    assert load_track("paris2026").dtype == "bfloat16" and load_track("dev-gpu").dtype == "bfloat16"
