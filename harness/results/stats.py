"""The statistics behind rankings and comparisons: means with t intervals, Welch's t-test.

Every estimate comes with its spread. With fewer than two values on a side, no interval and no
p-value are given (None): nothing significant can be claimed from one run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import stats as sps

ALPHA = 0.05


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
    return Summary(n, mean, std, float(sps.t.ppf(1 - ALPHA / 2, n - 1)) * std / math.sqrt(n))


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
    p = 2.0 * float(sps.t.sf(abs(t), dof))
    return Comparison(diff, float(sps.t.ppf(1 - ALPHA / 2, dof)) * se, p)
