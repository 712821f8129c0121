"""The statistics behind rankings and comparisons: means with t intervals, Welch's t-test, and the interval a
board shows beside a mean loss (loss_interval: the runs' range from 2 runs, never below the loss floor).

Every estimate comes with its spread. With fewer than two values on a side, no interval and no
p-value are given (None): nothing significant can be claimed from one run.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

ALPHA = 0.05


def t_quantile(q: float, dof: float) -> float:
    """The q-quantile of Student's t with `dof` degrees of freedom (dof may be fractional, as Welch's is).
    scipy.special's function, imported when first needed: scipy.stats, which wraps the same function,
    costs about 2 s to import on a small CPU, paid by every `harness run` that refreshes a leaderboard."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, q))


def prepare() -> None:
    """Imports what the t functions use (0.2 s of a cold board's rebuild), at a moment the caller chooses: while a
    fork of a board's process parses records (leaderboard.load_rows)."""
    import scipy.special  # noqa: F401


def t_sf(x: float, dof: float) -> float:
    """P(T > x) for Student's t with `dof` degrees of freedom."""
    from scipy.special import stdtr

    return float(stdtr(dof, -x))


def is_finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def finite_first(value) -> tuple[bool, float]:
    """A sort key that puts missing and non-finite figures last: NaN compares false with everything,
    so a plain sort would leave it anywhere and order the others around it arbitrarily."""
    return (False, float(value)) if is_finite(value) else (True, 0.0)


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    std: float | None  # sample standard deviation (ddof=1); None for one value
    ci95: float | None  # half-width of the 95% t interval of the mean

    @property
    def low(self) -> float | None:
        return None if self.ci95 is None else self.mean - self.ci95

    @property
    def high(self) -> float | None:
        return None if self.ci95 is None else self.mean + self.ci95


def summarize(values: list[float]) -> Summary:
    if not values:
        raise ValueError("no values to summarize")
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2:
        return Summary(n, mean, None, None)
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return Summary(n, mean, std, t_quantile(1 - ALPHA / 2, n - 1) * std / math.sqrt(n))


# Fewer runs than this: the interval shown is the runs' own range, not a t interval. At 2 runs the t interval has
# one degree of freedom (t = 12.7): its half-width is 9 times the gap between the runs, and it reached 1.2 nats
# below a loss floor that no model beats in expectation. At 3, t = 4.3 and the interval is the usual one.
T_INTERVAL_MIN_RUNS = 3
# What an interval is: its kind, as the CSV writes it, and the mark the tables, the page and the charts add.
INTERVAL_KINDS = {"t95": "", "t95_floor": " (cut at floor)", "range": " (min–max)",
                  "range_floor": " (min–max, cut at floor)"}


@dataclass(frozen=True)
class Interval:
    """The interval shown beside a mean val_loss (never a ranking statistic: ties are Welch's, on the runs).
    kind: "t95", the 95% t interval of the mean; "range", the lowest and highest run (fewer than
    T_INTERVAL_MIN_RUNS runs); with "_floor", its low end was raised to the loss floor it reached below."""
    low: float
    high: float
    kind: str

    def text(self) -> str:
        return interval_text(self.low, self.high, self.kind)


def interval_text(low: float, high: float, kind: str) -> str:
    """'1.9700–2.0700', '2.0000–2.0100 (min–max)', '1.6400–2.9000 (cut at floor)': one way everywhere."""
    return f"{low:.4f}–{high:.4f}{INTERVAL_KINDS.get(kind, f' ({kind})')}"


def loss_interval(values: list[float], floor: float | None = None) -> Interval | None:
    """The interval of a mean loss that claims no loss below `floor` (the data's own loss: nothing beats it in
    expectation). None from one run; the runs' range from fewer than T_INTERVAL_MIN_RUNS; else the 95% t interval,
    its low end cut at the floor where it reached below (the kind says so)."""
    if len(values) < 2:
        return None
    if len(values) < T_INTERVAL_MIN_RUNS:
        low, high, kind = min(values), max(values), "range"
    else:
        s = summarize(values)
        low, high, kind = s.mean - s.ci95, s.mean + s.ci95, "t95"
    if is_finite(floor) and low < floor:
        # A run can measure below the floor by chance on finite tokens; the interval still claims nothing there.
        # ...and never past the mean it is the interval of: runs that all measured below the floor (near it, on
        # finite tokens) keep their mean inside, the low end at the lowest value that mean claims.
        low = min(floor, sum(values) / len(values))
        low, high, kind = low, max(high, low), kind + "_floor"
    return Interval(low, high, kind)


