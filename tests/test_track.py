import pytest

from harness.tracks.spec import (
    TrackError,
    apply_overrides,
    builtin_track_names,
    load_track,
    track_from_dict,
    track_from_record,
)


def test_builtin_tracks_load_with_event_values():
    assert {"local", "paris2026", "dev-gpu"} <= set(builtin_track_names())
    paris = load_track("paris2026")
    assert (paris.nnodes, paris.nproc_per_node, paris.backend, paris.device) == (4, 8, "nccl", "cuda")
    assert paris.budget_s == 600 and paris.data.vocab_size == 32000 and paris.data.format == "raw_uint16"
    local = load_track("local")
    assert (local.backend, local.device, local.nproc_per_node) == ("gloo", "cpu", 2)
    assert 10 <= local.budget_s <= 90 and local.data.source == "synthetic"
    assert load_track("dev-gpu").nproc_per_node == "auto"


def test_unknown_track_suggests_the_near_name():
    with pytest.raises(TrackError, match="Did you mean: local"):
        load_track("locl")


def _minimal() -> dict:
    return {"name": "t", "budget_s": 5.0, "data": {"source": "synthetic", "vocab_size": 64, "val_tokens": 128,
                                                    "synthetic": {}}, "eval": {"seq_len": 32, "batch_size": 2}}


def test_unknown_key_is_an_error_naming_file_and_key(tmp_path):
    raw = _minimal()
    raw["budjet_s"] = 3
    with pytest.raises(TrackError, match=r"my\.toml: unknown key `budjet_s`.*Did you mean `budget_s`"):
        track_from_dict(raw, "my.toml")


def test_organiser_track_file_is_loaded_by_path(tmp_path):
    path = tmp_path / "event.toml"
    path.write_text('name = "event"\nbudget_s = 12\nnproc_per_node = 3\n[data]\nsource = "synthetic"\n'
                    'vocab_size = 64\nval_tokens = 256\n[data.synthetic]\n[eval]\nseq_len = 32\nbatch_size = 4\n')
    track = load_track(str(path))
    assert track.name == "event" and track.nproc_per_node == 3 and track.source == str(path.resolve())


@pytest.mark.parametrize("change, message", [
    ({"backend": "nccl"}, "needs device 'cuda'"),
    ({"budget_s": 0}, "budget_s"),
    ({"clock_start": "whenever"}, "clock_start"),
    ({"nproc_per_node": "auto"}, "counts GPUs"),
    ({"job_pids_max": 10}, "job_pids_max.*>= 64"),
    ({"job_memory_gib": -1}, "job_memory_gib.*>= 0"),
])
def test_invalid_values_are_refused(change, message):
    raw = {**_minimal(), **change}
    with pytest.raises(TrackError, match=message):
        track_from_dict(raw, "t.toml")


def test_val_tokens_must_fill_whole_windows():
    raw = _minimal()
    raw["data"]["val_tokens"] = 100
    with pytest.raises(TrackError, match="multiple of eval.seq_len"):
        track_from_dict(raw, "t.toml")


def test_overrides_are_recorded_and_make_a_run_unofficial():
    local = load_track("local")
    same = apply_overrides(local, budget_s=local.budget_s, nproc_per_node=None)
    assert same.official and same.overrides == {}
    changed = apply_overrides(local, budget_s=5.0, nproc_per_node=3)
    assert not changed.official
    assert changed.overrides == {"budget_s": {"track": local.budget_s, "run": 5.0},
                                 "nproc_per_node": {"track": 2, "run": 3}}
    assert changed.track.budget_s == 5.0 and changed.track.nproc_per_node == 3


def test_resolved_track_round_trips_through_a_record():
    track = apply_overrides(load_track("paris2026"), budget_s=60.0).track
    assert track_from_record(track.to_dict()) == track


def test_the_ddp_table_defaults_to_what_the_harness_did_and_paris_states_it():
    """No [ddp] table: torch's buckets, no static graph, gradients as bucket views, no hook (the settings before
    the table existed); the table is part of the track saved in every record."""
    default = track_from_dict(_minimal(), "t.toml").ddp
    assert (default.bucket_cap_mb, default.static_graph, default.gradient_as_bucket_view, default.comm_hook) == \
        (None, False, True, "none")
    paris = load_track("paris2026")
    assert paris.ddp == default and "[ddp]" in open(paris.source).read()
    raw = {**_minimal(), "ddp": {"bucket_cap_mb": 4, "static_graph": True}}
    track = track_from_dict(raw, "t.toml")
    assert track.to_dict()["ddp"] == {"bucket_cap_mb": 4, "static_graph": True, "gradient_as_bucket_view": True,
                                      "comm_hook": "none"}
    assert track_from_record(track.to_dict()) == track


@pytest.mark.parametrize("ddp, message", [
    ({"bucket_cap_mb": 0}, r"my\.toml: .*\[ddp\]: `bucket_cap_mb` must be a number of MiB"),
    ({"bucket_cap_mb": "25"}, r"my\.toml: .*`bucket_cap_mb`"),
    ({"bucket_cap_mb": True}, r"my\.toml: .*`bucket_cap_mb`"),
    ({"static_graph": "yes"}, r"my\.toml: .*\[ddp\]: `static_graph` must be true or false"),
    ({"gradient_as_bucket_view": 1}, r"my\.toml: .*`gradient_as_bucket_view` must be true or false"),
    ({"comm_hook": "fp8"}, r"my\.toml: .*\[ddp\]: `comm_hook` must be one of 'none', 'bf16_compress'"),
    ({"bucket_cap": 25}, r"my\.toml: unknown key `bucket_cap` in \[ddp\]\. Did you mean `bucket_cap_mb`"),
    ({"comm_hook": "bf16_compress"}, r"my\.toml: .*`comm_hook = \"bf16_compress\"` needs backend 'nccl'.*gloo"),
])
def test_bad_ddp_values_name_the_file_and_the_key(ddp, message):
    with pytest.raises(TrackError, match=message):
        track_from_dict({**_minimal(), "ddp": ddp}, "my.toml")


def test_bf16_compression_is_accepted_on_an_nccl_track():
    raw = {**_minimal(), "backend": "nccl", "device": "cuda", "ddp": {"comm_hook": "bf16_compress"}}
    assert track_from_dict(raw, "t.toml").ddp.comm_hook == "bf16_compress"
