"""The fixed DDP training loop of one rank. The harness owns all of it; the submission supplies
the model, and optionally its optimizers and its lr schedule. The process around it (start-up,
reports, failures, exit) is harness/ranks/training/train.py.

Three parts, read top to bottom:
- `build_training`: everything before the clock (device, process group, a check that every node
  runs the same submission on the same data, submission, model, DDP, optimizers, data stream),
  and the device-side buffers the loop reuses;
- per step, in `train`: the ranks' vote (harness/ranks/training/agree.py: one tiny all-reduce, launched before
  the step is queued and read after it, the loop's one read of the device: whether to run the step
  after the next, by the budget or a non-finite loss in any micro-batch of any rank; the agreed time
  that drives every rank's lr schedule alike; the train loss of all ranks), and between the launch
  and the read `train_step`: grad_accum_steps micro-steps (no_sync on all but the last) under the
  run's precision, optimizer steps, grads zeroed with set_to_none. The host never waits for the step
  it has just queued: on a GPU the device always has work while the host prepares the next step;
- `finish` (harness/ranks/training/after_clock.py): after the clock, the weights as they were at the last
  agreement point copied by harness code (never the team's state_dict or hooks), checked for NaN, the
  checkpoint (the launcher takes it the moment rank 0 says it is saved), whether the weights changed
  after the clock, a digest of the weights (replicas must agree), the communication probe.

Two figures are noted for the launcher's checks: the first micro-batch of every rank, before any
optimizer step, scored by harness code as it is and under eight random relabellings of its
vocabulary (harness/ranks/training/first_step.py: an untrained model scores them alike; one that arrives
trained knows which token is which and loses nats), and the step times (the bound on how far past the budget an
honest last step can end).
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from harness.data.stream import Prefetcher, TokenStream, split_inputs_targets
from harness.ranks.training import ddp as ddp_setup
from harness.ranks.training.after_clock import Diverged, finish
from harness.ranks.training.agree import Agreed, Agreement
from harness.ranks.checkpoint import unwrap
from harness.ranks.training.clock import CONTINUE, STOP_BUDGET, STOP_DIVERGED, StopRule, schedule_progress
from harness.ranks.training.first_step import relabel_probe
from harness.ranks.process import (MEET_WITHIN_S, Rendezvous, RankEnv, init_process_group, perf_counter,
                                   setup_device)
from harness.submission.contract import SubmissionContext, SubmissionError, check_forward_output, load_submission
from harness.submission.defaults import default_lr_schedule, default_optimizers


def _print0(env: RankEnv, *args) -> None:
    if env.rank == 0:
        print(*args, flush=True)


@dataclass
class Training:
    """What the loop needs, built once before the clock starts."""

    job: Any
    env: RankEnv
    channel: Any
    device: Any
    sub: Any  # the checked Submission
    ddp: Any
    raw_model: Any  # what the checkpoint saves: never the compiled or DDP wrapper
    optimizers: list
    schedule: Any
    autocast: Any
    prefetch: Any
    params: int
    tokens_per_step: int
    micro_batch_size: int  # read once from CONFIG: the step never looks at the submission's dict again
    seq_len: int
    accum: int
    vocab_out: int
    t0: float | None = None  # set here when the clock starts at model build
    # Device-side buffers, allocated once and reused by every step.
    grad_clip: float | None = None  # CONFIG["grad_clip"]: max global norm of the synchronised gradients
    grad_norm: Any = None  # the last step's global gradient norm before clipping (device scalar)
    loss_sum: Any = None  # this rank's micro-batch losses since the start (float64 device scalar)
    loss_count: int = 0  # micro-batches since the start (the same on every rank)
    lr_scale: float = 0.0
    first_loss: Any = None  # the harness's loss of this rank's first micro-batch, before any optimizer step
    first_relabeled: Any = None  # the same micro-batch, its vocabulary relabelled: the mean (relabel_probe)
    first_spread: Any = None  # and the spread of the relabelled scores
    first_step_loss: float | None = None  # their means over the ranks, read at the first vote cast after step 0
    first_step_relabeled_loss: float | None = None
    first_step_relabeled_spread: float | None = None
    compiled: bool = False  # torch.compile'd (COMPILE, or get_model's own): the first step compiles
    compile_skipped: bool = False  # it asked to be, and the track trains its plain module (compile = "eager")
    static_graph: bool = False  # the track's DDP static graph: its first step synchronises every micro-step

    @property
    def file(self) -> str:
        return str(self.sub.folder / "submission.py")


def build_training(job, env: RankEnv, channel, holders: list) -> Training:
    """Device, process group, submission, model, DDP, optimizers and data: not on the clock
    (unless the track starts it at model build)."""
    meeting = Rendezvous(job.collective_timeout_s, MEET_WITHIN_S)  # begun now: overlaps the import and the word
    import torch._dynamo  # noqa: F401  (DDP's constructor imports it: seconds of CPU that are the harness's, not the team's)
    if job.gated:  # started beside the check of its submission: nothing is built, no device touched, before its word
        await_check(channel)
    if job.compiles:  # torch.compile() imports the compiler on its first call: 1.5 s of CPU, ours, not the team's
        # After the word: some torch versions start Inductor's compile-worker pool at this import, processes that
        # the check's teardown (which ends what appeared while it ran) must not find.
        import torch._inductor.compile_fx  # noqa: F401
    device = setup_device(job.device, env, job.cpu_threads_per_rank)
    init_process_group(job.backend, device, job.collective_timeout_s, meeting.result())

    dist.barrier()  # every rank has done the harness's part: a slow import is not counted against the team
    if env.local_rank == 0:  # the team's start-up begins: the launcher holds it to the track's allowance
        channel.send("setup_start")
    check_nodes_agree(job, env)
    sub = load_submission(job.submission_dir, job.vocab_size)
    sub_file = str(sub.folder / "submission.py")
    ctx = SubmissionContext(
        rank=env.rank, local_rank=env.local_rank, world_size=env.world_size, device=str(device),
        budget_s=job.budget_s, vocab_size=job.vocab_size, seed=job.seed, track=job.track,
    )
    B, T, accum = sub.micro_batch_size, sub.seq_len, sub.grad_accum_steps
    tokens_per_step = env.world_size * B * T * accum
    stream = TokenStream(job.train_shards, seq_len=T, micro_batch_size=B, rank=env.rank,
                         world_size=env.world_size, seed=job.seed, vocab_size=job.vocab_size)
    prefetch = Prefetcher(stream, pin_memory=device.type == "cuda")
    _print0(env, f"[harness] world {env.world_size} on {device}, {B}x{T} x{accum} accum per rank, "
                 f"{tokens_per_step} tokens/step, budget {job.budget_s:.1f}s")

    torch.manual_seed(job.seed)  # the same init on every rank; DDP also broadcasts rank 0's weights
    np.random.seed(job.seed % 2**32)

    t0 = None
    if job.clock_start == "model_build":
        t0 = start_clock(job, env, channel)

    model = sub.get_model(dict(sub.config))
    if not isinstance(model, torch.nn.Module):
        raise SubmissionError(sub_file, f"get_model returned a {type(model).__name__}, not a torch.nn.Module.",
                              "return the model instance from get_model(config)")
    model.to(device=device, dtype=torch.float32)  # fp32 master weights; autocast does the bf16
    raw_model = unwrap(model)  # a get_model that returns torch.compile(model) saves the plain module's keys
    params = sum(p.numel() for p in raw_model.parameters())
    compile_skipped = job.compile_mode == "eager" and (model is not raw_model or bool(sub.compile))
    if job.compile_mode == "eager":  # the track trains compiled models eagerly: their plain module, same weights
        model = raw_model
    elif sub.compile and model is raw_model:  # never compile twice
        model = torch.compile(model)
    ddp = ddp_setup.wrap(model, device, env.local_rank, job.ddp)  # the track's [ddp] settings, the same for every team
    optimizers = sub.build_optimizers(raw_model, ctx) if sub.build_optimizers else default_optimizers(raw_model, ctx, sub.config)
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    if not isinstance(optimizers, (list, tuple)) or not optimizers or not all(
            isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise SubmissionError(sub_file, "build_optimizers must return an Optimizer or a non-empty list of them.",
                              "return torch.optim optimizers built over model.parameters()")
    holders.extend([ddp, optimizers, model, raw_model])  # released before the process group at exit
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = float(group["lr"])
    # Ranks draw different random numbers from here on (dropout masks), once everything that is built
    # alike on every rank (model, optimizers) is built.
    torch.manual_seed((job.seed << 20) + 1 + env.rank)
    np.random.seed(((job.seed << 20) + 1 + env.rank) % 2**32)
    return Training(
        job=job, env=env, channel=channel, device=device, sub=sub, ddp=ddp, raw_model=raw_model,
        optimizers=list(optimizers), schedule=sub.lr_schedule or default_lr_schedule,
        autocast=torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=job.dtype == "bfloat16"),
        prefetch=prefetch, params=params, tokens_per_step=tokens_per_step, micro_batch_size=B, seq_len=T,
        accum=accum, vocab_out=int(sub.config["vocab_size"]), t0=t0,
        grad_clip=float(sub.config["grad_clip"]) if sub.config.get("grad_clip") else None,
        grad_norm=torch.zeros((), dtype=torch.float32, device=device),
        loss_sum=torch.zeros((), dtype=torch.float64, device=device), compiled=model is not raw_model, compile_skipped=compile_skipped,
        static_graph=bool(ddp.static_graph),
    )


class CheckRefused(RuntimeError):
    """The launcher's check of the submission did not pass: the rank leaves without running any team code (the
    record's status and reason are the check's)."""

    harness_status = "invalid"


def await_check(channel) -> None:
    """Waits for the launcher's word on the check of the submission that runs beside this rank's start-up: `go`,
    else CheckRefused. The word comes on this rank's own connection, which only this rank holds (it said hello
    before any team code ran anywhere in the job). A GPU is not touched before it (an exclusive GPU takes one
    context, and the check may hold it)."""
    word = channel.wait_for_word()
    if word.get("kind") != "go":
        raise CheckRefused(str(word.get("why") or "the launcher ended the job before training"))


class NodesDisagree(RuntimeError):
    harness_status = "invalid"


def check_nodes_agree(job, env: RankEnv) -> None:
    """On several nodes, every node must train the same submission on the same data in the same
    precision (each node's launcher read its own copies): checked before any submission code runs."""
    if env.world_size == env.local_world_size:
        return
    mine = {"data": job.data_fingerprint, "submission": job.submission_sha256, "precision": job.dtype}
    seen: list = [None] * env.world_size
    dist.all_gather_object(seen, {"node": env.group_rank, **mine})
    differ = [s for s in seen if {k: s[k] for k in mine} != {k: seen[0][k] for k in mine}]
    if differ:
        first = differ[0]
        what = ", ".join(f"{k} {first[k]!s:.16} on node {first['node']} but {seen[0][k]!s:.16} on node {seen[0]['node']}"
                         for k in mine if first[k] != seen[0][k])
        raise NodesDisagree(f"the nodes disagree before training: {what}; every node must run the same "
                            "submission on the same data")


def start_clock(job, env: RankEnv, channel) -> float:
    t0 = perf_counter()
    if env.local_rank == 0:  # each node's launcher watches its own clock: its first rank reports
        channel.send("train_start", clock_start=job.clock_start)
    return t0


def train_step(tr: Training, step: int, progress: float) -> None:
    """One optimizer step: grad_accum_steps micro-steps, gradients synchronised on the last."""
    accum = tr.accum
    scales = lr_scales(tr.schedule(min(1.0, progress)), len(tr.optimizers), tr.file)
    tr.lr_scale = scales[0]
    for opt, scale in zip(tr.optimizers, scales):
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * scale
    for micro in range(accum):
        x, y = split_inputs_targets(tr.prefetch.next().to(tr.device, non_blocking=True))
        # DDP's static graph records its graph on the first step's backward and cannot start under no_sync: there
        # every micro-step synchronises (the sum of averages is the average of the sums: the same gradients).
        skip_sync = micro < accum - 1 and not (tr.static_graph and step == 0)
        sync_ctx = tr.ddp.no_sync() if skip_sync else contextlib.nullcontext()
        with sync_ctx:
            if step == 0 and micro == 0:  # before any optimizer step, on every rank (before its activations exist)
                tr.first_loss, tr.first_relabeled, tr.first_spread = relabel_probe(tr, x, y)
            with tr.autocast:
                out = tr.ddp(x, y)
            if step == 0 and micro == 0:
                check_forward_output(out, tr.micro_batch_size, tr.seq_len, tr.vocab_out, True, tr.file)
            loss = out[1]
            (loss / accum).backward()
        tr.loss_sum += loss.detach()  # summed in float64 on the device: read at the next vote, not here
        tr.loss_count += 1
    if tr.grad_clip:  # on the synchronised gradients; the norm stays on the device until a vote carries it
        tr.grad_norm = torch.nn.utils.clip_grad_norm_(tr.raw_model.parameters(), tr.grad_clip, foreach=True)
    for opt in tr.optimizers:
        opt.step()
    for opt in tr.optimizers:
        opt.zero_grad(set_to_none=True)


def lr_scales(value, n_optimizers: int, file: str) -> list[float]:
    """lr_schedule may return one multiplier for every optimizer or one per optimizer, in the order
    build_optimizers returned them (Muon and AdamW often decay differently)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n_optimizers:
            raise SubmissionError(file, f"lr_schedule returned {len(value)} multipliers for {n_optimizers} optimizer(s).",
                                  "return one number, or one per optimizer in build_optimizers' order")
        return [float(v) for v in value]
    return [float(value)] * n_optimizers


class Steps:
    """When each step ended, as the agreement points show it (a CPU: the step just run; a GPU: the one queued
    before it), and the step times between them."""

    def __init__(self, start_s: float, rule: StopRule) -> None:
        self.ends_s: list[float] = []
        self.start_s, self.rule = start_s, rule
        rule.synced(start_s)  # the clock's start: an agreement point with nothing queued

    def ended(self, now_s: float) -> None:
        self.ends_s.append(now_s)
        self.rule.synced(now_s)

    def end_of(self, steps_done: int) -> float:
        """When the first `steps_done` steps had ended (the clock's start for none)."""
        return self.ends_s[steps_done - 1] if steps_done else self.start_s

    @property
    def times_s(self) -> list[float]:
        edges = [self.start_s, *self.ends_s]
        return [b - a for a, b in zip(edges, edges[1:])]


def train(job, env: RankEnv, channel, holders: list) -> dict:
    tr = build_training(job, env, channel, holders)
    device_ahead = tr.device.type == "cuda"  # the host runs a step ahead of a GPU; on a CPU it is the device
    rule = StopRule(job.budget_s, device_ahead=device_ahead)
    votes = Agreement(tr.device, env.world_size, clips=bool(tr.grad_clip))
    step = tokens = 0
    last_step_start_s = warm_s = 0.0
    schedule_start_s: float | None = None  # the schedule's clock starts when the first step has ended
    reported = (0.0, 0)  # the loss sum and micro-batch count at the last report
    last_log_s = 0.0

    def my_vote(decides: int, now_s: float) -> int:
        if job.max_steps:
            return STOP_BUDGET if decides >= job.max_steps else CONTINUE
        return rule.decide(now_s)

    def report(agreed: Agreed, steps_done: int, at_s: float) -> float:
        """Rank 0 reports the train loss since the last report; every rank keeps the same baseline."""
        nonlocal reported, last_log_s
        count = agreed.loss_count - reported[1]
        loss = (agreed.loss_sum - reported[0]) / (count * env.world_size) if count else float("nan")
        if env.rank == 0:
            done = steps_done * tr.tokens_per_step
            channel.send("progress", step=steps_done, train_time_s=at_s, train_loss=loss, lr_scale=tr.lr_scale,
                         tokens=done, tokens_per_s=done / at_s if at_s > 0 else 0.0,
                         grad_norm=agreed.grad_norm if math.isfinite(agreed.grad_norm) else None)
        reported, last_log_s = (agreed.loss_sum, agreed.loss_count), agreed.elapsed_s
        return loss

    # ---------------------------------------------------------------- the clock runs from here
    print(f"[harness] rank {env.rank}: training starts", flush=True)
    t0 = tr.t0 if tr.t0 is not None else start_clock(job, env, channel)
    now = perf_counter() - t0
    agreed = votes.agree_now(tr, my_vote(0, now), now)  # is there time for a first step? nothing is queued yet
    steps = Steps(perf_counter() - t0, rule)
    while agreed.stop == CONTINUE:
        if job.max_steps and step == job.warmup_steps:  # a fixed-step probe's throughput starts after warm-up
            if device_ahead:
                torch.cuda.synchronize(tr.device)  # once: the steps before it are done
            warm_s = perf_counter() - t0
        now = perf_counter() - t0
        votes.launch(tr, my_vote(step + 1, now), now)  # decides the step after this one
        last_step_start_s = now
        # The schedule's progress: steps when the run is step-bounded (tests, benchmarks), else the time agreed by
        # the last vote read (cast a step before this one), on the schedule's clock: not the first step's compile.
        train_step(tr, step, step / job.max_steps if job.max_steps else
                   schedule_progress(agreed.elapsed_s, schedule_start_s, job.budget_s))
        step += 1
        tokens += tr.tokens_per_step
        agreed = votes.read(tr)  # waits for the device to reach the vote, queued before the step just queued
        synced = perf_counter() - t0
        if step == 2:  # the vote cast once the first step was queued: torch.compile has compiled on every rank
            schedule_start_s = agreed.elapsed_s
        if step - device_ahead >= 1:  # on a GPU the step just queued is not done: the one before it is
            steps.ended(synced)
        if agreed.elapsed_s - last_log_s >= job.log_interval_s:  # the same decision on every rank
            report(agreed, step - 1, steps.end_of(step - 1))  # the vote was cast before this step: the ones before

    # ---------------------------------------------------------------- the last step: waited for, then the clock stops
    now = perf_counter() - t0
    final = votes.agree_now(tr, STOP_BUDGET, now)  # after every step queued: its read waits for the last one
    synced = perf_counter() - t0
    if device_ahead and step:
        steps.ended(synced)
    stop_code = STOP_DIVERGED if STOP_DIVERGED in (agreed.stop, final.stop) else agreed.stop
    train_loss = report(final, step, synced)
    step_s = steps.times_s
    # The first step compiles and the last is the one the launcher checks: the median of the others.
    median_step_s = statistics.median(step_s[1:-1] or step_s[1:] or step_s) if step_s else 0.0
    # The slowest step between the first (compilation) and the last: a step that is slow every k steps (a
    # preconditioner's refresh, a collection) has shown itself there; the last one is what is checked.
    slowest_earlier_s = max(step_s[1:-1], default=0.0)
    if env.local_rank == 0:
        channel.send("train_end", step=step, tokens=tokens, train_time_s=synced, median_step_s=median_step_s,
                     slowest_earlier_step_s=slowest_earlier_s)
    if stop_code == STOP_DIVERGED:
        tr.prefetch.close()
        raise Diverged(f"loss became NaN or inf at step {step}; training stopped")
    result = finish(tr, step, tokens, synced, warm_s)
    return {**result, "train_loss": train_loss if math.isfinite(train_loss) else None,
            "max_step_s": max(step_s, default=0.0), "median_step_s": median_step_s,
            "slowest_earlier_step_s": slowest_earlier_s, "last_step_start_s": last_step_start_s,
            "first_step_s": step_s[0] if step_s else None,  # none when no step ran
            "compiled": tr.compiled, "compile_skipped": tr.compile_skipped, "ddp": ddp_setup.applied(tr.ddp),
            "first_step_loss": tr.first_step_loss, "first_step_relabeled_loss": tr.first_step_relabeled_loss,
            "first_step_relabeled_spread": tr.first_step_relabeled_spread}
