"""What a run does between the launch and its first step: the check process held before team code while the
ranks start (harness/launcher/run/check_process.py), the scope that ends the check's processes and never the ranks
started beside it, and the ranks' rendezvous begun before their last imports (harness/ranks/process.py)."""

from __future__ import annotations

import os
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

from conftest import TINY_TRACK, only_record

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


def _held_check(tmp_path: Path):
    """A check process held before team code, of ok_bigram with a first line that marks its import."""
    from harness.launcher.run.check_process import CheckProcess

    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "submission.py").write_text(MARKS_ITS_IMPORT + (FIXTURES / "ok_bigram" / "submission.py").read_text())
    return CheckProcess(folder, vocab_size=256, device="cpu", seed=1, log_path=tmp_path / "check.log",
                        eval_seq_len=64, precision="float32", hold=True)


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
    check = _held_check(tmp_path)
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
    check = _held_check(tmp_path)
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


@pytest.mark.slow
def test_a_held_check_whose_launcher_is_gone_leaves_by_itself_running_no_team_code(tmp_path):
    """The hold pipe's end (the launcher killed outright, its write end closed by the kernel) is a release without a
    word: the check leaves by itself, with no team code run."""
    check = _held_check(tmp_path)
    try:
        _wait_until_held(check, tmp_path / "check.log")
        os.close(check._hold_write)  # what the kernel does when the launcher dies
        check._hold_write = -1
        assert check.proc.wait(timeout=60) == 0, (tmp_path / "check.log").read_text()
        assert not (check.tmp / "team-code-ran").exists()
    finally:
        check.close()


def test_a_scope_never_ends_the_tree_another_scope_owns_even_what_appeared_after_it_began():
    """The check process is made before the training job; its sandbox forks the process that runs its code a moment
    later, after the job's scope may have listed what was there. The job's teardown (a stop, a rank that never
    started) must not end that process: the check's scope owns its tree, and only it ends it."""
    from harness.launcher.control.process_tree import ProcessScope

    check_scope = ProcessScope(grace_s=1.0)
    held = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; time.sleep(0.5); "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    check_scope.own(held.pid)
    job_scope = ProcessScope(grace_s=1.0)  # lists `held` alone: its child is not there yet
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 60
        while not psutil.Process(held.pid).children():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        child = psutil.Process(held.pid).children()[0].pid
        killed = job_scope.close()
        assert rank.pid in killed and child not in killed and held.pid not in killed
        assert psutil.Process(child).is_running() and held.poll() is None
        assert set(check_scope.close()) >= {held.pid, child}
        rank.wait(timeout=10)
        held.wait(timeout=10)
    finally:
        for proc in (held, rank):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


def test_a_process_that_took_a_spared_pid_is_not_spared():
    """A scope spares the processes that were there when it began, told apart by pid and start time: a process that
    takes the pid of one that ended (team code can cycle the pid counter to choose it) is ended all the same."""
    from harness.launcher.control.process_tree import identity, terminate_descendants

    late = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid, started = identity(late.pid)
        killed = terminate_descendants(1.0, exclude={(pid, started - 1.0)})  # its pid, another start: another process
        assert late.pid in killed
        late.wait(timeout=10)
        spared = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert spared.pid not in terminate_descendants(1.0, exclude={identity(spared.pid)})
            assert spared.poll() is None
        finally:
            spared.kill()
            spared.wait()
    finally:
        if late.poll() is None:
            late.kill()
            late.wait()


def test_what_an_owned_tree_starts_while_another_scope_ends_its_own_is_spared_too():
    """The job's teardown gives its processes a grace period, then looks again and kills what is left; a process the
    owned check started meanwhile (a compile worker) is the check's, not the job's."""
    from harness.launcher.control.process_tree import ProcessScope

    check_scope = ProcessScope(grace_s=1.0)
    held = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; time.sleep(1.0); "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    check_scope.own(held.pid)
    job_scope = ProcessScope(grace_s=3.0)
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                 "signal.SIG_IGN); time.sleep(60)"])  # holds the job's teardown for its grace
    try:
        time.sleep(0.3)  # its handler set
        killed = job_scope.close()  # the held process forks during the grace
        children = psutil.Process(held.pid).children()
        assert stubborn.pid in killed and children and children[0].pid not in killed, (killed, children)
        assert children[0].is_running()
        check_scope.close()
    finally:
        for proc in (held, stubborn):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()


def test_an_owned_pid_another_process_took_is_not_spared():
    """What a scope owns is a process, not a pid: once the owned process is gone and its pid is another's, the other
    scopes end that one as any other."""
    from harness.launcher.control import process_tree

    owner = process_tree.ProcessScope(grace_s=1.0)
    job_scope = process_tree.ProcessScope(grace_s=1.0)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pid, ticks = process_tree.identity(other.pid)
        process_tree._OWNED[pid] = ((pid, ticks - 1), owner)  # as if the owned process had ended and `other` took its pid
        assert other.pid in job_scope.close()
        other.wait(timeout=10)
    finally:
        process_tree._OWNED.pop(other.pid, None)
        if other.poll() is None:
            other.kill()
            other.wait()


def test_a_process_is_told_apart_by_ticks_since_boot_whatever_the_wall_clock_does(monkeypatch):
    """A clock step (NTP, a resumed VM) moves the boot time as the wall clock sees it; a process's identity must not
    move with it, or every scope would take what was there before it for new and end it."""
    import psutil._pslinux as pslinux

    from harness.launcher.control.process_tree import identity

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = identity(proc.pid)
        booted = pslinux.boot_time
        monkeypatch.setattr(pslinux, "boot_time", lambda: booted() + 1.0)
        assert identity(psutil.Process(proc.pid)) == identity(proc.pid) == before
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_a_stop_while_the_check_runs_ends_the_check_at_once(cache_dir, tmp_path):
    """Ctrl-C while the check runs the team's code (here a get_model that sleeps for minutes) ends the check at once
    and the run `aborted`: the check is not the training job's to end, so the launcher ends it itself."""
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.Popen([sys.executable, "-m", "harness", "run", str(FIXTURES / "slow_check"), "--track",
                             str(TINY_TRACK)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 180
        log = None
        while log is None or "SLOW-CHECK" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            logs = list((tmp_path / "runs").glob("*/*/*/logs/preflight.log"))
            log = logs[0] if logs else None
            time.sleep(0.2)
        checks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                  if "harness.ranks.models.preflight" in " ".join(p.cmdline())]
        assert checks
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
        assert time.monotonic() - sent < 60, "the check ran on after the stop"  # its get_model sleeps 240 s
        _, record = only_record(tmp_path / "runs")
        assert record["status"] == "aborted" and "SIGINT" in record["reason"], record["reason"]
        assert not [p for p in checks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


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
    meeting.join(timeout=30)  # met: the thread ends by itself, nobody having asked for its result
    assert not meeting.is_alive() and meeting._value is not None and meeting._error is None
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
