"""A board's rebuild at event size: the row index (harness/results/row_index.py) parses only the records it has not
seen, and is trusted no more than the records; the records are parsed and the charts drawn in two processes where a
fork is safe (harness/results/forked.py, charts/parallel.py), with the same rows, files and errors as one process
gives; orjson reads a record as the stdlib does (harness/results/records.py)."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.results import leaderboard
from harness.results.charts import parallel
from harness.results.leaderboard import build_table, load_rows
from harness.results.row_index import index_path
from harness.results.views import rebuild
from records_factory import make_run


def _parsed(monkeypatch) -> list[str]:
    """The record files load_rows parses from here on."""
    seen: list[str] = []
    real = leaderboard.read_record_fields

    def counting(path, *a, **k):
        seen.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(leaderboard, "read_record_fields", counting)
    return seen


def _plain(rows):
    return sorted((json.dumps(r, sort_keys=True, default=str) for r in rows))


def test_a_rebuild_parses_only_the_records_the_index_has_not_seen(tmp_path, monkeypatch):
    runs, index = tmp_path / "runs", index_path(tmp_path / "lb", "local")
    for seed in range(6):
        make_run(runs, f"team{seed % 3}", 2.0 + seed / 10, seed=seed)
    cold = load_rows(runs, "local", index)
    assert index.is_file()
    seen = _parsed(monkeypatch)
    assert _plain(load_rows(runs, "local", index)) == _plain(cold) and seen == []
    new = make_run(runs, "team9", 1.5, seed=9)
    rows = load_rows(runs, "local", index)
    assert seen == [str(new / "run.json")], "only the new record is parsed"
    assert _plain(rows) == _plain(load_rows(runs, "local")), "the same rows as a rebuild without an index"
    assert list(build_table(rows)["team"])[0] == "team9"


def test_a_record_rewritten_in_place_is_read_again(tmp_path, monkeypatch):
    """A finished run's record is rewritten by `harness finalize` or a re-evaluation (a rename onto a new inode);
    an edit in place keeps the inode but moves the change time. Either is parsed again."""
    runs, index = tmp_path / "runs", index_path(tmp_path / "lb", "local")
    run = make_run(runs, "alpha", 2.5)
    load_rows(runs, "local", index)
    make_run(runs, "alpha", 2.1, run_id=run.name)  # atomic rewrite: a new file
    assert [r["val_loss"] for r in load_rows(runs, "local", index)] == [2.1]
    path = run / "run.json"
    record = json.loads(path.read_text())
    record["val_loss"] = 1.9
    with open(path, "r+") as fh:  # the same inode, the same length, the old modification time put back
        text = json.dumps(record, indent=2) + "\n"
        fh.seek(0)
        fh.write(text)
        fh.truncate()
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns - 10**9))
    assert [r["val_loss"] for r in load_rows(runs, "local", index)] == [1.9]


def test_an_index_is_trusted_no_more_than_the_records(tmp_path, monkeypatch):
    """A row in the index of the wrong type, an index of another runs folder or of another harness's rows, or one
    that is not JSON: each is ignored for the records themselves, and the board is built as without it."""
    runs, index = tmp_path / "runs", index_path(tmp_path / "lb", "local")
    make_run(runs, "alpha", 2.0)
    make_run(runs, "bravo", 2.2)
    truth = _plain(load_rows(runs, "local"))
    load_rows(runs, "local", index)
    data = json.loads(index.read_text())
    for entry in data["rows"].values():
        entry[1]["val_loss"] = "0.1"  # a string where a number must be
        entry[1]["team"] = ["x"]
    index.write_text(json.dumps(data))
    assert _plain(load_rows(runs, "local", index)) == truth
    for change in ({"root": "/elsewhere"}, {"fields": "another harness"}):
        index.write_text(json.dumps({**json.loads(index.read_text()), **change}))
        seen = _parsed(monkeypatch)
        assert _plain(load_rows(runs, "local", index)) == truth and len(seen) == 2
        monkeypatch.undo()
    index.write_bytes(b"\x00not json")
    assert _plain(load_rows(runs, "local", index)) == truth
    index.write_text("[" * 200_000)  # nested past the parser's depth
    assert _plain(load_rows(runs, "local", index)) == truth
    index.unlink()
    index.mkdir()  # not even a file: the board is built, without an index
    assert _plain(load_rows(runs, "local", index)) == truth


def test_a_runs_folder_moved_elsewhere_is_read_where_it_is_now(tmp_path):
    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0)
    board = tmp_path / "lb"
    rebuild(runs, "local", board, tmp_path / "plots", charts=False)
    moved = tmp_path / "moved"
    runs.rename(moved)
    rows = load_rows(moved, "local", index_path(board, "local"))
    assert [Path(r["run_dir"]).parent.parent for r in rows] == [moved / "local"]


def test_the_charts_are_shared_between_two_processes_by_their_cost():
    assert parallel.split([0.5, 0.5, 0.6, 0.3, 0.1]) == ([2, 3, 4], [0, 1])
    assert parallel.split([1.0]) == ([0], [])


DRAW = r"""
import os, sys
from pathlib import Path
from matplotlib.figure import Figure
from harness.results.charts import parallel

