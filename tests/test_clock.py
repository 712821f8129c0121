import pytest

from harness.ranks.training.clock import CONTINUE, STOP_BUDGET, StopRule, schedule_progress


def cpu_run(rule: StopRule, step_s: list[float]) -> list[float]:
    """The training loop's order on a CPU, where the host runs each step itself: the first vote (before any
    step), then per step a vote for the step after it, the step, and the read of the vote (an agreement
    point at which the step has ended). Returns each step's end; step_s[k] is step k's duration (the last
    one repeats)."""
    t, ends = 0.0, []
    if rule.decide(t) != CONTINUE:
        return ends
    rule.synced(t)
    while True:
        vote = rule.decide(t)  # decides the step after this one
        t += step_s[min(len(ends), len(step_s) - 1)]
        ends.append(t)
        rule.synced(t)
        if vote != CONTINUE:
            return ends


def gpu_run(rule: StopRule, step_s: float, queue_s: float) -> list[float]:
    """The same loop on a GPU: queuing a step takes the host queue_s, the device runs it in step_s once it is
    queued and the previous one is done; the read of a vote waits for the device to finish the step queued
    before the vote (not the one just queued). Returns each step's end on the device."""
    t, device_free, ends = 0.0, 0.0, []
    if rule.decide(t) != CONTINUE:
        return ends
    rule.synced(t)
    while True:
        vote = rule.decide(t)
        t += queue_s
        device_free = max(device_free, t) + step_s
        ends.append(device_free)
        if len(ends) >= 2:  # the read: the device has finished the step before the one just queued
            t = max(t, ends[-2])
            rule.synced(t)
        if vote != CONTINUE:
            return ends


def test_first_step_runs_when_time_is_left():
    assert StopRule(10.0).decide(0.0) == CONTINUE


def test_no_step_starts_that_would_end_past_the_budget():
    """A vote is read a step late, so it decides the step after the next: the rule predicts that one's end.
    Every step of 1.5 s that fits a 10 s budget runs, and none past it."""
    ends = cpu_run(StopRule(10.0, device_ahead=False), [1.5])
    assert len(ends) == 6 and ends[-1] == pytest.approx(9.0)  # a 7th step would end at 10.5 s


@pytest.mark.parametrize("step_s, queue_s", [(1.5, 0.1), (0.7, 0.05), (0.3, 0.25), (1.0, 1.2)])
def test_on_a_gpu_the_late_read_never_lets_a_step_end_past_the_budget(step_s, queue_s):
    """The host runs up to a step ahead of the device and reads each vote a step late: the rule counts the
    step in flight, the step queued after the vote and the step the vote decides. No step ends past the
    budget, and at most two steps' worth of it is left unused. (A rule that predicted only the next step's
    end would let one more step run, ending past the budget.)"""
    budget = 10.0
    ends = gpu_run(StopRule(budget), step_s, queue_s)
    per_step = max(step_s, queue_s)
    assert ends[-1] <= budget, ends
    assert ends[-1] > budget - 2 * per_step - queue_s - 1e-9, ends


def test_estimate_uses_the_slowest_recent_step():
    rule = StopRule(100.0, window=3)
    for t in (0.0, 1.0, 2.0, 6.0, 7.0):
        rule.synced(t)
    assert rule.step_estimate_s == 4.0
    for t in (8.0, 9.0, 10.0):
        rule.synced(t)
    assert rule.step_estimate_s == 1.0


def test_a_slow_first_step_does_not_stop_the_run_early():
    """The first step compiles (17 s of a 25 s budget), the others take 10 ms: the run goes on to the budget."""
    rule = StopRule(25.0, device_ahead=False)
    ends = cpu_run(rule, [17.0, 0.01])
    assert rule.first_step_s == 17.0 and rule.step_estimate_s == pytest.approx(0.01)
    assert 24.98 <= ends[-1] <= 25.0 and len(ends) > 700


def test_host_ahead_of_device_is_accounted_for():
    # On a GPU the host returns before the device finishes: the step queued before the last agreement point
    # is assumed to end no sooner than one estimate after it; then the step queued after the vote, then the
    # step the vote decides.
    rule = StopRule(8.5)
    rule.synced(0.0)
    rule.synced(1.0)  # the first (warm-up) step
    rule.synced(3.0)  # one step of 2 s; the host has just queued the next one
    assert rule.predicted_end_s(3.1) == pytest.approx(9.0)  # not 5.1, nor 7.0: three steps still to end
    assert rule.decide(3.1) == STOP_BUDGET
    on_cpu = StopRule(8.5, device_ahead=False)
    for t in (0.0, 1.0, 3.0):
        on_cpu.synced(t)
    assert on_cpu.predicted_end_s(3.1) == pytest.approx(7.1)  # the host has run everything it queued
    assert on_cpu.decide(3.1) == CONTINUE
    assert StopRule(6.5).decide(0.0) == CONTINUE


@pytest.mark.parametrize("kwargs", [{"budget_s": 0}, {"budget_s": 1, "window": 0}, {"budget_s": 1, "lag_steps": -1}])
def test_bad_configuration_is_refused(kwargs):
    with pytest.raises(ValueError):
        StopRule(**kwargs)



