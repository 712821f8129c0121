"""An organiser's track, given as a TOML path, works with every command as with `run`, and every command the
harness suggests for it works where it will be typed (another folder, another node): the file's absolute path,
never its name, which loads nothing."""

import pytest
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import FIXTURES, ROOT, TINY_TRACK, quick_track, run_as_slurm, tiny_track_with
from harness.tracks.spec import load_track
from records_factory import make_run

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _event_track(folder: Path, name: str = "event", **replace: str) -> Path:
    """tiny.toml renamed, in `folder`; returns the file's path."""
    folder.mkdir(parents=True, exist_ok=True)
    text = TINY_TRACK.read_text().replace('name = "tiny"', f'name = "{name}"')
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def _best_and_mean_disagree(runs: Path) -> None:
    """alpha has the best run (1.9), bravo the best mean (2.05 against 2.2)."""
    for seed, v in enumerate((2.5, 1.9), 1):
        make_run(runs, "alpha", v, seed=seed, track="tiny")
    for seed, v in enumerate((2.0, 2.1), 1):
        make_run(runs, "bravo", v, seed=seed, track="tiny")


def test_leaderboard_takes_a_track_file_and_ranks_by_its_rules(cli, tmp_path):
    runs = tmp_path / "runs"
    _best_and_mean_disagree(runs)  # records made while the track said `ranking = "mean"`
    (tmp_path / "event").mkdir()
    tiny_track_with(tmp_path / "event", ranking="best")  # the organiser's file now says: the best run
    result = cli("leaderboard", "--track", "event/tiny.toml", "--runs-dir", str(runs), "--out", str(tmp_path / "lb"),
                 "--no-charts")
    assert result.code == 0, result.err
    assert "tiny: 2 ranked of 2 teams" in result.out  # the file's name finds runs/tiny/
    csv = (tmp_path / "lb" / "tiny.csv").read_text().splitlines()
    assert [line.split(",")[1] for line in csv[1:]] == ["alpha", "bravo"]  # ranked by the file's rule
    assert "best over" in (tmp_path / "lb" / "tiny.md").read_text()
    # By name, the records' own rule, as before.
    named = cli("leaderboard", "--track", "tiny", "--runs-dir", str(runs), "--out", str(tmp_path / "lb2"), "--no-charts")
    assert named.code == 0, named.err
    assert [line.split(",")[1] for line in (tmp_path / "lb2" / "tiny.csv").read_text().splitlines()[1:]] == ["bravo",
                                                                                                            "alpha"]
    # A file whose track has no records is the same error as a name without records, naming the track.
    other = _event_track(tmp_path / "other")
    missing = cli("leaderboard", "--track", str(other), "--runs-dir", str(runs), "--out", str(tmp_path / "lb3"))
    assert missing.code == 2 and "no run records for track 'event'" in missing.err


def test_the_leaderboard_refreshed_after_a_run_ranks_by_the_track_files_rules(cli, tmp_path):
    track = quick_track(tmp_path, ranking="best")
    result = cli("run", str(FIXTURES / "ok_bigram"), "--track", str(track), leaderboard=True)
    assert result.code == 0, result.err
    assert "best over" in (tmp_path / "leaderboard" / "tiny.md").read_text()
    assert "the best of" in (tmp_path / "leaderboard" / "tiny.html").read_text()


def test_compare_finds_a_track_files_teams_and_advises_runs_on_that_file(cli, tmp_path):
    runs = tmp_path / "runs"
    source = {"source": str(TINY_TRACK)}  # as `harness run --track tests/fixtures/tracks/tiny.toml` records it
    for seed, v in enumerate((2.0, 2.1), 1):
        make_run(runs, "alpha", v, seed=seed, track="tiny", track_fields=source)
    for seed, v in enumerate((2.05, 2.02), 1):
        make_run(runs, "bravo", v, seed=seed, track="tiny", track_fields=source)
    make_run(runs, "alpha", 2.3, track="local")  # alpha ran on two tracks: --track chooses
    assert "choose one with --track" in cli("compare", "alpha", "bravo", "--runs-dir", str(runs)).err
    for given in (str(TINY_TRACK), os.path.relpath(TINY_TRACK, tmp_path)):
        result = cli("compare", "alpha", "bravo", "--track", given, "--runs-dir", str(runs), "--format", "json",
                     "--chart", str(tmp_path / "c.png"))
        assert result.code == 0, result.err
        out = json.loads(result.out)
        assert [len(s["run_ids"]) for s in out["sides"]] == [2, 2]
    # The noise is as large as the difference: more seeds, on this track (without --track they would run on local).
    advice = next(line for line in out["verdict"] if line.startswith("For a fair comparison"))
    command = advice[advice.index("`harness run") + 1:advice.index("`", advice.index("`harness run") + 1)]
    argv = shlex.split(command)
    assert argv[:3] == ["harness", "run", "SUBMISSION"] and argv[3] == "--track"
    assert argv[4] == str(TINY_TRACK) and load_track(argv[4]).name == "tiny"


