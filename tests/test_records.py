import json

import pytest

from harness.results.records import RunRecord, find_run, load_record, save_metrics, save_record, write_atomic


def test_record_round_trips_and_keeps_unknown_fields(tmp_path):
    rec = RunRecord(run_id="r1", team="t", track_name="local", status="ok", val_loss=2.5)
    rec.extra["future_metric"] = 0.4
    save_record(tmp_path, rec)
    raw = json.loads((tmp_path / "run.json").read_text())
    assert raw["future_metric"] == 0.4 and raw["val_loss"] == 2.5 and "extra" not in raw
    back = load_record(tmp_path)
    assert back.val_loss == 2.5 and back.extra == {"future_metric": 0.4}


def test_bad_status_is_refused():
    with pytest.raises(ValueError, match="status must be one of"):
        RunRecord(run_id="r", team="t", track_name="x", status="great")


def test_atomic_write_leaves_old_content_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    write_atomic(path, "old")

    def boom(*_):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", boom)
    with pytest.raises(OSError):
        write_atomic(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_metrics_csv_has_the_documented_columns(tmp_path):
    save_metrics(tmp_path, [{"step": 1, "train_time_s": 0.5, "train_loss": 3.0, "lr_scale": 1.0, "tokens": 64,
                             "tokens_per_s": 128.0, "rank": 0}])
    lines = (tmp_path / "metrics.csv").read_text().splitlines()
    assert lines[0] == "step,train_time_s,train_loss,lr_scale,tokens,tokens_per_s,grad_norm" and lines[1].startswith("1,0.5,3.0")


def test_find_run_by_id_prefix_or_path(tmp_path):
    for rid in ("20260101T000000-aaaaaa", "20260101T000000-bbbbbb"):
        save_record(tmp_path / "local" / "t" / rid, RunRecord(run_id=rid, team="t", track_name="local"))
    assert find_run(tmp_path, "20260101T000000-aa").name.endswith("aaaaaa")
    with pytest.raises(FileNotFoundError, match="matches 2 runs"):
        find_run(tmp_path, "20260101T")
    with pytest.raises(FileNotFoundError, match="no run"):
        find_run(tmp_path, "zzz")


def test_outputs_follow_the_users_umask(tmp_path):
    """mkstemp makes files only their owner can read; a leaderboard or a record is an ordinary output."""
    import os
    import stat

    from harness.results.charts.kit import save_png, subplots

    for mask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        old = os.umask(mask)
        try:
            write_atomic(tmp_path / f"t{mask}.md", "x")
            save_png(subplots(figsize=(2, 2))[0], tmp_path / f"t{mask}.png")
        finally:
            os.umask(old)
        for suffix in (".md", ".png"):
            assert stat.S_IMODE((tmp_path / f"t{mask}{suffix}").stat().st_mode) == mode, (mask, suffix)


def test_the_record_guard_neither_blocks_on_nor_trusts_what_a_team_planted_in_the_runs_tree(tmp_path):
    """Without the sandbox a team can write the runs tree: a FIFO named run.json would hang a reader (the
    guard reads records on the watchdog's tick, which holds the clock), a JSON list crashed `.get`. The
    guard and the name check skip both and keep protecting the honest record beside them."""
    import os
    import threading

    from harness.launcher.control.guard import RecordGuard
    from harness.launcher.run.identity import name_owner

    runs, board = tmp_path / "runs", tmp_path / "board"
    honest = runs / "local" / "a" / "r1"
    save_record(honest, RunRecord(run_id="r1", team="a", track_name="local", status="ok", val_loss=2.5))
    (runs / "local" / "b" / "r2").mkdir(parents=True)
    os.mkfifo(runs / "local" / "b" / "r2" / "run.json")
    (runs / "local" / "c" / "r3").mkdir(parents=True)
    (runs / "local" / "c" / "r3" / "run.json").write_text("[1, 2]")
    board.mkdir()
    os.mkfifo(board / "local.csv")
    own = runs / "local" / "me" / "r4"
    own.mkdir(parents=True)
    done: dict = {}

    def guard_a_run() -> None:
        with RecordGuard(runs, "local", own, board) as guard:
            (honest / "run.json").write_text("{}")  # the team changes a finished record
            guard.refresh(every_s=0.0)
            done["report"] = guard.check_and_restore()
        done["clash"] = name_owner(runs, "b")

    worker = threading.Thread(target=guard_a_run, daemon=True)
    worker.start()
    worker.join(timeout=30.0)
    assert not worker.is_alive(), "the guard blocked on a FIFO in the runs tree"
    assert done["report"].restored == [str((honest / "run.json").resolve())]
    assert load_record(honest).val_loss == 2.5 and done["clash"] is None


def test_the_schema_declares_each_field_once_and_the_views_read_only_its_fields():
    """A field declared twice in RunRecord silently keeps one comment and one default of the two (`warnings` was);
    the leaderboard's field lists are read from the schema, so a field the views read must be declared there."""
    import ast
    import dataclasses
    from pathlib import Path

    from harness.results import leaderboard, records

    tree = ast.parse(Path(records.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunRecord")
    names = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]
    assert sorted({n for n in names if names.count(n) > 1}) == []
    assert names == [f.name for f in dataclasses.fields(RunRecord)]
    kinds = records.field_kinds()
    assert [k for k in (*leaderboard.FIELDS, "track") if k not in kinds] == []
    assert {"val_loss", "params"} <= set(leaderboard.NUMBER_FIELDS) and "official" in leaderboard.FLAG_FIELDS
    assert {"team", "reason"} <= set(leaderboard.TEXT_FIELDS) and "track" in leaderboard.OBJECT_FIELDS


@pytest.mark.parametrize("old", [
    {"schema_version": 1, "scaling_efficiency": 0.9, "scaling": {"comm_s": 0.01}},
    {"schema_version": 2, "comm_overlap_efficiency": 0.9, "comm_probe": {"comm_s": 0.01}},
])
def test_an_upgraded_old_record_says_the_schema_it_now_follows(tmp_path, old):
    """Read, an old record is the current schema's, and says so; saved again (harness flag, harness finalize), the
    file says so too. A record of a schema newer than this harness is left saying its own."""
    from harness.results.records import SCHEMA_VERSION, upgrade_record

    raw = {**RunRecord(run_id="r1", team="t", track_name="local", status="ok").to_dict(), **old}
    for key in ("comm_overlap_efficiency", "comm_probe", "launcher_pid"):
        if key not in old:
            raw.pop(key, None)
    (tmp_path / "run.json").write_text(json.dumps(raw))
    record = load_record(tmp_path)
    assert record.schema_version == SCHEMA_VERSION == 3
    assert record.comm_overlap_efficiency == 0.9 and record.comm_probe == {"comm_s": 0.01}
    assert record.launcher_pid is None and "scaling_efficiency" not in record.extra
    save_record(tmp_path, record)
    assert json.loads((tmp_path / "run.json").read_text())["schema_version"] == SCHEMA_VERSION
    assert upgrade_record({"schema_version": SCHEMA_VERSION + 1})["schema_version"] == SCHEMA_VERSION + 1


def test_a_file_system_without_locks_runs_unlocked_and_says_so(tmp_path, monkeypatch):
    """Lustre without `-o flock` and NFS mounted `nolock` answer flock with ENOLCK (issue 23, item 7): every
    run crashed at training start. The records' lock and the leaderboard's are then held by nobody, and the
    track lock says why (the run's record warns); a lock that is really held still waits."""
    import errno

    from harness.results import locks

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", no_locks)
    with locks.TrackLock(tmp_path / "runs" / "local", exclusive=False) as lock:
        assert "the file system has no locks (No locks available)" in lock.unavailable
    with locks.leaderboard_lock(tmp_path / "leaderboard"):
        pass
    monkeypatch.undo()
    held = locks.TrackLock(tmp_path / "runs" / "local", exclusive=True).__enter__()
    try:
        with pytest.raises(TimeoutError):
            locks.TrackLock(tmp_path / "runs" / "local", exclusive=True, timeout_s=0.3).__enter__()
    finally:
        held.__exit__(None, None, None)
