"""Broken submissions through the real CLI: each ends as a record with a status and a reason,
within a bound, with nothing of the job left running. Track `tiny`: budget 4 s, grace 3 s,
collective timeout 8 s, SIGTERM->SIGKILL after 2 s; on one rank (`one_rank`, `quick_track`) where a
second would show nothing more, on two where the fault is between ranks."""

import csv
import json
import shutil
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, TINY_TRACK, one_rank, only_record, processes_of_run, QUICK_STEPS, quick_track, run_dirs

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def run_fixture(cli, name, *extra, track=TINY_TRACK):
    return cli("run", str(FIXTURES / name), "--track", str(track), *extra)


def assert_clean(record, tmp_path=None, cli=None):
    """Nothing of the job left running; and the leaderboard lists the team as not finished, with the reason."""
    assert processes_of_run(record["run_id"]) == [], "a process of the job outlived it"
    if tmp_path is None:
        return
    name = "tiny.csv" if record["official"] else "tiny-all.csv"
    assert cli("leaderboard", *([] if record["official"] else ["--all"]), "--no-charts").code == 0
    rows = list(csv.DictReader((tmp_path / "leaderboard" / name).open()))
    (row,) = [r for r in rows if r["team"] == record["team"]]
    if record["status"] == "ok":
        assert row["rank"] == "1"
    else:
        assert row["rank"] == "" and row["status"] == record["status"] and row["reason"] == record["reason"]


# One contract error of each kind the run path meets: found reading the file, found reading CONFIG,
# found running the model in the check process. Each message of every contract error is tested where
# it is made, without a run (tests/test_contract.py: import errors, a missing get_model, and the
# forward's outputs through the check process's own run_checks).
@pytest.mark.parametrize("fixture, message", [
    ("syntax_error", "submission.py:5: syntax error: expected ':'. Fix the line shown:\n    def get_model(config)\n"),
    ("bad_config", "CONFIG has no `seq_len`"),
    ("short_positions", "forward fails on a window of 64 tokens, the track's evaluation length"),
])
def test_contract_errors_are_invalid_before_any_process_group(cli, tmp_path, fixture, message):
    result = run_fixture(cli, fixture)
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "invalid" and message in record["reason"]
    # The team's own file, relative to its submission folder: the same on every machine that runs it.
    assert record["reason"].startswith("submission.py"), record["reason"]
    assert str(tmp_path) not in record["reason"] and str(FIXTURES) not in record["reason"]
    assert "status     invalid" in result.out
    assert_clean(record, tmp_path, cli)


def test_ranks_started_beside_a_check_that_fails_never_import_the_submission(cli, tmp_path):
    """The fixed loop's ranks start while the submission is checked and wait for the check's word
    (harness/launcher/run/check_phase.py). Told stop, they end without importing it: the module's top level, which
    says where it runs, ran in the check alone; the run is the check's `invalid`, and nothing of the job is left."""
    result = run_fixture(cli, "refused_at_check")
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "invalid" and "cannot be called as forward(idx, targets)" in record["reason"]
    assert "IMPORTED in rank None" in _read(run_dir / "logs" / "preflight.log"), "the check imported it"
    assert (run_dir / "logs" / "rank0.log").is_file(), "the ranks started beside the check"
    ranks = [_read(run_dir / "logs" / f"rank{r}.log") for r in range(record["world_size"] or 1)]
    assert all("IMPORTED" not in log for log in ranks), ranks
    assert "launch_to_go_s" not in record["timings"] and record["steps"] in (None, 0)
    assert_clean(record, tmp_path, cli)


def test_exception_on_one_rank_is_crashed_with_its_traceback(cli, tmp_path):
    result = run_fixture(cli, "crash_rank1")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and record["failing_rank"] == 1
    assert "deliberate crash on rank 1 at step 3" in record["reason"]
    assert "deliberate crash" in record["traceback"] and "submission.py" in record["traceback"]
    # Seen when it happens, not when a peer's collective times out.
    assert record["launcher_train_time_s"] < record["track"]["collective_timeout_s"], "the crash was not seen at once"
    assert_clean(record, tmp_path, cli)


def line_of(fixture: str, marker: str) -> int:
    lines = (FIXTURES / fixture / "model.py").read_text().splitlines()
    return next(number for number, text in enumerate(lines, 1) if marker in text)


