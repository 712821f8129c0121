"""The stop rule (before each step, would the step it decides end past the budget?) and the lr schedule's clock.

The ranks vote once a step with one all-reduce (harness/ranks/training/agree.py), so no rank runs a step the
others skip. The vote is read one step late, so that the host never waits on the device inside the loop:
each rank casts its vote before a step is queued and reads the agreement after that step is queued, so the
vote decides the step after the next one. The rule adds that step of margin: a rank votes to stop when the
end of the step after the next, predicted from recent step times, would be past the budget.

Step times are measured between the agreement points at which the device has finished a step: on a CPU
the step the host has just run, on a GPU the one before it (the host runs up to a step ahead; the
agreement it reads was queued before the step it has just queued). So on a GPU the step queued before
the last agreement is still assumed to be in flight, ending no sooner than one estimated step after it.

The first step is left out of the estimate: it carries one-time work (torch.compile compiles there, tens
of seconds on a GPU) that the next steps do not repeat, and counting it would stop a run long before its
budget. Until a second step has been timed the estimate is zero: the first steps after it are approved
blind (two on a CPU, three on a GPU), which only matters when the budget ends within them. Later slow
steps (a recompilation) do count.

The lr schedule runs on a clock of its own (`schedule_progress`): the fraction of the budget left after the
first step, so a compiled model's warm-up is not spent compiling. The budget's clock is unchanged.
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
    lag_steps: int = 1  # steps queued between a vote and the step it decides (the vote is read a step late)
    device_ahead: bool = True  # the device may still be running the last queued step (a GPU); False on a CPU
    recent_s: deque = field(init=False)
    last_sync_s: float | None = field(init=False, default=None)
    first_step_s: float | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {self.budget_s}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.lag_steps < 0:
            raise ValueError(f"lag_steps must be >= 0, got {self.lag_steps}")
        self.recent_s = deque(maxlen=self.window)

    @property
    def step_estimate_s(self) -> float:
        return max(self.recent_s) if self.recent_s else 0.0

    def predicted_end_s(self, now_s: float) -> float:
        """When the step this vote decides would end: after the step in flight (on a GPU), the lag_steps
        queued before it, and itself."""
        est = self.step_estimate_s
        in_flight_done = now_s
        if self.device_ahead and self.last_sync_s is not None:
            in_flight_done = max(now_s, self.last_sync_s + est)
        return in_flight_done + (self.lag_steps + 1) * est

    def decide(self, now_s: float) -> int:
        """This rank's vote for the step it decides (times are seconds since the clock started)."""
        return STOP_BUDGET if self.predicted_end_s(now_s) > self.budget_s else CONTINUE

    def synced(self, now_s: float) -> None:
        """Record an agreement point at which the device has finished a step: the clock's start, then the end
        of each step in turn; the time since the previous one is one step."""
        if self.last_sync_s is not None:
            if self.first_step_s is None:
                self.first_step_s = now_s - self.last_sync_s  # warm-up and compilation: kept apart
            else:
                self.recent_s.append(now_s - self.last_sync_s)
        self.last_sync_s = now_s


def schedule_progress(agreed_s: float, start_s: float | None, budget_s: float) -> float:
    """The lr schedule's `progress` in [0, 1]: the share of the budget after the first step that has passed.

    `start_s` is when the ranks agree the first step ended (None until then: progress 0). The first step
    carries torch.compile's compilation (12-45 s on a GPU): counted, a 2% warm-up of a 600 s budget would be
    spent compiling and step 1 would run at the full lr. The schedule still ends exactly at the budget."""
    if start_s is None:
        return 0.0
    left = budget_s - start_s
    if left <= 0:
        return 1.0
    return min(1.0, max(0.0, (agreed_s - start_s) / left))