def _texts(fig) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_the_scaling_chart_suggests_scale_with_the_track_files_path(tmp_path, monkeypatch):
    """Before any `harness scale`, the chart says what to run: for an organiser's track, its file's path (the one
    its records were made with, or the file given to `harness leaderboard`), which `harness scale` loads."""
    import harness.results.charts.rate_charts as rate_charts
    from harness.results.views import rebuild

    drawn = []
    real = rate_charts.scaling_figure
    monkeypatch.setattr(rate_charts, "scaling_figure", lambda *a, **k: drawn.append(real(*a, **k)) or drawn[-1])
    runs = tmp_path / "runs"
    make_run(runs, "alpha", 2.0, track="tiny", track_fields={"source": str(TINY_TRACK)})
    rebuild(runs, "tiny", tmp_path / "lb", tmp_path / "plots")
    assert f"harness scale submissions/<team> --track {TINY_TRACK} --world-sizes 1,2" in _texts(drawn[-1])
    moved = tiny_track_with(tmp_path, ranking="best").resolve()
    rebuild(runs, "tiny", tmp_path / "lb", tmp_path / "plots", spec=load_track(str(moved)))
    assert f"--track {moved} --world-sizes" in _texts(drawn[-1])
    make_run(runs, "bravo", 2.0, track="local")  # a built-in track is named, as before
    rebuild(runs, "local", tmp_path / "lb", tmp_path / "plots")
    assert "harness scale submissions/<team> --track local --world-sizes 1,2" in _texts(drawn[-1])


def test_slurm_passes_a_track_file_to_every_node_by_its_absolute_path(cli, tmp_path):
    """A file under a folder named harness/tracks (an organiser's checkout) is not a built-in track: each node is
    given its absolute path, which the script passes to `harness run` intact."""
    track = _event_track(tmp_path / "harness" / "tracks", **{"nnodes = 1": "nnodes = 2"}).resolve()
    result = cli("slurm", str(ROOT / "submissions" / "baseline"), "--track", "harness/tracks/event.toml",
                 "-o", "job.sbatch")
    assert result.code == 0, result.err
    script = tmp_path / "job.sbatch"
    text = script.read_text()
    assert f"export HARNESS_TRACK={track}" in text.splitlines() and "shared file system" in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    check = subprocess.run(["shellcheck", "--severity=info", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    argv = run_as_slurm(script, tmp_path, SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="4242")
    given = argv[argv.index("--track") + 1]
    assert given == str(track) and load_track(given).name == "event"


def test_check_suggests_run_and_slurm_commands_that_work_from_another_folder(cli, tmp_path):
    (tmp_path / "tracks").mkdir()
    track = tiny_track_with(tmp_path / "tracks", nnodes=2).resolve()  # several nodes: check suggests `harness slurm`
    result = cli("check", str(FIXTURES / "ok_bigram"), "--track", "tracks/tiny.toml")
    assert result.code == 0, result.text
    lines = result.out.splitlines()
    run = shlex.split(next(line for line in lines if "organisers run" in line).split("organisers run", 1)[1])
    assert run[:2] == ["harness", "run"] and run[run.index("--track") + 1] == str(track)
    slurm = shlex.split(next(line for line in lines if "harness slurm" in line).split(": ", 1)[1])
    assert slurm[-1] == "--submit"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run([sys.executable, "-m", "harness", *slurm[1:-1], "-o", "job.sbatch"], cwd=elsewhere,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"export HARNESS_TRACK={track}" in (elsewhere / "job.sbatch").read_text().splitlines()