def test_a_shape_error_in_a_second_file_is_named_at_that_files_line_everywhere(cli, tmp_path):
    # submission.py builds the model of model.py, whose forward multiplies mismatched shapes: the team
    # must be sent to model.py's line, not to submission.py (whose check found it) nor to torch's linear.py.
    site = f"model.py:{line_of('second_file_shape_error', 'SHAPE ERROR LINE')}"
    checked = cli("check", str(FIXTURES / "second_file_shape_error"), "--track", str(TINY_TRACK), "--json")
    assert checked.code == 1
    (problem,) = json.loads(checked.out)["problems"]
    assert problem["file"] == site and "mat1 and mat2 shapes" in problem["problem"], problem
    result = run_fixture(cli, "second_file_shape_error", track=one_rank(tmp_path))
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "invalid" and record["reason"].startswith(f"{site}: RuntimeError: mat1"), record["reason"]
    assert f"{site}: RuntimeError" in (run_dir / "logs" / "preflight.log").read_text()


def test_a_syntax_error_in_a_second_file_is_named_at_that_file(cli, tmp_path):
    # A SyntaxError has no frame in the broken file: the file it names is the team's line, not the import's.
    folder = tmp_path / "imports_a_broken_model"
    folder.mkdir()
    (folder / "submission.py").write_text('from model import get_model\nCONFIG = {"micro_batch_size": 4, "seq_len": 32}\n')
    (folder / "model.py").write_text("import torch\ndef get_model(config)\n    return None\n")
    (problem,) = json.loads(cli("check", str(folder), "--track", str(TINY_TRACK), "--json").out)["problems"]
    assert problem["file"] == "model.py:2" and problem["problem"].startswith("syntax error"), problem


def test_a_compiled_model_killed_before_its_second_step_is_told_why(cli, tmp_path):
    # The likeliest end of a compiled model on a short CPU track: its first step (the compilation) runs past
    # budget + grace. The reason says so, instead of only "killed at the hard limit".
    folder = tmp_path / "compiles_forever"
    folder.mkdir()
    source = (FIXTURES / "sleepy_forward" / "submission.py").read_text()
    source = source.replace("if calls >= 3:", "if os.environ.get('LOCAL_RANK') is not None:")  # training, not check
    source = source.replace("    return Bigram(config[\"vocab_size\"])", "    return torch.compile(Bigram(config[\"vocab_size\"]), "
                            "backend=\"eager\")")
    (folder / "submission.py").write_text(source)
    result = cli("run", str(folder), "--track", str(one_rank(tmp_path)))
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "timeout" and "hard limit" in record["reason"], record["reason"]
    assert "the model is torch.compile'd and no step after the first was reported" in record["reason"]
    assert_clean(record)


@pytest.mark.parametrize("compile_mode", ["as_submitted", "eager"])
def test_a_compiled_model_is_given_the_compiler_before_its_start_up_and_a_slow_start_up_is_not_blamed_on_it(
        cli, tmp_path, compile_mode):
    """The compiler's import (1.5 s of CPU at the first torch.compile(), 4-5 s of wall on a busy machine) is the
    harness's: the ranks import it before the team's start-up begins, when the check said the model compiles.
    A start-up that still runs past its allowance is killed before any step, so its reason never blames the
    compile step (which it once did for every compiled model of a team on `local`). On a track that trains
    compiled models eagerly too: get_model's own torch.compile() imports the compiler all the same. Decided
    from the files, not from the check's report (team code could write it)."""
    folder = tmp_path / "slow_start_compiled"
    folder.mkdir()
    source = (FIXTURES / "sleepy_forward" / "submission.py").read_text()
    source = source.replace("    return Bigram(config[\"vocab_size\"])", (
        "    if os.environ.get('LOCAL_RANK') is not None:  # training, not the check\n"
        "        import sys, time\n"
        "        print('COMPILER-IMPORTED', 'torch._inductor.compile_fx' in sys.modules, flush=True)\n"
        "        time.sleep(6)\n"
        "    return torch.compile(Bigram(config[\"vocab_size\"]), backend=\"eager\")"))
    (folder / "submission.py").write_text(source)
    result = cli("run", str(folder), "--track", str(one_rank(tmp_path, startup_allowance_s=2.0, compile=compile_mode)))
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert "COMPILER-IMPORTED True" in (run_dir / "logs" / "rank0.log").read_text()
    assert record["status"] == "timeout" and "start-up took longer than the track's allowance" in record["reason"]
    assert "compile" not in record["reason"], record["reason"]
    assert_clean(record)


