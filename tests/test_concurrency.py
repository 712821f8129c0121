"""Runs that overlap on one records tree: one evaluates while another trains, and both keep their figures."""

import pytest
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from conftest import FIXTURES, processes_of_run, quick_track, run_dirs

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _records(runs):
    return {json.loads((d / "run.json").read_text())["team"]: (d, json.loads((d / "run.json").read_text()))
            for d in run_dirs(runs)}


def _wait(predicate, what: str, timeout_s: float = 180.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_run_that_evaluates_while_another_trains_keeps_its_figure(cache_dir, tmp_path):
    """A holds in evaluation (its record says `evaluating`) until B's ranks train under B's guard; then A
    finishes and writes its final record while B is still training (B's rank waits in its first step until the
    test lets it go, spending no CPU). B's guard must neither restore A's earlier record nor flag B. Each on one
    rank: what is under test is two runs' records, not their ranks."""
    runs = tmp_path / "runs"
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(runs)}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()

    def start(sub, track, *extra):
        return subprocess.Popen([sys.executable, "-m", "harness", "run", str(sub), "--track", str(track), *extra],
                                env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    a = start(FIXTURES / "gated_eval", quick_track(tmp_path / "a"))

    def a_evaluates() -> bool:  # `evaluating`; before it existed, a record said `ok` with no val_loss here
        rec = _records(runs).get("gated_eval", (None, {}))[1]
        return rec.get("status") == "evaluating" or (rec.get("status") == "ok" and rec.get("val_loss") is None)

    _wait(a_evaluates, "A to evaluate")
    run_a = _records(runs)["gated_eval"][1]["run_id"]
    # B's budget is room for A to finish on a loaded machine: its 20 steps start when the test lets them.
    b = start(FIXTURES / "gated_train", quick_track(tmp_path / "b", budget_s=150.0))  # A's check starts after its scoring
    _wait(lambda: "training starts" in _read(_records(runs).get("gated_train", (tmp_path, {}))[0] / "logs" / "rank0.log"),
          "B to train")
    assert _model_processes(run_a), "A's model processes"

    def release_a() -> bool:
        """The scoring model process, then the check process started after it, wait at their gate: each
        is released once it runs the model (PID 1 of its own namespace, where a signal that arrives
        before the gate's handler is ignored, never fatal)."""
        for p in _model_processes(run_a):
            try:
                p.send_signal(signal.SIGUSR1)
            except psutil.Error:
                pass
        return _records(runs)["gated_eval"][1]["status"] == "ok"

    _wait(release_a, "A's final record", timeout_s=90)
    b_record_while_training = _records(runs)["gated_train"][1]
    assert b_record_while_training["status"] == "running", "A must have finished while B was still training"
    run_b = b_record_while_training["run_id"]

    def release_b() -> bool:
        for p in _training_processes(run_b):
            try:
                p.send_signal(signal.SIGUSR1)
            except psutil.Error:
                pass
        return _records(runs)["gated_train"][1]["status"] != "running"

    _wait(release_b, "B's final record", timeout_s=150)
    outs = [p.communicate(timeout=180) for p in (a, b)]
    assert [a.returncode, b.returncode] == [0, 0], outs
    records = _records(runs)
    rec_a, rec_b = records["gated_eval"][1], records["gated_train"][1]
    assert rec_a["status"] == "ok" and rec_a["val_loss"] is not None and rec_a["ended_at"]
    assert rec_b["status"] == "ok" and rec_b["val_loss"] is not None
    assert not rec_b["flagged"], rec_b["flag_reason"]  # B's guard took A's final record for no tampering
    # A's gate holds its first scoring batch until B trains: on a loaded machine longer than the slow-batch
    # bound (5 s), which is rightly flagged as work in evaluation; no other reason may flag A.
    assert not rec_a["flagged"] or rec_a["flag_reason"].startswith(
        "evaluation: the scoring model process took"), rec_a["flag_reason"]


def _read(path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _by_depth(run_id: str, *modules: str) -> list[tuple[int, psutil.Process]]:
    """The run's processes started as one of `modules`, each with the number of PID namespaces its pid is counted in."""
    from harness.launcher.control.process_tree import _pid_depth

    found = []
    for p in processes_of_run(run_id):
        if not any(m in " ".join(_cmdline(p)) for m in modules):
            continue
        try:
            found.append((_pid_depth(p.pid), p))
        except OSError:  # gone
            continue
    return found


def _model_processes(run_id: str) -> list:
    """Processes of the run that run a model: forks of the scorer's model-process template (or, where
    there is none, model_worker processes) inside their own PID namespace (counted in two; the template
    and the parent that only waits, in one)."""
    return [p for depth, p in _by_depth(run_id, "harness.ranks.models.model_template",
                                        "harness.ranks.models.model_worker") if depth == 2]


def _training_processes(run_id: str) -> list:
    """The run's training ranks that run the model: where a rank forked into the job's PID namespace, the child
    inside it (the deepest), never the parent outside, which only waits for it (SIGUSR1 would end it)."""
    ranks = _by_depth(run_id, "harness.ranks.training.train")
    deepest = max((depth for depth, _ in ranks), default=0)
    return [p for depth, p in ranks if depth == deepest]


def _cmdline(p) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []
