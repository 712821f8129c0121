"""The stop rule: before each step, would that step end past the budget?

Each rank predicts the end of the next step from recent step times; the ranks then agree with one
all-reduce (in harness/ranks/loop.py), so no rank runs a step the others skip. A step's time is measured
between consecutive agreements, which are host-device sync points: on a GPU the host may be up to
a step ahead of the device, so the previous step is assumed to finish no sooner than one
estimated step after the last sync.

The first step is left out of the estimate: it carries one-time work (torch.compile compiles
there, tens of seconds on a GPU) that the next steps do not repeat, and counting it would stop
a run long before its budget. Until a second step has been timed, the step in flight stands
in for it (measured on the host: exact on a CPU, a lower bound on a GPU, so at worst that one
decision lets one step run over). Later slow steps (a recompilation) do count.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

CONTINUE = 0
STOP_BUDGET = 1
STOP_DIVERGED = 2


@dataclass
class StopRule:
    budget_s: float
    window: int = 5  # recent steps the estimate looks at; the max is taken, to err on the early side
    recent_s: deque = field(init=False)
    last_sync_s: float | None = field(init=False, default=None)
    first_step_s: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        self.recent_s = deque(maxlen=self.window)

    @property
    def step_estimate_s(self) -> float:
        return max(self.recent_s) if self.recent_s else 0.0

    def predicted_end_s(self, now_s: float) -> float:
        est = self.step_estimate_s
        if not self.recent_s and self.first_step_s is not None and self.last_sync_s is not None:
            est = max(0.0, now_s - self.last_sync_s)  # the second step, in flight: not the compile
        previous_done = now_s if self.last_sync_s is None else max(now_s, self.last_sync_s + est)
        return previous_done + est

    def decide(self, now_s: float) -> int:
        """This rank's vote for the coming step (times are seconds since the clock started)."""
        return STOP_BUDGET if self.predicted_end_s(now_s) > self.budget_s else CONTINUE

    def synced(self, now_s: float) -> None:
        """Record an agreement point; the time since the previous one is one step."""
        if self.last_sync_s is not None:
            if self.first_step_s is None:
                self.first_step_s = now_s - self.last_sync_s  # warm-up and compilation: kept apart
            else:
                self.recent_s.append(now_s - self.last_sync_s)
        self.last_sync_s = now_s