def test_a_crash_in_a_second_file_names_that_files_line_in_the_reason(cli, tmp_path):
    site = f"model.py:{line_of('second_file_crash', 'CRASH LINE')}"
    result = run_fixture(cli, "second_file_crash")
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and record["failing_rank"] == 1
    assert record["reason"] == f"rank 1: {site}: RuntimeError: boom in model.py at step 3", record["reason"]
    # torch elastic's "could lead to orphaned worker processes" (its agent is not on the main thread) is not
    # the launcher's case and is not in its log; its own account of the ranks' end is: it stops the ranks still
    # running ("closing signal"), or, where rank 0's collective failed first on a busy machine, says how each ended
    launcher_log = (run_dir / "logs" / "launcher.log").read_text()
    assert "orphaned" not in launcher_log
    assert "closing signal" in launcher_log or "failed (exitcode: 1)" in launcher_log, launcher_log
    assert_clean(record)


def test_forward_sleeping_past_the_budget_is_killed_at_the_hard_limit(cli, tmp_path):
    result = run_fixture(cli, "sleepy_forward", track=one_rank(tmp_path))
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "timeout" and "hard limit" in record["reason"]
    t = record["track"]
    hard_limit = t["budget_s"] + t["grace_s"]
    assert hard_limit <= record["launcher_train_time_s"] < hard_limit + t["shutdown_timeout_s"]
    assert record["timings"]["kill_latency_s"] < t["shutdown_timeout_s"] + 2.0  # poll, SIGTERM (SIGKILL if needed)
    assert record["killed_pids"], "the launcher must have ended the ranks"
    assert_clean(record, tmp_path, cli)


def test_one_hung_rank_ends_the_job_by_timeout(cli, tmp_path):
    result = run_fixture(cli, "hang_rank1")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    # Hard limit (7 s) comes before the collective timeout (8 s) on this track.
    t = record["track"]
    assert record["status"] == "timeout" and "hard limit" in record["reason"]
    assert record["launcher_train_time_s"] < t["budget_s"] + t["grace_s"] + t["shutdown_timeout_s"]
    assert_clean(record, tmp_path, cli)


def test_hung_rank_is_named_when_the_collective_timeout_comes_first(cli, tmp_path):
    result = run_fixture(cli, "hang_rank1", "--grace-s", "30")
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and "rank(s) 1 stopped responding" in record["reason"]
    assert record["failing_rank"] == 1
    t = record["track"]  # the collective timeout, then teardown (SIGTERM, SIGKILL), with headroom
    assert record["launcher_train_time_s"] < t["collective_timeout_s"] + 2 * t["shutdown_timeout_s"] + 2.0
    assert_clean(record, tmp_path, cli)


def test_nan_loss_is_diverged_and_not_evaluated(cli, tmp_path):
    result = run_fixture(cli, "nan_loss", track=one_rank(tmp_path))
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "diverged" and "NaN or inf" in record["reason"]
    assert record["val_loss"] is None and not (run_dir / "checkpoint.pt").exists()
    assert not (run_dir / "logs" / "eval-rank0.log").exists()
    assert record["launcher_train_time_s"] < record["budget_s"]  # stopped at the NaN, not at the budget
    assert_clean(record, tmp_path, cli)


def test_out_of_memory_is_crashed_with_that_reason(cli, tmp_path):
    result = run_fixture(cli, "oom", track=quick_track(tmp_path))
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and "out of memory" in record["reason"]
    assert_clean(record, tmp_path, cli)


def test_processes_a_submission_leaves_behind_are_ended(cli, tmp_path):
    result = run_fixture(cli, "orphan_child", track=quick_track(tmp_path))
    assert result.code == 0, result.err
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok"
    assert record["killed_pids"] and any("left running" in n for n in record["notes"])
    assert_clean(record, tmp_path, cli)


@pytest.mark.slow
def test_processes_a_model_process_leaves_behind_in_evaluation_are_ended_and_said(cli, tmp_path):
    """Training's teardown says what it ended; so does the scorer, for each model process (an honest run says
    nothing: every other test's run would carry the note)."""
    result = run_fixture(cli, "leaves_processes_in_eval", track=quick_track(tmp_path))
    assert result.code == 0, result.err
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok", record["reason"]
    said = [n for n in record["notes"] if n.startswith("evaluation: the ")]
    assert said == ["evaluation: the scoring model process's code still had processes running when it was ended, "
                    "on 1 of 1 scorer(s); the scorer ended them",
                    "evaluation: the check model process's code still had processes running when it was ended, "
                    "on 1 of 1 scorer(s); the scorer ended them"], record["notes"]
    assert_clean(record, tmp_path, cli)


def _heard(udp, within_s: float) -> list[bytes]:
    """What came on the socket within within_s."""
    got, deadline = [], time.monotonic() + within_s
    while (left := deadline - time.monotonic()) > 0:
        udp.settimeout(left)
        try:
            got.append(udp.recv(100))
        except OSError:
            break
    return got