@dataclass(frozen=True)
class Comparison:
    diff: float  # mean(a) - mean(b)
    ci95: float | None  # half-width of the Welch interval of the difference
    p_value: float | None  # two-sided Welch t-test
    note: str = ""

    @property
    def significant(self) -> bool | None:
        return None if self.p_value is None else self.p_value < ALPHA


def welch(a: list[float], b: list[float]) -> Comparison:
    """Welch's t-test and interval for mean(a) - mean(b); None where one side has < 2 runs."""
    sa, sb = summarize(a), summarize(b)
    diff = sa.mean - sb.mean
    if sa.n < 2 or sb.n < 2:
        return Comparison(diff, None, None, "one run on a side: no significance can be claimed")
    va, vb = sa.std**2 / sa.n, sb.std**2 / sb.n
    se = math.sqrt(va + vb)
    if se == 0.0:  # identical constant samples: the difference is exact
        return Comparison(diff, 0.0, 1.0 if diff == 0 else 0.0, "no variance on either side")
    dof = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    t = diff / se
    p = 2.0 * t_sf(abs(t), dof)
    return Comparison(diff, t_quantile(1 - ALPHA / 2, dof) * se, p)


POWER = 0.8  # the usual planning figure: a real difference found four times in five
# Past this many runs a side no count is promised: the count grows as (std / diff)^2 without bound as the
# difference nears 0, and a difference that needs more is, for a team comparing two versions, noise.
RUNS_NEEDED_MAX = 100


def runs_needed(std: float, diff: float, power: float = POWER, most: int = RUNS_NEEDED_MAX) -> int | None:
    """About how many runs a side a two-sided t-test at ALPHA needs to find a true difference `diff` with
    probability `power`, when single runs spread with standard deviation `std` on both sides: the smallest n
    with n >= 2 (t_(1-ALPHA/2) + t_power)^2 (std / diff)^2, t at the 2(n - 1) degrees of freedom of n runs a side
    (the textbook iteration on the normal approximation, which would promise too few runs when they are few).
    None when more than `most` would be needed, or diff is 0 (no number of runs separates equal means)."""
    if diff == 0:
        return None
    ratio_sq = (std / diff) ** 2

    def enough(n: int) -> bool:
        dof = 2 * (n - 1)
        return n >= 2 * (t_quantile(1 - ALPHA / 2, dof) + t_quantile(power, dof)) ** 2 * ratio_sq

    # The normal quantiles (t's limit) give a lower bound; from there, step up to the first n that is enough.
    z = t_quantile(1 - ALPHA / 2, math.inf) + t_quantile(power, math.inf)
    n = max(2, math.ceil(2 * z**2 * ratio_sq))
    while n <= most and not enough(n):
        n += 1
    return n if n <= most else None


def best_permutation(a: list[float], b: list[float], max_exact: int = 20_000, draws: int = 20_000) -> Comparison:
    """Is min(a) really below min(b)? A two-sided permutation test on the difference of the minima.

    Under the null hypothesis the runs of both sides come from one distribution, so every split of
    the pooled runs into groups of the two sizes is as likely as the observed one; p is the share
    of splits whose gap between the minima is at least the observed one. Exact (every split) when
    there are at most `max_exact` splits, else `draws` random splits with a fixed seed. With fewer
    than 2 runs on a side no test is made. Small samples cannot be significant: 3 runs against 3
    give p >= 0.1, 4 against 4 p >= 0.029.
    """
    diff = min(a) - min(b)
    if len(a) < 2 or len(b) < 2:
        return Comparison(diff, None, None, "one run on a side: no significance can be claimed")
    pooled = list(a) + list(b)
    n, k = len(pooled), len(a)
    observed = abs(diff) * (1 - 1e-12)  # float noise must not turn a tie at the observed gap into a miss

    def gap(idx: tuple[int, ...]) -> float:
        chosen = set(idx)
        return abs(min(pooled[i] for i in chosen) - min(pooled[i] for i in range(n) if i not in chosen))

    if math.comb(n, k) <= max_exact:
        splits = list(itertools.combinations(range(n), k))
    else:
        rng = random.Random(0)
        splits = [tuple(rng.sample(range(n), k)) for _ in range(draws)]
    extreme = sum(1 for s in splits if gap(s) >= observed)
    return Comparison(diff, None, extreme / len(splits), "permutation test on the best runs")
