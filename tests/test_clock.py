import pytest

from harness.ranks.clock import CONTINUE, STOP_BUDGET, StopRule


def test_first_step_runs_when_time_is_left():
    assert StopRule(10.0).decide(0.0) == CONTINUE


def test_no_step_starts_that_would_end_past_the_budget():
    rule = StopRule(10.0)
    t, steps = 0.0, 0
    while True:  # the training loop's order: vote, agree (a sync point), then run the step
        if rule.decide(t) != CONTINUE:
            break
        rule.synced(t)
        t += 1.5  # every step takes 1.5 s
        steps += 1
    assert steps == 6 and t == pytest.approx(9.0)  # a 7th step would end at 10.5 s


def test_estimate_uses_the_slowest_recent_step():
    rule = StopRule(100.0, window=3)
    for t in (0.0, 1.0, 2.0, 6.0, 7.0):
        rule.synced(t)
    assert rule.step_estimate_s == 4.0
    for t in (8.0, 9.0, 10.0):
        rule.synced(t)
    assert rule.step_estimate_s == 1.0


def test_a_slow_first_step_does_not_stop_the_run_early():
    rule = StopRule(25.0)
    t = 0.0
    rule.synced(t)
    t += 17.0  # the first step compiles: 17 s
    steps = 1
    while rule.decide(t) == CONTINUE:  # then steps of 10 ms
        rule.synced(t)
        t += 0.01
        steps += 1
    assert rule.first_step_s == 17.0 and rule.step_estimate_s == pytest.approx(0.01)
    assert 24.98 <= t <= 25.0 and steps > 700


def test_host_ahead_of_device_is_accounted_for():
    # On a GPU the host returns before the device finishes: the previous step is assumed to end
    # no sooner than one estimate after the last sync.
    rule = StopRule(6.5)
    rule.synced(0.0)
    rule.synced(1.0)  # the first (warm-up) step
    rule.synced(3.0)  # one step of 2 s; the host has just queued the next one
    assert rule.predicted_end_s(3.1) == pytest.approx(7.0)  # not 5.1: the queued step still runs
    assert rule.decide(3.1) == STOP_BUDGET
    assert StopRule(6.5).decide(0.0) == CONTINUE


@pytest.mark.parametrize("kwargs", [{"budget_s": 0}, {"budget_s": 1, "window": 0}])
def test_bad_configuration_is_refused(kwargs):
    with pytest.raises(ValueError):
        StopRule(**kwargs)
