"""The launcher's deadlines, as pure logic: which limit passes when, and what the reason says."""

import pytest

from harness.launcher.control.watch import Deadlines, WatchResult, _expired

D = Deadlines(startup_timeout_s=60, startup_allowance_s=20, hard_limit_s=7, save_allowance_s=20)


def state(setup=None, start=None, end=None) -> WatchResult:
    return WatchResult(setup_start_s=setup, train_start_s=start, train_end_s=end)


@pytest.mark.parametrize("r, now, expected", [
    (state(), 59.0, None),
    (state(), 61.0, "training did not start within 60 s of launch"),
    (state(setup=5.0), 24.0, None),
    (state(setup=5.0), 25.5, "start-up took longer than the track's allowance of 20 s"),
    (state(setup=5.0, start=10.0), 16.9, None),
    (state(setup=5.0, start=10.0), 17.5, "killed at the hard limit: 7.0 s (budget + grace) after training started"),
    # A report that training ended does not switch the clock off: the save allowance runs from it...
    (state(setup=5.0, start=10.0, end=11.0), 30.5, None),
    (state(setup=5.0, start=10.0, end=11.0), 31.5, "ranks still running 20 s (the save allowance)"),
    # ...and an end reported after the hard limit is late, however soon the watchdog looked.
    (state(setup=5.0, start=10.0, end=16.95), 17.2, None),
    (state(setup=5.0, start=10.0, end=17.05), 17.2, "killed at the hard limit"),
])
def test_the_first_deadline_that_passed_is_named(r, now, expected):
    found = _expired(r, D, launched=0.0, now=now)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[0].startswith(expected), found


def test_the_kill_latency_is_measured_from_when_the_limit_passed():
    reason, limit = _expired(state(setup=5.0, start=10.0), D, launched=0.0, now=30.0)
    assert limit == 17.0  # start + hard limit, not the moment the watchdog looked
    reason, limit = _expired(state(setup=5.0, start=10.0, end=12.0), D, launched=0.0, now=40.0)
    assert limit == pytest.approx(32.0)  # the end reported + the save allowance
    reason, limit = _expired(state(setup=5.0, start=10.0, end=16.95), D, launched=0.0, now=40.0)
    assert limit == pytest.approx(36.95)  # never later than start + hard limit + save allowance (37)


def test_jobs_without_a_training_window_have_one_total_limit():
    d = Deadlines(startup_timeout_s=30, total_s=30)
    assert _expired(state(), d, launched=0.0, now=29.0) is None
    assert _expired(state(), d, launched=0.0, now=31.0)[0] == "did not finish within 30 s"


def test_nonsense_deadlines_are_refused():
    with pytest.raises(ValueError):
        Deadlines(startup_timeout_s=10, save_allowance_s=0)


def test_an_open_division_script_is_killed_at_one_limit_no_report_moves():
    """Open division: ranks' start + allowance + budget + grace, whatever the script says (an early
    'training done' used to switch the hard limit off and grant the save allowance instead)."""
    from harness.launcher.control.watch import Deadlines, WatchResult, _expired

    d = Deadlines(startup_timeout_s=60.0, total_after_setup_s=27.0)
    r = WatchResult(setup_start_s=100.0, train_start_s=101.0, train_end_s=101.5)
    assert _expired(r, d, launched=99.0, now=126.9) is None
    reason, at = _expired(r, d, launched=99.0, now=127.1)
    assert at == 127.0 and "hard limit" in reason
    assert reason.endswith("(its rank 0 reported the end of training 25.5 s before and the job had not exited: a save "
                           "that did not finish, or a thread that never ends)")
    silent = WatchResult(setup_start_s=100.0)  # never said "first forward": a hang in its start-up?
    assert "reported neither a first forward nor progress" in _expired(silent, d, launched=99.0, now=127.1)[0]
    assert _expired(WatchResult(), d, launched=0.0, now=61.0)[0] == "the ranks did not start within 60 s of launch"


def test_a_silent_scripts_reason_says_hang_only_when_it_printed_nothing(tmp_path):
    """Real scripts rarely call the harness's API: one that trained 320 steps, printing, then overran was told
    it hung in start-up. The hint now follows what rank 0 printed (the harness's own lines aside)."""
    from harness.launcher.control.watch import NO_REPORT_HINT
    from harness.launcher.run.open_run import explain_silence

    reason = "killed at the hard limit: 27.0 s after the ranks started" + NO_REPORT_HINT
    log = tmp_path / "rank0.log"
    assert explain_silence(reason, log).endswith("and rank 0 printed nothing: a hang in start-up?)")  # no log at all
    log.write_text("[harness] sandbox on\n\n")
    assert explain_silence(reason, log).endswith("and rank 0 printed nothing: a hang in start-up?)")
    import os
    fifo = tmp_path / "fifo.log"
    os.mkfifo(fifo)  # a team's FIFO (or a link) where its log was: never waited on, never followed
    assert explain_silence(reason, fifo, 8).endswith("and rank 8 printed nothing: a hang in start-up?)")
    (tmp_path / "link.log").symlink_to(log)
    assert explain_silence(reason, tmp_path / "link.log").endswith("printed nothing: a hang in start-up?)")
    log.write_text("[harness] sandbox on\nstep 319 loss 3.2\nstep 320 loss 3.1\x1b[2J\n")
    said = explain_silence(reason, log)
    assert "hang" not in said and "rank 0 last printed 'step 320 loss 3.1" in said and "\x1b" not in said
    assert said.startswith("killed at the hard limit") and said.endswith("does it stop at --time_limit_min?)")
    assert explain_silence("crashed: boom", log) == "crashed: boom"  # other reasons untouched


def test_while_the_ranks_wait_for_the_check_no_start_up_deadline_runs():
    """The fixed loop's ranks start beside the check of their submission (harness/launcher/run/check_phase.py): the
    seconds the check takes are not the start-up's, and the deadlines count from its word."""
    from harness.launcher.control.gate import StartGate
    from harness.launcher.control.watch import counted_from

    assert counted_from(5.0) == 5.0  # no check beside the job: from the launch
    gate = StartGate()
    assert counted_from(5.0, gate) is None
    gate.stop("the check did not pass")
    assert counted_from(5.0, gate) is None, "a job told stop is ended by the watch, not timed out"
    gate = StartGate()
    gate.go()
    assert counted_from(5.0, gate) == gate.opened_s > 5.0
    assert counted_from(gate.opened_s + 100, gate) == gate.opened_s + 100, "never earlier than the launch"