@pytest.mark.parametrize("cgroups, pids", [("on", "on"), ("off", "on"), ("on", "off")])
def test_a_process_that_forks_faster_than_the_teardown_does_not_outlive_the_run(cli, tmp_path, cgroups, pids):
    """Attack: a process, started in the check, in the training rank and in evaluation's model processes, that
    leaves its session and forks a fresh copy of itself every few milliseconds (and on every SIGTERM): no list of
    the job's processes is still true when it is used, so a teardown that lists and kills misses it, and alive
    after the run it could carry the weights into the team's next run. It says it is alive on a UDP port. Each of
    those processes is born in a cgroup of its job's own (harness/launcher/control/job_cgroup.py), ended at once
    by the kernel: nothing is heard once `harness run` has returned. [off-on]: a host where no cgroup can be had
    (HARNESS_CGROUP=off stands for it): the training job's PID namespace (job_namespace.py), and the check's and
    model processes' own, end them all the same. [on-off]: the cgroups alone, where the PID namespace is turned off
    (HARNESS_PID_NAMESPACE=off, as on a host that refuses it), and the record says so."""
    import socket

    folder = tmp_path / "team"
    shutil.copytree(FIXTURES / "outlives_its_job", folder)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    stop = tmp_path / "stop"
    (folder / "mark.txt").write_text(json.dumps({"port": udp.getsockname()[1], "stop": str(stop)}))
    try:
        result = cli("run", str(folder), "--track", str(quick_track(tmp_path)),
                     env={"HARNESS_CGROUP": cgroups, "HARNESS_PID_NAMESPACE": pids})
        assert result.code == 0, result.err
        during = _heard(udp, 0.2)  # what it said while the run lasted, and whatever was on its way
        assert during, "the process never said it was alive: the attack did not run, and the test shows nothing"
        after = _heard(udp, 1.5)
        assert after == [], f"a process the submission started outlived the run: {after[:3]}"
        _, record = only_record(tmp_path / "runs")
        assert record["status"] == "ok" and not record["flagged"], record.get("flag_reason")
        assert record["job_namespace"]["pid_namespace"] is (pids == "on"), record["job_namespace"]
        if pids == "off":
            assert record["job_namespace"]["pid_why"] == "turned off (HARNESS_PID_NAMESPACE=off)", record["job_namespace"]
        held = record["containment"]
        assert set(held) == {"check", "training", "evaluation"}, held
        if cgroups == "on":
            assert all(h["active"] for h in held.values()), held
            assert record["killed_pids"], "the processes it ended are named in the record"
        else:
            assert not any(h["active"] for h in held.values()), held
            assert any("the training job's processes were ended with its PID namespace" in w for w in record["warnings"]), \
                record["warnings"]
    finally:
        stop.write_text("")  # whatever is left sees it and exits
        udp.close()


def _ranks_of(launcher_pid: int) -> list:
    """The rank processes under a launcher, found by what they run, not by the variable under test. Each process torch
    elastic's agent starts forks into the job's PID namespace (harness/ranks/confine/namespaces.py join_job), where
    its child runs the rank's code: that child is the rank (the parent, which only waits, is not dumpable: its
    environment is not for other users to read)."""
    import psutil

    started, ranks = [], []
    for p in psutil.Process(launcher_pid).children(recursive=True):
        try:
            if "harness.ranks.training.train" in p.cmdline():
                (ranks if "harness.ranks.training.train" in p.parent().cmdline() else started).append(p)
        except psutil.Error:
            continue
    return ranks or started


def _alive(proc) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stubborn_run(cache_dir, tmp_path, track, *extra: str) -> subprocess.Popen:
    """`harness run` of `stubborn` (every rank sleeps in its 3rd forward and ignores SIGTERM) in the background."""
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    return subprocess.Popen([sys.executable, "-m", "harness", "run", str(FIXTURES / "stubborn"), "--track", str(track),
                             "--budget-s", "60", *extra], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_until_training(runs: Path, log: str, within_s: float = 90.0) -> None:
    """Until the run's record exists and `log` (a rank's) says its training started, or within_s has passed."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        dirs = run_dirs(runs)
        if dirs and "training starts" in _read(dirs[0] / "logs" / log):
            return
        time.sleep(0.2)


@pytest.mark.parametrize("sig, nproc", [(signal.SIGINT, 1), (signal.SIGTERM, 2), (signal.SIGHUP, 1), (signal.SIGKILL, 1)],
                         ids=lambda v: v.name if isinstance(v, signal.Signals) else f"{v}rank")
def test_signal_to_the_launcher_tears_everything_down(cache_dir, tmp_path, cli, sig, nproc):
    """Ctrl-C, SIGTERM (scancel) and SIGHUP (a closed terminal) end the run `aborted`; the ranks of
    `stubborn` ignore SIGTERM, so the launcher must SIGKILL them after shutdown_timeout_s. SIGKILL of
    the launcher itself takes its ranks with it and leaves the record `running`. While the job runs,
    every rank carries HARNESS_RUN_ID, so the "nothing left" check afterwards is not vacuous. SIGTERM,
    SLURM's, on two ranks; the others on one (the teardown of every rank is the same code)."""
    track = TINY_TRACK if nproc == 2 else one_rank(tmp_path)
    last = f"rank{nproc - 1}.log"
    proc = _stubborn_run(cache_dir, tmp_path, track)
    run_id = None
    try:
        _wait_until_training(tmp_path / "runs", last)
        run_dir, running = only_record(tmp_path / "runs")
        run_id = running["run_id"]
        assert running["status"] == "running", "the record must exist while the run is in progress"
        time.sleep(2.0)  # every rank now sleeps in its 3rd forward
        ranks = _ranks_of(proc.pid)
        assert len(ranks) == running["world_size"] == nproc, [r.cmdline() for r in ranks]
        assert all(r.environ().get("HARNESS_RUN_ID") == run_id for r in ranks), "a rank does not carry HARNESS_RUN_ID"
        assert {r.pid for r in ranks} <= {p.pid for p in processes_of_run(run_id)}
        shutdown = running["track"]["shutdown_timeout_s"]
        sent = time.monotonic()
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.communicate(timeout=60)  # no record can be finished; the ranks die with the launcher (PDEATHSIG)
            while processes_of_run(run_id) and time.monotonic() - sent < 10 * shutdown:
                time.sleep(0.1)
            _, record = only_record(tmp_path / "runs")
            assert record["status"] == "running" and record["ended_at"] is None
            assert processes_of_run(run_id) == [], "a rank outlived its SIGKILLed launcher"
            return
        gone_s = None  # when the ranks were gone, seen from here while the launcher still runs
        while proc.poll() is None and gone_s is None and time.monotonic() - sent < 60:
            if not any(_alive(r) for r in ranks):
                gone_s = time.monotonic() - sent
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=60)
        # SIGTERM (ignored), then SIGKILL once shutdown_timeout_s has passed; 3x that is headroom for load.
        assert gone_s is not None and gone_s < 3 * shutdown, f"the ranks outlived the teardown ({gone_s})"
        assert time.monotonic() - sent < 10 * shutdown + 30  # teardown, the record, the leaderboard
        assert proc.returncode == 1
        _, record = only_record(tmp_path / "runs")
        assert record["status"] == "aborted" and sig.name in record["reason"]
        assert "status     aborted" in out  # the summary is the result: stdout
        # The ranks were told to stop, said no, and were killed once the shutdown timeout had passed.
        assert "STUBBORN: SIGTERM received, ignored" in (run_dir / "logs" / last).read_text()
        assert shutdown <= record["timings"]["kill_latency_s"] < 3 * shutdown
        assert {r.pid for r in ranks} <= set(record["killed_pids"])
        assert_clean(record, tmp_path, cli)
    finally:  # never leave a broken harness's processes behind on a shared machine
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for p in processes_of_run(run_id) if run_id else []:
            p.kill()


OUTER_RANK_DIES_FIRST = """
import json, os, signal, time
import psutil
from harness.launcher.control.job_namespace import JobNamespace
from harness.launcher.control.process_tree import become_subreaper
from harness.ranks.confine.namespaces import join_job
assert become_subreaper()  # as the launcher is
ns = JobNamespace()
assert ns.active and not ns.pid_why, ns.why
r, w = os.pipe()
outer = os.fork()
if outer == 0:  # a rank: joins the job, forks once into its PID namespace and waits there for its child
    os.close(r)
    why, in_pid = join_job(ns.socket_path)
    os.write(w, f"{in_pid} {why}".encode())
    time.sleep(60)
    os._exit(0)
os.close(w)  # a child that failed before writing ends the read
said = os.read(r, 400).decode()
os.kill(outer, signal.SIGKILL)  # the teardown kills the rank's outer process before it reaped its child
os.waitpid(outer, 0)
ns_proc = ns.proc
ns.close()
left = [(c.pid, open(f"/proc/{c.pid}/wchan").read()) for c in psutil.Process().children(recursive=True)
        if c.status() != psutil.STATUS_ZOMBIE]
print(json.dumps({"in_pid_namespace": said, "left": left, "lost": ns.lost, "unended": ns.unended,
                  "holder": ns_proc.returncode}))
"""


def test_the_job_ends_whole_when_a_ranks_outer_process_dies_before_the_child_it_forked_into_the_namespace():
    """The launcher is a subreaper: a rank's child in the job's PID namespace, orphaned by its outer process (killed
    by the teardown first), is the launcher's to reap, and the namespace's PID 1 cannot finish dying until it is.
    Unreaped, the holder's wait ran out (10 s every time), and PID 1 was left sleeping in the kernel's
    zap_pid_ns_processes behind the launcher: a process of the job alive after the run (seen once in CI)."""
    out = subprocess.run([sys.executable, "-c", OUTER_RANK_DIES_FIRST], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["in_pid_namespace"].strip() == "True" and said["lost"] == "" and said["unended"] == ""
    assert said["holder"] == 0  # it ended as told, not killed at the bound
    assert said["left"] == []


def test_the_job_pid_namespace_ended_from_outside_is_the_infrastructures_failure(cache_dir, tmp_path):
    """PID 1 of the training job's PID namespace (harness/launcher/control/namespace_holder.py JobInit) killed from
    outside the job, as an administrator's kill or the node's out-of-memory killer would: the kernel ends every
    process of the job at once. The ranks could not have caused it (it is in no rank's reach): the run is `aborted`,
    the harness's error, re-run, never `crashed` against the team; and nothing of the job is left."""
    import psutil

    proc = _stubborn_run(cache_dir, tmp_path, one_rank(tmp_path), "--no-leaderboard")
    run_id = None
    try:
        _wait_until_training(tmp_path / "runs", "rank0.log")
        run_id = only_record(tmp_path / "runs")[1]["run_id"]
        found = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "harness.launcher.control.namespace_holder" in p.cmdline()]
        inits = [p for p in found if p.parent() in found]  # the holder's one child, a fork of it: PID 1 of the namespace
        assert len(found) == 2 and len(inits) == 1, found
        inits[0].kill()
        out, err = proc.communicate(timeout=120)
        _, record = only_record(tmp_path / "runs")
        assert record["status"] == "aborted", (record["status"], record["reason"])
        assert record["reason"].startswith("harness error: PID 1 of the job's PID namespace ended while the job ran"), \
            record["reason"]
        assert processes_of_run(run_id) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for p in processes_of_run(run_id) if run_id else []:
            p.kill()


def test_two_runs_at_once_on_the_same_tree(cache_dir, tmp_path, cli):
    """Both end ok, unflagged, in one consistent leaderboard. One rank each (a track copy, so the runs stay
    official): two 2-rank runs would put 4 ranks and 2 launchers on 2 cores, and the 0.5 s the clocks
    may disagree (tiny's budget) would measure the machine's load, not the harness."""
    import shutil

    other = tmp_path / "other_team"
    shutil.copytree(FIXTURES / "ok_bigram", other)
    track = one_rank(tmp_path)
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
    procs = [subprocess.Popen([sys.executable, "-m", "harness", "run", str(sub), "--track", str(track)],
                              env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for sub in (FIXTURES / "ok_bigram", other)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = run_dirs(tmp_path / "runs")
    assert len(dirs) == 2
    import json

    records = [json.loads((d / "run.json").read_text()) for d in dirs]
    assert {r["team"] for r in records} == {"ok_bigram", "other_team"}
    assert all(r["status"] == "ok" and not r["flagged"] for r in records), [r["flag_reason"] for r in records]
    assert not list((tmp_path / "runs").rglob(".run.json.*")), "a temporary file was left behind"
    rows = list(csv.DictReader((tmp_path / "leaderboard" / "tiny.csv").open()))
    assert sorted(r["team"] for r in rows) == ["ok_bigram", "other_team"] and all(r["rank"] for r in rows)
    for r in records:
        assert_clean(r)


@pytest.mark.parametrize("fixture, extra, reason", [
    ("nan_micro_batch", (), "loss became NaN or inf at step"),  # the first of two micro-batches
    ("nan_weights", ("--max-steps", "5"), "the weights hold NaN or inf values after the last step (5;"),
    ("nan_eval", (), "evaluation: the validation loss is nan"),
])
def test_non_finite_numbers_end_the_run_diverged_and_never_rank(cli, tmp_path, fixture, extra, reason):
    result = run_fixture(cli, fixture, *extra, track=quick_track(tmp_path))
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "diverged" and reason in record["reason"], record["reason"]
    assert record["val_loss"] is None
    if fixture != "nan_eval":
        assert not (run_dir / "checkpoint.pt").exists() and not (run_dir / "logs" / "eval-rank0.log").exists()
    assert_clean(record, tmp_path, cli)


@pytest.mark.parametrize("limit", ["allowance", "timeout"])
def test_work_before_the_clock_is_held_to_the_start_up_limits(cli, tmp_path, limit):
    """get_model "pretrains" for 45 s in the ranks: the track's start-up allowance (8 s here, from the
    process group being up) ends it; with a start-up timeout of 10 s from launch, that ends it first."""
    track = (one_rank(tmp_path, startup_allowance_s=8.0) if limit == "allowance"
             else one_rank(tmp_path, startup_timeout_s=10.0))
    result = cli("run", str(FIXTURES / "slow_get_model"), "--track", str(track))
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    t = record["track"]
    assert record["status"] == "timeout" and record["steps"] is None
    assert record["timings"]["kill_latency_s"] < t["shutdown_timeout_s"] + 2
    if limit == "allowance":
        assert "start-up took longer than the track's allowance" in record["reason"]
        assert record["timings"]["launch_to_setup_s"] + t["startup_allowance_s"] <= result.seconds
    else:
        assert "training did not start within 10 s of launch" in record["reason"], record["reason"]
        assert t["startup_timeout_s"] <= result.seconds
    assert_clean(record, tmp_path, cli)


def test_an_evaluation_past_its_timeout_is_killed(cli, tmp_path):
    """gated_eval's model holds every batch (up to 120 s); the track's evaluation timeout (5 s here) ends
    it: `timeout`, no figure, its scorer and model processes gone."""
    result = cli("run", str(FIXTURES / "gated_eval"), "--track", str(quick_track(tmp_path, eval__timeout_s=5.0)),
                 timeout=150)
    assert result.code == 1
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "timeout" and "evaluation: did not finish within 5 s" in record["reason"], record["reason"]
    assert record["val_loss"] is None and record["steps"] > 0
    assert 5.0 <= record["timings"]["eval_s"] < 5.0 + 3 * record["track"]["shutdown_timeout_s"] + 10
    assert_clean(record, tmp_path, cli)


def test_a_model_process_that_dies_in_evaluation_is_crashed_with_how_it_ended(cli, tmp_path):
    """dies_in_eval's model process segfaults on the first scoring batch: `crashed`, the reason says it
    was killed and by what (not an unknown exit code), its log shows the team's line, no figure,
    nothing left running."""
    result = run_fixture(cli, "dies_in_eval", track=quick_track(tmp_path))
    assert result.code == 1
    run_dir, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed", record["reason"]
    assert "evaluation: rank 0: the model process died (killed by SIGSEGV) without a report" in record["reason"], record["reason"]
    assert record["val_loss"] is None and record["steps"] == QUICK_STEPS
    log = (run_dir / "logs" / "eval-model-rank0.log").read_text()  # the team's line, not an empty log
    assert "Segmentation fault" in log and "submission.py\", line 22 in forward" in log, log
    assert_clean(record, tmp_path, cli)


def test_per_optimizer_schedules_and_gradient_clipping(cli, tmp_path):
    """lr_schedule returns one multiplier per optimizer (the second stays at 0: its parameter never
    moves), the harness clips the gradients to CONFIG['grad_clip'] and reports their norm; a schedule
    with the wrong number of multipliers is refused with the file and the fix."""
    import torch

    result = run_fixture(cli, "two_optimizers", track=one_rank(tmp_path))
    assert result.code == 0, result.err
    run_dir, record = only_record(tmp_path / "runs")
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    assert torch.count_nonzero(ckpt["model"]["bias"]) == 0, "the optimizer scheduled at 0 moved its parameter"
    assert record["config"]["grad_clip"] == 0.5
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    norms = [float(r["grad_norm"]) for r in rows if r["grad_norm"]]
    assert norms and all(n > 0 for n in norms)
    # The team's own schedule ran, not the default (whose warm-up and decay would move the first multiplier).
    assert len(rows) > 3 and all(float(r["lr_scale"]) == 1.0 for r in rows)

    (tmp_path / "bad-track").mkdir()
    broken = tmp_path / "two_optimizers"  # a copy with a BAD file beside it: a schedule of 3 multipliers
    shutil.copytree(FIXTURES / "two_optimizers", broken)
    (broken / "BAD").write_text("")
    bad = cli("run", str(broken), "--track", str(quick_track(tmp_path / "bad-track")), runs_dir=tmp_path / "bad")
    assert bad.code == 1
    _, record = only_record(tmp_path / "bad")
    assert record["status"] == "invalid" and "lr_schedule returned 3 multipliers for 2 optimizer(s)" in record["reason"]


def test_a_job_past_its_memory_cap_is_ended_by_the_kernel_and_never_the_launcher(cli, tmp_path):
    """A training rank that writes memory without end (attack or accident). A job's processes hold the track's
    `job_memory_gib` together, held by the kernel in cgroups of the job's own: the kernel ends the team's
    process, never the launcher, which writes the record: `crashed`, the reason naming the cap."""
    result = run_fixture(cli, "eats_memory", track=quick_track(tmp_path, job_memory_gib=1.5))
    assert result.code == 1, result.err
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "crashed" and "the job's memory reached its cap of 1.50 GiB" in record["reason"], \
        record["reason"]
    limits = record["containment"]["training"]["limits"]
    assert limits["refused"]["oom_kills"] >= 1 and limits["memory_max_bytes"] == 3 << 29, limits
    assert_clean(record, tmp_path, cli)


def test_a_fork_bomb_is_held_at_the_jobs_task_cap_and_ends_with_the_job(cli, tmp_path):
    """A training rank whose child forks without end, each copy in a new session. The track's `job_pids_max`
    holds the job's tasks (threads included) together: the kernel refuses the forks past it, the record counts
    them, and nothing of the bomb outlives the run."""
    run_fixture(cli, "forks_without_end", track=quick_track(tmp_path, job_pids_max=256))
    _, record = only_record(tmp_path / "runs")
    limits = record["containment"]["training"]["limits"]
    assert limits["pids_max"] == 256 and limits["refused"]["forks_refused"] >= 1, limits
    said = record["reason"] if record["status"] != "ok" else " ".join(record["notes"])
    assert "cap of 256 tasks" in said, (record["status"], said)
    assert_clean(record)


def test_a_check_past_its_memory_cap_is_the_teams_invalid_naming_the_cap(cli, tmp_path):
    """The same in get_model, so in the check before the run: its process holds the same cap, and the run is the
    team's `invalid` with the cap in its reason, before any rank starts."""
    folder = tmp_path / "team"
    shutil.copytree(FIXTURES / "eats_memory", folder)
    (folder / "where.txt").write_text("get_model")
    result = cli("run", str(folder), "--track", str(quick_track(tmp_path, job_memory_gib=1.5)))
    assert result.code == 1, result.err
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "invalid", record["reason"]
    assert ("the check process died (killed by SIGKILL) before reporting, at the job's cap: the job's memory reached "
            "its cap of 1.50 GiB") in record["reason"], record["reason"]
    assert record["containment"]["check"]["limits"]["refused"]["oom_kills"] >= 1
    assert_clean(record)


def test_an_out_of_memory_kill_from_a_limit_above_the_job_is_never_blamed_on_its_cap(cache_dir, tmp_path):
    """The same get_model, run by a launcher whose own cgroup holds 1.5 GiB (as a SLURM step or a container would)
    while the track lets a job hold 8: the kernel's kill comes from the limit above the job. The reason says so, and
    never that the job reached its cap."""
    from harness.launcher.control import job_limits

    memory = job_limits.v1_dirs().get("memory")
    assert memory is not None, "this test needs the v1 memory hierarchy this project's machines have"
    box = memory / f"test-above-the-job-{os.getpid()}"
    box.mkdir()
    try:
        (box / "memory.limit_in_bytes").write_text(str(3 << 29))
        folder = tmp_path / "team"
        shutil.copytree(FIXTURES / "eats_memory", folder)
        (folder / "where.txt").write_text("get_model")
        harness = Path(sys.executable).with_name("harness")
        track = quick_track(tmp_path, job_memory_gib=8.0)
        env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(tmp_path / "runs")}
        proc = subprocess.run(["sh", "-c", f'echo $$ > "{box}/cgroup.procs" && exec "$0" "$@"', str(harness), "run",
                               str(folder), "--track", str(track), "--no-leaderboard"],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
        _, record = only_record(tmp_path / "runs")
        assert record["status"] == "invalid", record["reason"]
        assert ("the check process died (killed by SIGKILL) before reporting, under a limit above the job's: the "
                "kernel's out-of-memory killer ended 1 of the job's processes while the job was below its own memory "
                "cap") in record["reason"], record["reason"]
        assert "reached its cap" not in record["reason"]
        assert record["containment"]["check"]["limits"]["refused"]["oom_kills"] == 0
        assert_clean(record)
    finally:
        for _ in range(100):  # the launcher and all it started have left it
            try:
                box.rmdir()
                break
            except OSError:
                time.sleep(0.1)
