"""The command line itself: help, setup errors that stop before anything runs (exit code 2), and which
stream says what (results on stdout, progress and errors on stderr)."""

import pytest
from conftest import FIXTURES, ROOT, TINY_TRACK


def test_help_lists_the_commands(cli):
    """Every command, each on its own line of the help with its one-line summary."""
    import re

    from harness.cli import main

    result = cli("--help")
    assert result.code == 0
    listed = re.findall(r"^  (\S+)\s{2,}\S", result.out.split("Commands:", 1)[1], re.M)
    assert sorted(listed) == sorted(main.commands), result.out


def test_unknown_track_is_one_clear_line_and_no_record(cli, tmp_path):
    result = cli("run", str(ROOT / "submissions" / "baseline"), "--track", "paris2062")
    assert result.code == 2
    assert "Unknown track 'paris2062'. Did you mean: paris2026?" in result.err
    assert not (tmp_path / "runs").exists()


def test_missing_submission_folder(cli, tmp_path):
    result = cli("run", "submissions/team_x")
    assert result.code == 2 and "submissions/team_x: does not exist" in result.err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_missing_gpu_for_a_gpu_track_is_a_setup_error(cli):
    result = cli("run", str(ROOT / "submissions" / "baseline"), "--track", "dev-gpu")
    assert result.code == 2 and "none is visible" in result.err


def test_a_mistyped_submission_folder_suggests_the_near_name(cli, tmp_path):
    result = cli("run", str(ROOT / "submissions" / "baselin"))
    assert result.code == 2 and "does not exist. Did you mean:" in result.err
    assert str(ROOT / "submissions" / "baseline") in result.err
    assert not (tmp_path / "runs").exists()


def test_leaving_without_teardown_still_does_what_an_exit_must(tmp_path):
    """`harness run` leaves without the interpreter's teardown (a CPU-second once torch is loaded), yet
    as a normal exit would: its exit code, buffered output written, atexit callbacks run, a non-daemon
    thread still working waited for, and work handed to a thread pool (even one a daemon thread
    started, as torch elastic's log tailer is) finished; a daemon thread is not waited for."""
    import subprocess
    import sys

    def leave(body: str) -> subprocess.CompletedProcess:
        script = "\n".join(["import atexit, sys, threading, time, concurrent.futures",
                            "from harness.cli import exit_without_teardown",
                            "atexit.register(lambda: print('atexit ran', file=sys.stderr))",
                            f"def work(path):\n    time.sleep(0.5)\n    open(path, 'w').write('x')",
                            body, "sys.stdout.write('buffered, no newline')", "exit_without_teardown(3)"])
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)

    for body, name, written in [
        ("", None, None),
        ("threading.Thread(target=work, args=({p!r},)).start()", "thread", True),
        ("threading.Thread(target=work, args=({p!r},), daemon=True).start()", "daemon", False),
        ("pool = []\ndef start():\n    pool.append(concurrent.futures.ThreadPoolExecutor(1))\n"
         "    pool[0].submit(work, {p!r})\nt = threading.Thread(target=start, daemon=True)\nt.start(); t.join()",
         "pool", True),
    ]:
        path = tmp_path / f"{name}-done"
        proc = leave(body.format(p=str(path)))
        assert (proc.returncode, proc.stdout, proc.stderr.strip()) == (3, "buffered, no newline", "atexit ran"), name
        if name:
            assert path.exists() == written, name


@pytest.mark.slow
def test_the_summary_goes_to_stdout_and_progress_to_stderr(cli):
    """`harness run ... > out.txt` keeps the result: the summary is on stdout, the phases on stderr (a
    submission refused by the check: its run is seconds long, and both streams have lines)."""
    result = cli("run", str(FIXTURES / "syntax_error"), "--track", str(TINY_TRACK))
    assert result.code == 1, result.text
    out = result.out.splitlines()
    assert out[0].startswith("status     invalid") and any(line.startswith("record     ") for line in out), result.out
    assert "checking the submission" not in result.out and "checking the submission" in result.err
    assert "status     invalid" not in result.err and "record     " not in result.err
