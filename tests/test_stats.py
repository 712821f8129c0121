"""The intervals and tests behind rankings and `harness compare`, checked against scipy.stats' own."""

import math

import pytest
from scipy import stats as ref

import harness.results.stats as stats
from harness.results.stats import summarize, t_quantile, t_sf, welch


@pytest.mark.parametrize("dof", [1, 2, 3.4, 7, 29.75, 500])
def test_t_quantile_and_tail_match_scipy_stats(dof):
    for q in (0.5, 0.9, 0.975, 0.999):
        assert t_quantile(q, dof) == pytest.approx(ref.t.ppf(q, dof), rel=1e-12)
    for x in (-2.5, 0.0, 0.7, 4.1):
        assert t_sf(x, dof) == pytest.approx(ref.t.sf(x, dof), rel=1e-12, abs=1e-300)


def test_the_interval_of_a_mean_is_students():
    values = [2.61, 2.58, 2.66, 2.60]
    s = summarize(values)
    low, high = ref.t.interval(0.95, len(values) - 1, loc=ref.tmean(values), scale=ref.sem(values))
    assert (s.low, s.high) == (pytest.approx(low, rel=1e-12), pytest.approx(high, rel=1e-12))
    assert summarize([2.6]).ci95 is None


def test_welch_gives_scipys_p_value_and_interval():
    a, b = [2.61, 2.58, 2.66, 2.60], [2.70, 2.69, 2.75]
    c = welch(a, b)
    expected = ref.ttest_ind(a, b, equal_var=False)
    assert c.p_value == pytest.approx(expected.pvalue, rel=1e-10)
    interval = expected.confidence_interval(0.95)
    assert c.diff - c.ci95 == pytest.approx(interval.low, rel=1e-10)
    assert c.diff + c.ci95 == pytest.approx(interval.high, rel=1e-10)
    assert c.significant is bool(expected.pvalue < 0.05)
    assert welch([2.6], b).p_value is None and math.isclose(welch([2.6], b).diff, 2.6 - sum(b) / 3)


def _t_test_power(n: int, std_over_diff: float) -> float:
    """The exact power of a two-sided t-test at 0.05 with n runs a side (the noncentral t), as a check."""
    dof, shift = 2 * n - 2, math.sqrt(n / 2) / std_over_diff
    critical = ref.t.ppf(0.975, dof)
    return float(ref.nct.sf(critical, dof, shift) + ref.nct.cdf(-critical, dof, shift))


@pytest.mark.parametrize("std_over_diff", [0.3, 0.5, 1.0, 2.0, 5.0])
def test_runs_needed_is_the_fewest_runs_with_80_percent_power(std_over_diff):
    """The count `harness compare` asks for: with it, the exact power of the t-test is about 0.8; one fewer
    run a side falls short of 0.8."""
    n = stats.runs_needed(std_over_diff * 0.01, 0.01, most=10_000)  # the ceiling is the next test's
    assert _t_test_power(n, std_over_diff) >= 0.79
    assert n == 2 or _t_test_power(n - 1, std_over_diff) < 0.801
    assert stats.runs_needed(0.1, 0.0) is None  # equal means: no number of runs separates them


def test_runs_needed_stops_at_a_ceiling():
    """As the difference nears 0 the count grows as (std / diff)^2 without bound (`harness compare` once asked
    for "about 125582075045244 a side"): past RUNS_NEEDED_MAX a side no count is given (None), and a count up to
    it is given exactly."""
    assert stats.RUNS_NEEDED_MAX == 100
    assert stats.runs_needed(0.1, 1e-8) is None
    assert stats.runs_needed(0.05, 0.01) is None and stats.runs_needed(0.05, 0.01, most=10_000) > 100
    assert stats.runs_needed(0.02, 0.01) == stats.runs_needed(0.02, 0.01, most=10_000) <= 100


def test_an_interval_never_reaches_below_the_loss_floor():
    """The board's interval at n = 2 was a t interval (t = 12.7): 2.70 ± 2.29 reached 0.41 against a floor of
    1.64. From 2 runs it is their range; from 3, the 95% t interval, its low end cut at the floor where it reached
    below (and said so); from one run, none."""
    assert stats.loss_interval([2.6]) is None
    two = stats.loss_interval([2.52, 2.88], floor=1.64)
    assert (two.low, two.high, two.kind) == (2.52, 2.88, "range") and two.text() == "2.5200–2.8800 (min–max)"
    near = [1.70, 2.30, 1.75]  # mean 1.9167, t half-width 0.8278: the t interval reaches 1.09
    s = summarize(near)
    assert s.mean - s.ci95 < 1.64
    cut = stats.loss_interval(near, floor=1.64)
    assert (cut.low, cut.kind) == (1.64, "t95_floor") and cut.high == pytest.approx(s.mean + s.ci95, rel=1e-12)
    assert cut.text() == f"1.6400–{s.mean + s.ci95:.4f} (cut at floor)"
    far = stats.loss_interval([2.61, 2.58, 2.66, 2.60], floor=1.64)  # the interval of test_the_interval_of_a_mean
    assert far.kind == "t95" and (far.low, far.high) == (summarize([2.61, 2.58, 2.66, 2.60]).low,
                                                         summarize([2.61, 2.58, 2.66, 2.60]).high)
    below = stats.loss_interval([1.62, 1.70], floor=1.64)  # a run measured below the floor by chance
    assert (below.low, below.high, below.kind) == (1.64, 1.70, "range_floor")
    for values in ([2.52, 2.88], near, [1.0, 5.0, 9.0]):
        assert stats.loss_interval(values, floor=1.64).low >= 1.64
    # Every run below the floor: the interval goes no lower than their mean (test_an_interval_cut_at_the_floor_...)
    assert stats.loss_interval([1.6, 1.61], floor=1.64).low == pytest.approx(1.605)


def test_the_repeat_summary_shows_the_boards_interval_never_below_the_floor():
    """`harness run --repeat 2` once printed a t half-width at 2 runs (t = 12.7), reaching a nat below the floor."""
    from harness.launcher.run.console import repeat_summary
    from harness.results.records import RunRecord

    def run(seed, loss):
        return RunRecord(run_id=str(seed), team="t", track_name="local", seed=seed, status="ok", val_loss=loss,
                         loss_floor=1.64)

    (line,) = repeat_summary([run(1, 1.70), run(2, 2.90)])
    assert "val_loss mean 2.3000, 1.7000–2.9000 (min–max)" in line and "±" not in line
    (line,) = repeat_summary([run(1, 1.65), run(2, 1.66), run(3, 2.90)])
    assert "1.6400–" in line and "(cut at floor)" in line
    (line,) = repeat_summary([run(1, 2.0)])
    assert line.endswith("1 ok, val_loss mean 2.0000")


def test_an_interval_cut_at_the_floor_still_holds_its_mean():
    """Two runs that both measured just below the floor (finite tokens near it): the interval once became
    1.5500-1.5500 beside a mean of 1.51."""
    from harness.results.stats import loss_interval

    interval = loss_interval([1.50, 1.52], floor=1.55)
    assert interval.low <= 1.51 <= interval.high and interval.kind == "range_floor"
    assert loss_interval([1.50, 1.52, 1.56], floor=1.55).low <= (1.50 + 1.52 + 1.56) / 3