out, parent = Path(sys.argv[1]), os.getpid()

def figure(name, fail_in_copy=False, fail=False):
    def make():
        (out / f"{name}.pid").write_text(str(os.getpid()))
        if fail or (fail_in_copy and os.getpid() != parent):
            raise RuntimeError(f"chart {name} cannot be drawn")
        fig = Figure(figsize=(2, 1))
        fig.subplots().plot([0, 1], [1, 0])
        return fig
    return make

mode = sys.argv[2]
jobs = [parallel.ChartJob(out / f"{n}.png", figure(n, fail_in_copy=(mode == "copy fails" and n == "b"),
                                                  fail=(mode == "fails" and n == "b")), cost=c)
        for n, c in (("a", 1.0), ("b", 1.0), ("c", 0.5))]
print(parallel.may_fork())
try:
    paths = parallel.draw_all(jobs, fork=True)
except RuntimeError as exc:
    print("raised:", exc)
else:
    print(" ".join(p.name for p in paths if p.stat().st_size > 0))
"""


@pytest.mark.parametrize("mode", ["draws", "copy fails", "fails"])
def test_the_copy_draws_its_share_and_a_chart_it_cannot_draw_is_drawn_here(tmp_path, mode):
    """A fork draws half of the charts; a chart the copy fails to draw is drawn by the process itself (the board is
    the same), and a chart nobody can draw raises its own error where the board is built."""
    proc = subprocess.run([sys.executable, "-c", DRAW, str(tmp_path), mode], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    may_fork, result = proc.stdout.splitlines()
    assert may_fork == str(len(os.sched_getaffinity(0)) >= 2)  # one thread: a fork is safe where there is a core
    pids = {n: (tmp_path / f"{n}.pid").read_text() for n in "abc"}
    if mode == "fails":
        assert result == "raised: chart b cannot be drawn"
        return
    assert result == "a.png b.png c.png"
    if mode == "draws":
        assert pids["a"] == pids["c"] != pids["b"], "two processes drew, each its share"
    else:
        assert pids["b"] == pids["a"], "the chart the copy failed is drawn again by the process that shared them"


def test_no_fork_while_another_thread_runs():
    """A lock held by another thread at a fork stays held in the copy: a launcher's or a watcher's board is drawn
    in one process."""
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert parallel.may_fork() is False
    finally:
        stop.set()
        worker.join()


def test_an_index_changed_while_a_run_trains_is_removed_and_the_board_rebuilt_from_the_records(tmp_path):
    """Rows of the right types cannot be told from true ones: an index that team code without the sandbox rewrote
    (another team's loss made 9.0, its identity kept) is not kept past the run's guard."""
    from harness.launcher.control.guard import RecordGuard

    runs, board = tmp_path / "runs", tmp_path / "lb"
    for seed, v in enumerate((2.00, 2.01), 1):
        make_run(runs, "alpha", v, seed=seed)
    mine = make_run(runs, "mallory", 2.5, status="running")
    rebuild(runs, "local", board, tmp_path / "plots", charts=False)
    index = index_path(board, "local")
    with RecordGuard(runs, "local", mine, board) as guard:
        data = json.loads(index.read_text())
        for entry in data["rows"].values():
            if entry[1]["team"] == "alpha":
                entry[1]["val_loss"] = 9.0
        index.write_text(json.dumps(data))
        report = guard.check_and_restore()
    assert str(index) in report.leaderboard_changed and not index.exists()
    assert sorted(r["val_loss"] for r in load_rows(runs, "local", index) if r["team"] == "alpha") == [2.00, 2.01]


HALVES = r"""
import ctypes, json, os, sys
from harness.results import forked

mode, parent = sys.argv[1], os.getpid()

libc = ctypes.CDLL(None)
during = set()

def square(x):
    if os.getpid() == parent and x < 5:  # this process's own half, while its copy does the other
        during.add(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE
    if mode == "fails" and x == 7 or mode == "copy fails" and x == 7 and os.getpid() != parent:
        raise RuntimeError(f"item {x} cannot be done")
    if mode == "this fails" and x == 2:
        raise RuntimeError(f"item {x} cannot be done")
    if mode == "this fails" and os.getpid() != parent:
        import time
        time.sleep(60)  # a slow copy: this process's error must not wait for it
    return [x * x, os.getpid() == parent, {"nan": float("nan"), "big": 2**70, "text": "\ud800"}]

try:
    out = forked.map_in_two(list(range(10)), square, min_items=2, fork=True, meanwhile=lambda: print("meanwhile"))
except RuntimeError as exc:
    print("raised:", exc)
    memfds = [f for f in os.listdir("/proc/self/fd") if "harness-half" in os.path.realpath(f"/proc/self/fd/{f}")]
    try:
        left = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        left = "none"
    print("memfds:", len(memfds), "children:", left)
else:
    print(json.dumps([[x, here] for x, here, _ in out]))
    print(all(json.dumps(extra) == json.dumps(square(5)[2]) for _, _, extra in out))
    print("dumpable while shared:", sorted(during), "after:", libc.prctl(3, 0, 0, 0, 0))
"""


@pytest.mark.parametrize("mode", ["computes", "copy fails", "fails", "this fails"])
def test_a_fork_does_half_of_a_job_and_what_it_cannot_do_is_done_here(mode):
    """map_in_two gives what one process gives: the items in order, the copy's values unchanged by their way back
    (NaN, an integer past 64 bits, a lone surrogate); a share the copy fails is done again by this process, and an
    item nobody can do raises its own error here; an error in this process's own share is raised at once (the copy,
    however slow, is ended), and leaves neither the copy nor its anonymous file behind."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", HALVES, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "meanwhile"  # once, in this process
    if mode in ("fails", "this fails"):
        assert lines[1:] == [f"raised: item {7 if mode == 'fails' else 2} cannot be done", "memfds: 0 children: none"]
        if mode == "this fails":
            assert time.monotonic() - t0 < 50, "this process's error waited for its copy"
        return
    out = json.loads(lines[1])
    assert [x for x, _ in out] == [k * k for k in range(10)] and lines[2] == "True"
    # while a copy works, no process of this user may open the file its results come back in
    assert lines[3] == "dumpable while shared: [0] after: 1"
    here = [h for _, h in out]
    assert here[:5] == [True] * 5, "this process does the first half"
    assert here[5:] == ([False] * 5 if mode == "computes" else [True] * 5), "the copy's half, or this process's again"


PARSE = r"""
import json, os, sys
from functools import partial
from pathlib import Path
from harness.results import forked, leaderboard, records

runs, log = Path(sys.argv[1]), Path(sys.argv[2])
real, fast = leaderboard.parse_row, leaderboard.read_record_fields

def parse(path):
    with open(log / str(os.getpid()), "a") as fh:
        fh.write(path + "\n")
    return real(path)

leaderboard.parse_row = parse
leaderboard.read_record_fields = lambda path, keys: records.read_record_json(Path(path))  # the stdlib alone
one = leaderboard.load_rows(runs, "local")
leaderboard.read_record_fields = fast
forked.map_in_two = partial(forked.map_in_two, min_items=2, fork=True)
two = leaderboard.load_rows(runs, "local")
print(json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True), len(two))
print(json.dumps([[r["team"], r["status"], repr(r["val_loss"]), repr(r["params"])] for r in two]))
"""


def test_records_parsed_by_two_processes_give_the_rows_one_process_gives(tmp_path):
    """A cold rebuild parses half of the records in a fork: the same rows, in the same order, unreadable records
    and records of the wrong types included, as one process reads."""
    runs, log = tmp_path / "runs", tmp_path / "log"
    log.mkdir()
    for seed in range(8):
        make_run(runs, f"team{seed % 3}", 2.0 + seed / 10, seed=seed)
    (make_run(runs, "broken", 2.0, seed=20) / "run.json").write_text("{not json")
    wrong = make_run(runs, "wrong", 2.0, seed=21) / "run.json"
    wrong.write_text(wrong.read_text().replace('"val_loss": 2.0', '"val_loss": "2.0"'))
    nan = make_run(runs, "nan", 2.0, seed=22) / "run.json"  # parsed by the stdlib, read back from the copy alike
    nan.write_text(nan.read_text().replace('"val_loss": 2.0', '"val_loss": NaN'))
    wide = make_run(runs, "wide", 2.0, seed=23) / "run.json"  # an int past 64 bits: orjson would make it a float
    record = json.loads(wide.read_text())
    record["params"] = 2**70
    wide.write_text(json.dumps(record))
    proc = subprocess.run([sys.executable, "-c", PARSE, str(runs), str(log)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    same, rows = proc.stdout.splitlines()
    assert same == "True 12", "orjson and two processes give the rows the stdlib gives in one"
    rows = {team: (status, loss, params) for team, status, loss, params in json.loads(rows)}
    assert rows["nan"][1] == "nan" and rows["wide"][0] == "unreadable" and rows["broken"][0] == "unreadable"
    parsers = {p.name: p.read_text().split() for p in log.iterdir()}
    assert len(parsers) == 2 and sorted(map(len, parsers.values())) == [6, 18], "all alone, then half each"


@pytest.mark.parametrize("text", [
    '{"status": "ok", "val_loss": NaN, "tokens": 5}',                     # NaN: orjson refuses, the stdlib reads
    '{"status": "ok", "params": 36893488147419103232, "seed": 1}',          # past 64 bits: an int, never a float
    '{"status": "ok", "track": {"max_steps": -18446744073709551617}}',     # nested in a field the row reads
    '{"status": "ok", "val_loss": 1e400, "team": "a", "team": "b"}',       # infinity; the last of a repeated key
    '{"status": "ok", "notes": ' + "[" * 1100 + "]" * 1100 + "}",          # deeper than orjson goes
    '{"status": "ok", "reason": "\\ud800 and \\u0000"}',                   # a lone surrogate, a NUL
    '{"status": "ok", "schema_version": 3, "versions": ' + '{"a": ' * 500 + "1" + "}" * 501,  # deep in a field
])
def test_orjson_reads_a_record_as_the_stdlib_does(tmp_path, text):
    from harness.results.records import read_record_fields, read_record_json

    def outcome(read):
        try:
            raw = read()
        except ValueError as exc:
            return f"raised {type(exc).__name__}: {exc}"
        return json.dumps(raw), [type(v).__name__ for v in raw.values()]

    path = tmp_path / "run.json"
    for encoding in ("utf-8", "utf-16"):
        path.write_bytes(text.encode(encoding))
        assert outcome(lambda: read_record_fields(path, leaderboard.READ_KEYS)) == outcome(lambda: read_record_json(path))


class _Reads(dict):
    """A record that notes every key read of it."""

    def __init__(self, *a, seen: set, **k):
        super().__init__(*a, **k)
        self.seen = seen

    def get(self, key, default=None):
        self.seen.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


def test_orjson_is_checked_on_every_key_a_row_is_made_of(tmp_path):
    """read_record_fields compares orjson's reading with the stdlib's on READ_KEYS only: a key the row is made of
    and not in that list could differ unseen."""
    from harness.results.records import read_record_json, record_folder, upgrade_record

    raw = read_record_json(make_run(tmp_path / "runs", "alpha", 2.0) / "run.json")
    seen: set = set()
    record = upgrade_record(_Reads(raw, seen=seen))
    assert isinstance(record, _Reads), "a record of this schema is read as it is"
    assert leaderboard.field_problem(record) == ""
    leaderboard.record_row(record)
    record_folder(record)
    assert seen and seen <= set(leaderboard.READ_KEYS), seen - set(leaderboard.READ_KEYS)


def test_a_record_of_the_first_schema_with_a_probe_that_is_not_an_object_never_stops_the_board(tmp_path):
    """upgrade_record read `k in scaling` of a planted schema-1 record ("scaling": 5): TypeError, and every board
    of the track failed to build."""
    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0)
    path = make_run(runs, "bravo", 2.1, seed=2) / "run.json"
    record = json.loads(path.read_text())
    del record["schema_version"]
    record["scaling"] = 5
    path.write_text(json.dumps(record))
    rows = {r["team"]: r for r in load_rows(runs, "local")}
    assert rows["bravo"]["status"] == "ok" and rows["bravo"]["val_loss"] == 2.1
    assert list(build_table(list(rows.values()))["team"]) == ["alpha", "bravo"]


def test_the_garbage_collector_rests_while_a_board_is_rebuilt_and_is_as_it_was_after(tmp_path, monkeypatch):
    """The rows of 10,000 records started collections that walked the whole heap (torch's in a launcher): off
    during a rebuild, on again after, even where the rebuild fails; left off where the caller had it off."""
    import gc

    from harness.results import views

    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0)
    seen = []
    real = views.load_rows

    def noting(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(views, "load_rows", noting)
    assert gc.isenabled()
    rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots", charts=False)
    assert seen == [False] and gc.isenabled()
    monkeypatch.setattr(views, "build_table", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots", charts=False)
    assert gc.isenabled()
    gc.disable()
    try:
        monkeypatch.undo()
        rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots", charts=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_tracks_with_records_are_those_a_glob_of_every_record_finds(tmp_path):
    """tracks_in stops at a track's first record (a glob of 10,000 took a third of a second, twice per `harness
    leaderboard`): the same tracks as the glob, hidden names, links and a folder named run.json included."""
    from harness.results.views import tracks_in

    for rel in ["a/t1/r1/run.json", "b/t1/r1/notrun.json", "c/.hidden/r/run.json", ".d/t/r/run.json",
                "e/t/.r/run.json", "f/t/r/run.json/x"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "g/t/r").mkdir(parents=True)
    (tmp_path / "h/t/r").mkdir(parents=True)
    os.symlink("/nonexistent", tmp_path / "h/t/r/run.json")  # a broken link: no record, as the glob sees it
    (tmp_path / "k/t").mkdir(parents=True)
    os.symlink(tmp_path / "a/t1/r1", tmp_path / "k/t/r")
    os.symlink(tmp_path / "a", tmp_path / "i")
    (tmp_path / "file").write_text("")
    globbed = sorted({p.parent.parent.parent.name for p in tmp_path.glob("*/*/*/run.json")})
    assert tracks_in(tmp_path) == globbed == [".d", "a", "c", "e", "f", "i", "k"]
    assert tracks_in(tmp_path / "nothing") == []


def test_rebuilds_that_overlap_leave_the_collector_on_only_when_the_last_ends():
    """Two rebuilds at once (threads): the first to end turned the collector on under the second, and the second,
    which had seen it off, left it off for good."""
    import gc

    from harness.results.views import paused_gc

    first, second = paused_gc(), paused_gc()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled(), "still off while the second rebuild runs"
    second.__exit__(None, None, None)
    assert gc.isenabled(), "on again once the last has ended"