def test_the_schedules_clock_starts_when_the_first_step_has_ended():
    """The lr schedule's progress is the share of the budget after the first step (which compiles): 0 until the
    ranks agree the first step ended, then from 0 at that moment to 1 at the budget."""
    assert schedule_progress(40.0, None, 600.0) == 0.0  # before the first step's end is agreed
    assert schedule_progress(40.0, 40.0, 600.0) == 0.0
    assert schedule_progress(40.0 + 0.02 * 560.0, 40.0, 600.0) == pytest.approx(0.02)
    assert schedule_progress(600.0, 40.0, 600.0) == 1.0 and schedule_progress(700.0, 40.0, 600.0) == 1.0
    assert schedule_progress(650.0, 650.0, 600.0) == 1.0  # a first step longer than the budget: nothing left

# ------------------------------------------------------------------ the real loop, on a clock the test drives
# Each rank runs harness.ranks.training.loop.train in its own process (real gloo), with the loop's clock replaced by one
# that moves only when a step runs: the first step "compiles" for FIRST_S, each later step takes this rank's
# STEP_S. Bounded by steps, whatever the machine's speed; the budget is in these fake seconds.
FAKE_CLOCK = r"""
import json, os, sys, tempfile
import numpy as np
from harness.data.shards import inspect_shard, write_shard
from harness.ranks.training import loop
from harness.ranks.channel import ChannelClient
from harness.ranks.jobs import TrainJob
from harness.ranks.process import RankEnv, release_and_exit

rank, world, port, budget, first_s, step_s = (int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]),
                                              float(sys.argv[6]), float(sys.argv[7]))
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE=str(world),
                  LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
clock = {"t": 0.0}
lr = []
real_step = loop.train_step


def fake_step(tr, step, progress):
    real_step(tr, step, progress)
    lr.append(tr.lr_scale)
    clock["t"] += first_s if step == 0 else step_s


loop.perf_counter = lambda: clock["t"]
loop.train_step = fake_step
folder = tempfile.mkdtemp()
write_shard(f"{folder}/train.bin", np.random.default_rng(0).integers(0, 256, 200_000), "raw_uint16")
job = TrainJob(run_id="t", track="t", submission_dir=sys.argv[1], seed=1, budget_s=budget, clock_start="first_forward",
               backend="gloo", device="cpu", dtype="float32", log_interval_s=1e9, collective_timeout_s=60.0,
               cpu_threads_per_rank=1, vocab_size=256, train_shards=[inspect_shard(f"{folder}/train.bin")],
               comm_probe_steps=0, staging_dir=folder)
holders = []
result = loop.train(job, RankEnv.from_environ(), ChannelClient(None, rank), holders)
print(json.dumps({"rank": rank, "steps": result["steps"], "train_time_s": result["train_time_s"], "lr": lr,
                  "weights": result["weights_sha256"]}), flush=True)
release_and_exit(0, holders)
"""


def fake_clock_run(budget_s: float, first_s: float, step_s: list[float]) -> list[dict]:
    """One gloo rank per entry of step_s, each with its own step time; returns what each rank trained."""
    import json
    import socket
    import subprocess
    import sys

    from conftest import FIXTURES, ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", FAKE_CLOCK, str(FIXTURES / "ok_bigram"), str(rank),
                               str(len(step_s)), str(port), str(budget_s), str(first_s), str(t)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for rank, t in enumerate(step_s)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


@pytest.mark.slow
def test_ranks_with_different_clocks_stop_at_the_same_step_within_the_budget():
    """Two gloo ranks, one slower (1.5 s a step against 1.0), votes read a step late: both stop after the same
    step, the slower one's last step ends within the 30 s budget and not two steps short of it, and the
    replicas are identical (every rank set the same lr at every step)."""
    ranks = fake_clock_run(30.0, 5.0, [1.0, 1.5])
    assert ranks[0]["steps"] == ranks[1]["steps"] == 17, ranks  # 5 + 16 x 1.5 = 29 s; one more would end at 30.5
    assert ranks[1]["train_time_s"] == pytest.approx(29.0)
    assert ranks[0]["lr"] == ranks[1]["lr"] and ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.slow
def test_warm_up_is_not_spent_on_the_first_steps_compilation():
    """The first step takes 30 of a 100 s budget (torch.compile's share of a short track), then 0.5 s steps:
    the default schedule still warms up over the steps after it (2% of the 70 s left: about three steps),
    reaches the full lr, and decays to about zero at the budget. Counted from the clock's start, step 1
    would already run at the full lr (progress 0.3, past the 2% warm-up). The budget's clock is unchanged:
    the run still ends within 100 s."""
    (rank,) = fake_clock_run(100.0, 30.0, [0.5])
    lr = rank["lr"]
    assert lr[0] == lr[1] == lr[2] == pytest.approx(0.01), lr[:6]  # before the schedule's clock starts, and at it
    assert lr[3] < 1.0 and lr[4] < 1.0 and max(lr) == pytest.approx(1.0), lr[:8]
    assert lr[-1] < 0.1 and 99.0 <= rank["train_time_s"] <= 100.0, (lr[-3:], rank["train_time_s"])
