"""Every process of a run imports the harness the launcher imported, whatever its working folder holds
(issue 23, item 10: a plain `pip install .` run from the checkout's root)."""

import pytest
import os
import sys

from conftest import FIXTURES, QUICK_STEPS, TINY_TRACK, only_record
from harness.ranks import interpreter


def _decoy(folder):
    """A `harness` package in the working folder, as the checkout's own is after a plain install: importing
    it leaves a mark and ends the process."""
    pkg = folder / "harness"
    pkg.mkdir(parents=True)
    mark = folder / "decoy-imported"
    (pkg / "__init__.py").write_text(
        "import os, sys\n"
        f"open({str(mark)!r}, 'a').write(f'{{os.getpid()}} {{sys.argv}}\\n')\n"
        "raise SystemExit('the decoy harness was imported')\n")
    return mark


@pytest.mark.slow
def test_a_harness_folder_in_the_working_folder_is_never_imported(cli, tmp_path):
    """Training ranks, the check, the scorer and its model processes all start from the launcher's working
    folder or their own; none may import a `harness` found there. On the old code the ranks (`python -m`
    puts the working folder first) imported the decoy and the run crashed without a report."""
    mark = _decoy(tmp_path)
    result = cli("run", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK), "--max-steps", str(QUICK_STEPS))
    assert not mark.exists(), f"the decoy was imported by: {mark.read_text()}"
    assert result.code == 0, result.text
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok", record["reason"]


@pytest.mark.slow
def test_a_namespace_folder_named_harness_does_not_hide_the_harness(cli, tmp_path):
    """An organiser's `harness/tracks/event.toml` beside the run (no __init__.py: a namespace package)."""
    (tmp_path / "harness" / "tracks").mkdir(parents=True)
    result = cli("check", str(FIXTURES / "ok_bigram"), "--track", str(TINY_TRACK))
    assert result.code == 0, result.text


def test_children_run_this_interpreter_without_the_working_folder_on_their_path():
    argv = interpreter.python_argv("harness.ranks.training.train", 3)
    assert argv == [sys.executable, "-u", "-P", "-m", "harness.ranks.training.train", "3"]


def test_a_harness_outside_the_site_folders_is_put_first_on_the_childrens_path(monkeypatch, tmp_path):
    root = interpreter.harness_root()
    monkeypatch.setattr(interpreter, "_site_dirs", lambda: {str(tmp_path)})
    assert interpreter.harness_path({}) == {"PYTHONPATH": root}
    other = os.pathsep.join(["/opt/x", "/opt/y"])
    assert interpreter.harness_path({"PYTHONPATH": other}) == {"PYTHONPATH": os.pathsep.join([root, other])}
    assert interpreter.harness_path({"PYTHONPATH": root + os.pathsep + "/opt/x"}) == {}  # already first: kept
    assert interpreter.child_environment({"A": "1"}) == {"A": "1", "PYTHONPATH": root}


def test_a_harness_in_the_site_folders_adds_nothing(monkeypatch):
    """site-packages ahead of the standard library could let a package shadow a standard module."""
    monkeypatch.setattr(interpreter, "_site_dirs", lambda: {interpreter.harness_root()})
    assert interpreter.harness_path({"PYTHONPATH": "/opt/x"}) == {}


@pytest.mark.slow
def test_a_rank_that_dies_without_a_report_gives_the_last_error_line_of_its_log(cli, tmp_path):
    result = cli("run", str(FIXTURES / "exits_silently"), "--track", str(TINY_TRACK), "--max-steps", str(QUICK_STEPS))
    assert result.code != 0
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed"
    reason = record["reason"]
    assert reason.startswith("rank 0 died (exit code 7) without a report") and record["failing_rank"] == 0, reason
    assert reason.endswith("; its log ends: MemoryError: pinned host buffer of 4 GiB refused"), reason


def test_what_a_rank_prints_before_its_own_log_is_kept_for_the_reason(tmp_path):
    """A rank that fails before the harness opens its log (an import: the plain-install case) printed only to
    torch elastic's file; the job keeps that file's end for the reason."""
    from harness.launcher.control.elastic import ElasticJob, LaunchSpec
    from harness.launcher.run.outcome import last_error_line

    job = ElasticJob(LaunchSpec(module="harness.no_such_module", args=[], nproc_per_node=1,
                                shutdown_timeout_s=2.0), tmp_path / "launcher.log")
    job.start()
    job._thread.join(60)
    job.close()
    assert 0 in job.failures and "exitcode" in job.failures[0]
    assert last_error_line("", job.early_output[0]).endswith("No module named harness.no_such_module")


def test_the_error_line_is_the_last_one_that_says_error():
    from harness.launcher.run.outcome import last_error_line

    tail = "Traceback (most recent call last):\n  File \"x.py\", line 1\nPermissionError: [Errno 13] denied\n\nbye\n"
    assert last_error_line(tail) == "PermissionError: [Errno 13] denied"
    assert last_error_line("", "only this\n") == "only this"  # nothing in the first log: the second's
    assert last_error_line("", "  \n") == ""


def test_every_node_of_a_slurm_job_imports_the_harness_that_wrote_the_script(monkeypatch, tmp_path):
    """The job's working folder is the folder it was submitted from (an organiser's checkout, `harness/tracks/`
    beside it): `-P` keeps it off each node's path, and a harness outside the site folders is named."""
    from conftest import ROOT
    from harness.launcher.event import slurm

    opts = slurm.SlurmOptions(submission=str(ROOT / "submissions" / "baseline"), track="paris2026",
                              runs_dir=str(tmp_path / "runs"))
    monkeypatch.setattr(interpreter, "_site_dirs", lambda: {str(tmp_path)})
    text = slurm.render(opts)[0]
    assert '"$HARNESS_PYTHON" -P -m harness run' in text
    assert f"export PYTHONPATH={interpreter.harness_root()}\"${{PYTHONPATH:+:$PYTHONPATH}}\"" in text.splitlines()
    monkeypatch.setattr(interpreter, "_site_dirs", lambda: {interpreter.harness_root()})
    assert "PYTHONPATH" not in slurm.render(opts)[0]
