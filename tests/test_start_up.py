"""What a run does between the launch and its first step: the check process held before team code while the
ranks start (harness/launcher/run/check_process.py), the scope that ends the check's processes and never the ranks
started beside it, and the ranks' rendezvous begun before their last imports (harness/ranks/process.py)."""

from __future__ import annotations

import platform
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
READ_SYSCALL = {"x86_64": 0, "aarch64": 63}[platform.machine()]  # read()'s number in /proc/PID/syscall

# Module-level code of a team's file: what it runs, it runs at import, so the marker says whether team code ran.
MARKS_ITS_IMPORT = 'open("team-code-ran", "w").write("yes")\n'


def _blocked_reading(root: int, fd: int) -> bool:
    """Whether some process of `root`'s tree is inside read() on its descriptor `fd` (the kernel's word, not a
    guess from time)."""
    try:
        tree = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return False
    for proc in tree:
        try:
            fields = Path(f"/proc/{proc.pid}/syscall").read_text().split()
        except OSError:
            continue
        if len(fields) > 1 and fields[0] == str(READ_SYSCALL) and int(fields[1], 16) == fd:
            return True
    return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_held(check, log: Path) -> None:
    """Until the held check process waits for its release, its harness part done (sandbox, screen, imports)."""
    hold_fd = int(Path(f"/proc/{check.proc.pid}/cmdline").read_text().split("\0")[-2])
    deadline = time.monotonic() + 120  # its imports of torch and dynamo, on a busy machine
    while not _blocked_reading(check.proc.pid, hold_fd):
        assert check.proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the held check never came to wait for its release"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_held_check_runs_no_team_code_until_released_then_checks_as_any_check(tmp_path):
    from harness.launcher.run.check_process import CheckProcess

    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "submission.py").write_text(MARKS_ITS_IMPORT + (FIXTURES / "ok_bigram" / "submission.py").read_text())
    check = CheckProcess(folder, vocab_size=256, device="cpu", seed=1, log_path=tmp_path / "check.log",
                         eval_seq_len=64, precision="float32", hold=True)
    try:
        _wait_until_held(check, tmp_path / "check.log")
        # Held: the sandbox report and the screen are sent, torch is imported, and no team code has run.
        assert not (check.tmp / "team-code-ran").exists()
        sent = check._drain.data()
        assert b'"sandbox"' in sent and b'"screen"' in sent
        report = check.finish()
    finally:
        check.close()
    assert report["ok"], report["problems"]
    assert report["params"] == 256 * 256 and report["flops_method"] == "meta"
    assert not check.tmp.exists()


@pytest.mark.slow
def test_a_check_never_released_ends_with_nothing_left_and_no_team_code_run(tmp_path):
    from harness.launcher.run.check_process import CheckProcess

    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "submission.py").write_text(MARKS_ITS_IMPORT + (FIXTURES / "ok_bigram" / "submission.py").read_text())
    check = CheckProcess(folder, vocab_size=256, device="cpu", seed=1, log_path=tmp_path / "check.log",
                         eval_seq_len=64, precision="float32", hold=True)
    try:
        _wait_until_held(check, tmp_path / "check.log")
        tree = [check.proc.pid, *(p.pid for p in psutil.Process(check.proc.pid).children(recursive=True))]
        time.sleep(0.5)
        assert not (check.tmp / "team-code-ran").exists()
    finally:
        check.close()
    check.close()  # idempotent
    assert not check.tmp.exists()  # its folder goes with it: nothing of an unreleased check is read
    assert check.proc.poll() is not None
    alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive


def test_a_rebased_scope_ends_what_the_kept_process_started_and_never_what_started_beside_it():
    """The check's scope without a cgroup (the fallback) ends every process that appeared while it was open. A
    check started before the training job must not end the job's ranks, which appear while it is held: at its
    release the scope keeps only the check's own tree."""
    from harness.launcher.control.process_tree import ProcessScope

    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    scope = ProcessScope(grace_s=1.0)
    held = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    rank = subprocess.Popen(sleeper)  # the job beside it
    try:
        deadline = time.monotonic() + 60
        while len(psutil.Process(held.pid).children()) < 1:  # the held process's own child is up
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child = psutil.Process(held.pid).children()[0].pid
        scope.rebase(keep=held.pid)
        later = subprocess.Popen(sleeper)  # started after the release: the scope's (what team code starts)
        killed = scope.close()
        assert set(killed) >= {held.pid, child, later.pid}
        assert rank.pid not in killed and rank.poll() is None
        held.wait(timeout=10)
        later.wait(timeout=10)
    finally:
        for proc in (held, rank):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def test_the_rendezvous_meets_its_peer_on_its_own_before_its_result_is_asked(monkeypatch):
    """A rank begins its rendezvous before its last imports and the launcher's word: the client that finds no
    store yet (torch retries after about half a second) meets rank 0's store while the rank does other work. Here
    the store comes up after the rendezvous began and waits for every worker, which it gets before result() is
    called; result() then gives what init_process_group's env:// rendezvous gives, its store's keys under
    "default_pg"."""
    from torch.distributed import TCPStore

    from harness.ranks.process import Rendezvous

    port = _free_port()
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "1", "WORLD_SIZE": "2",
                       "TORCHELASTIC_USE_AGENT_STORE": "False"}.items():
        monkeypatch.setenv(key, value)
    meeting = Rendezvous(timeout_s=60)
    time.sleep(0.05)  # begun, and found no store: its client waits to try again
    server = TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=60), wait_for_workers=True)  # returns once met
    assert meeting.is_alive() or meeting._value is not None
    store, rank, world_size = meeting.result()
    assert (rank, world_size) == (1, 2)
    store.set("probe", "1")
    assert server.get("default_pg/probe") == b"1"


def test_a_rendezvous_that_fails_raises_where_its_result_is_asked(monkeypatch):
    from harness.ranks.process import Rendezvous

    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    meeting = Rendezvous(timeout_s=5)
    with pytest.raises(Exception, match="MASTER_ADDR|MASTER_PORT"):
        meeting.result()
