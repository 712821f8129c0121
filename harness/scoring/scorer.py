"""One evaluation rank: the checkpoint scored on exactly `val_tokens` held-out tokens, with the model
in sandboxed child processes that never see a target.

Started by torch elastic after every training process is gone:
    python -u -m harness.scoring.scorer <eval_job.json>

This process never imports the submission (its result says so: `scorer_clean`). It starts the
scoring model process first (forked from a clean template that imports torch meanwhile), checks the
checkpoint's sha256 against the record, reads the validation tokens, and draws a secret seed
(shared by the scorer ranks, recorded only in the result). For each of its
batches (harness/scoring/plan.py) it hands the inputs over, takes the logits back and computes the
cross-entropy of the targets itself, in float32 on the CPU, summed in float64; of the
batches drawn for the causality check, and of the one it will re-run unchanged, it keeps the
log-probabilities up to each row's cut. Then it
kills that process and everything it started, waits until every scorer rank has done so (a
barrier), and only then starts the check process, which gets the checked batches with every row's
tokens after a secret cut replaced, and, at a secret place among them, one scoring batch unchanged
(the reproduction); the scorer compares its log-probabilities up to the cut with the kept ones. A
model that does not reproduce itself on the unchanged batch is not deterministic here: a deviation
on the perturbed ones then proves nothing, and the verdict is "inconclusive" (plan.causality_verdict).
Both model processes hold DETERMINISM (harness/ranks/models/model_worker.py applies it before the model is
built and again before every forward). The two model processes never exist at the same time, on any
rank: the scoring one cannot see whether a batch is being checked, nor talk to the one that checks.

The scorer itself never touches a GPU, on any track: its collectives are gloo's, and its arithmetic is
one cross-entropy per scored token on logits it must copy out of the shared buffer anyway. So a GPU
holds one CUDA context during evaluation, the model process's (GPUs in EXCLUSIVE_PROCESS compute mode
allow no second), and the logits cross the PCIe bus once, straight from the device into the shared
buffer (harness/ranks/models/model_worker.py).
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from pathlib import Path

from harness.ranks.process import (
    MEET_WITHIN_S,
    RankEnv,
    Rendezvous,
    describe_failure,
    die_with_launcher,
    init_process_group,
    perf_counter,
    redirect_output,
    release_and_exit,
    setup_device,
)


KEEP_BYTES = 4 << 30  # per scorer rank: the scoring log-probabilities kept for the checked rows

# What both model processes hold, so that the same inputs give the same numbers in the scoring and the
# check process on a GPU (on a CPU they already do). `env` is their environment from the start (cuBLAS
# reads its workspace setting when CUDA starts; Inductor reads its variables when its config is first
# imported); the rest is set before the team's model is built and again before every forward, since team
# code may flip it (harness/ranks/models/model_worker.py: hold_determinism). Recorded in `eval.causality`.
DETERMINISM = {
    "env": {
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",  # a fixed cuBLAS workspace: what deterministic cuBLAS needs
        "TORCHINDUCTOR_DETERMINISTIC": "1",  # Inductor: no benchmark that can change numerics picks a kernel
        "TORCHINDUCTOR_MAX_AUTOTUNE": "0", "TORCHINDUCTOR_MAX_AUTOTUNE_POINTWISE": "0",
        "TORCHINDUCTOR_MAX_AUTOTUNE_GEMM": "0", "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING": "0",
        "TORCHINDUCTOR_MULTI_KERNEL": "0", "TORCHINDUCTOR_BENCHMARK_FUSION": "0",
        "TORCHINDUCTOR_BENCHMARK_EPILOGUE_FUSION": "0",
        # Evaluation runs a team's model eagerly (model_worker.eager): dynamo, wherever it is first imported
        # (a forward that compiles lazily, on its first call), compiles nothing.
        "TORCH_COMPILE_DISABLE": "1",
    },
    "deterministic_algorithms": "warn_only",  # torch.use_deterministic_algorithms(True, warn_only=True)
    "cudnn_benchmark": False,  # cuDNN picks no algorithm by timing it
    "cudnn_deterministic": True,
    # torch._inductor.config, where the team's code loaded it: one kernel choice, none by timing
    "inductor": {"deterministic": True, "max_autotune": False, "max_autotune_pointwise": False,
                 "max_autotune_gemm": False, "coordinate_descent_tuning": False, "triton.autotune_pointwise": False,
                 "triton.multi_kernel": 0, "benchmark_fusion": False, "benchmark_epilogue_fusion": False},
}


def one_visible_device(visible: str | None, local_rank: int) -> str:
    """The CUDA_VISIBLE_DEVICES that shows a model process exactly the GPU `cuda:<local_rank>` names in
    this process (an index, a UUID or a MIG instance, as the organiser wrote it): the same entry, read
    under the same CUDA_DEVICE_ORDER, is the same device, and no CUDA call is needed to find it."""
    if visible is None:
        return str(local_rank)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if local_rank >= len(entries):
        raise RuntimeError(f"evaluation rank {local_rank} has no GPU: CUDA_VISIBLE_DEVICES={visible!r} lists "
                           f"{len(entries)}; give `harness eval` --nproc {len(entries)} or fewer")
    return entries[local_rank]


def shared_seed(env: RankEnv, device) -> int:
    """A secret 62-bit seed, drawn by rank 0 and given to the other scorers (never to a model process)."""
    import secrets

    import torch
    import torch.distributed as dist

    seed = torch.tensor([secrets.randbits(62)], dtype=torch.int64, device=device)
    if env.world_size > 1:
        dist.broadcast(seed, src=0)
    return int(seed.item())


def evaluate(job, env: RankEnv, holders: list, started: list) -> dict:
    from harness.scoring.template import model_template
    from harness.scoring.workers import ModelWorker, become_subreaper, tokens_out

    t_start = perf_counter()
    become_subreaper()
    # Before anything is read: the clean process whose two copies the model processes are forked from
    # (it imports torch once, while this process does the same; harness/ranks/models/model_template.py).
    # Closed last.
    template = model_template()
    if template is not None:
        holders.append(template)
    V, T = job.vocab_out, job.seq_len
    setup = {"checkpoint": job.checkpoint, "submission_dir": job.submission_dir,
             # A GPU's model process sees only its rank's GPU: it cannot reach the other ranks' devices.
             "device": "cuda:0" if job.device == "cuda" else "cpu",
             "cuda_visible_devices": one_visible_device(os.environ.get("CUDA_VISIBLE_DEVICES"), env.local_rank)
             if job.device == "cuda" else None,
             "precision": job.dtype, "threads": job.cpu_threads_per_rank, "vocab_out": V, "sandbox": job.sandbox,
             "model_file": job.model_file, "determinism": DETERMINISM}
    size = job.batch_size * T * V * 4
    logs = Path(job.log_dir)

    def start() -> ModelWorker:  # the one way a model process is started, on every rank
        worker = ModelWorker(setup=setup, buffer_bytes=size, log_dir=logs, protected=job.protected, template=template,
                             scratch_dir=job.scratch_dir or None)
        holders.append(worker)
        started.append(worker)
        return worker

    def end(worker: ModelWorker) -> None:
        worker.close()
        holders.remove(worker)

    # The scoring process starts before anything else is read: its template imports torch while this
    # process does the same (on a small CPU each costs seconds), then forks it.
    scoring = start()

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from harness.ranks.checkpoint import file_sha256
    from harness.scoring import plan

    device = setup_device("cpu", env, job.cpu_threads_per_rank)  # never CUDA: the module docstring
    # Begun before the checkpoint's hash and the tokens are read: its wait overlaps them (harness/ranks/process.py)
    meeting = Rendezvous(job.collective_timeout_s, MEET_WITHIN_S) if env.world_size > 1 else None
    actual = file_sha256(job.checkpoint)
    if job.checkpoint_sha256 and actual != job.checkpoint_sha256:
        raise RuntimeError(f"{job.checkpoint}: sha256 {actual[:12]} differs from the record's "
                           f"{job.checkpoint_sha256[:12]}; the checkpoint was changed after training")
    tokens = plan.read_val_tokens(job.val_shards, job.val_tokens, job.vocab_size)
    if meeting is not None:
        init_process_group("gloo", device, job.collective_timeout_s, meeting.result())
    seed = shared_seed(env, device)
    n_windows = job.val_tokens // job.seq_len
    order = plan.window_order(n_windows, seed)
    batches = plan.batch_plan(n_windows, job.batch_size)
    checks = plan.choose_checks(len(batches), job.causality_fraction, seed, rows=[n for _, n in batches],
                                min_rows=job.causality_min_rows) if job.causality_check else set()
    # One batch per rank is re-run unchanged (the reproduction), never a checked one: drawn after the checks.
    reproduced = plan.reproduction_batches(len(batches), env.world_size, seed, checks) if job.causality_check else {}
    mine = plan.batches_for_rank(len(batches), env.rank, env.world_size)
    mine_reproduced = reproduced.get(env.rank)

    # What the comparison needs of the scoring logits, bounded: every position up to each cut if it fits
    # KEEP_BYTES, else the last `window` positions up to each cut (the cut's own position always). The
    # reproduction's cuts are drawn as a checked batch's: its comparison is the same, on unchanged inputs.
    mine_checked = [b for b in mine if b in checks]
    cuts_of = {b: plan.check_cuts(seed, b, batches[b][1], T)
               for b in [*mine_checked, *([mine_reproduced] if mine_reproduced is not None else [])]}
    need = sum(int(c) + 1 for cuts in cuts_of.values() for c in cuts) * V * 4
    rows_checked = sum(len(cuts) for cuts in cuts_of.values())
    window = None if need <= KEEP_BYTES else max(1, KEEP_BYTES // max(1, rows_checked * V * 4))

    # 1. The scoring process (started first, above) answers every batch of this rank; of the checked
    # rows the scorer keeps the log-probabilities up to each cut. The scoring process always runs
    # first: it cannot learn which of its batches will be checked, because no check has happened yet
    # and the choice is a secret of this process; a check process that learns it runs second learns
    # nothing it can use (to answer a checked row as the scoring process did, it would need the token
    # after the cut that was replaced). Then it is killed with everything it started.
    scoring.log_path = logs / f"eval-model-rank{env.rank}.log"  # given when both are dead (see main)
    ready = {"model": scoring.wait_ready()}
    # Every rank's scoring process is ready before any is handed a batch: one that fails while it starts then
    # cannot have learnt tokens from another rank's beside it (through the page cache they share), and keeps its
    # words; from here on, no model process of this scorer does (workers.tokens_out), ranks without a batch too.
    if env.world_size > 1:
        dist.barrier()
    tokens_out()
    total = torch.zeros((), dtype=torch.float64, device=device)
    total_sq = torch.zeros((), dtype=torch.float64, device=device)  # for the spread of the per-token losses
    batch_s: list[float] = []  # how long the scoring process took over each batch (model_compute)
    count, kept = 0, {}
    t_score = perf_counter()
    for b in mine:
        first, n = batches[b]
        x, y = plan.window_batch(tokens, order[first:first + n], T)
        t_batch = perf_counter()
        scoring.submit(x)
        logits = scoring.logits(V)
        batch_s.append(perf_counter() - t_batch)
        target = torch.from_numpy(y)
        losses = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), reduction="none")
        total += losses.double().sum()
        total_sq += losses.double().square().sum()
        count += losses.numel()
        if b in cuts_of:
            kept[b] = plan.keep_for_check(logits, cuts_of[b], window)
        del logits
    elapsed = perf_counter() - t_score
    exposed = set(scoring.exposed)
    end(scoring)
    left_running = {"model": scoring.left_running}

    # 2. No rank's check process starts while any rank's scoring process is alive.
    if env.world_size > 1:
        dist.barrier()

    # 3. The check process re-runs the checked batches with the tokens after each cut replaced, and the
    # reproduction batch as it is, in a secret order. Every input is made before the first is handed over,
    # and each batch then goes through the same steps: nothing the scorer does between two batches (the
    # time a perturbation takes) tells the model process which one is unchanged. Every rank starts one,
    # checked batches or not: ranks wait for each other at the end with the collective timeout, and none
    # should wait there while another starts a process and loads a model.
    jobs = []  # (batch, inputs, cuts, reproduction?)
    for b in mine_checked:
        first, n = batches[b]
        x, _ = plan.window_batch(tokens, order[first:first + n], T)
        xp, cuts = plan.perturb(x, tokens, seed, b)
        jobs.append((b, xp, cuts, False))
    if mine_reproduced is not None:
        first, n = batches[mine_reproduced]
        x, _ = plan.window_batch(tokens, order[first:first + n], T)
        jobs.append((mine_reproduced, x, cuts_of[mine_reproduced], True))
    jobs = [jobs[i] for i in plan.check_order(len(jobs), seed, env.rank)]
    worst, worst_at, checked, reproduction = 0.0, None, 0, -1.0
    check_s: list[float] = []
    checker = start()
    checker.log_path = logs / f"eval-check-rank{env.rank}.log"
    ready["check"] = checker.wait_ready()
    exposed |= set(checker.exposed)
    for b, inputs, cuts, is_reproduction in jobs:
        t_batch = perf_counter()
        checker.submit(inputs)
        answer = checker.logits(V)
        check_s.append(perf_counter() - t_batch)
        dev, row, pos = plan.deviation_kept(kept.pop(b), answer, cuts, window)
        if is_reproduction:
            reproduction = dev
            continue
        checked += 1
        if dev > worst or worst_at is None:
            worst, worst_at = dev, {"batch": b, "row": row, "position": pos, "cut": int(cuts[row])}
    end(checker)
    left_running["check"] = checker.left_running

    rows_done = sum(len(cuts_of[b]) for b in mine_checked)
    sums = torch.tensor([0.0, float(count), float(checked), 0.0, float(rows_done), float(reproduction >= 0)],
                        dtype=torch.float64, device=device)
    sums[0], sums[3] = total, total_sq
    peak = torch.tensor([worst, reproduction], dtype=torch.float64, device=device)  # -1: no reproduction here
    if env.world_size > 1:
        dist.all_reduce(sums)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    n = int(sums[1].item())
    if n != job.val_tokens:
        raise RuntimeError(f"scored {n} tokens, expected exactly {job.val_tokens}")
    worst_all = float(peak[0].item())
    reproduction_all = float(peak[1].item()) if int(sums[5].item()) else None
    mean = float(sums[0].item()) / n
    rows_all = int(sums[4].item())
    verdict = plan.causality_verdict(worst_all, reproduction_all, job.causality_tolerance)
    return {
        "val_loss": mean, "val_tokens": n, "eval_world_size": env.world_size,
        "val_loss_token_std": max(0.0, float(sums[3].item()) / n - mean * mean) ** 0.5 if math.isfinite(mean) else None,
        "eval_time_s": perf_counter() - t_start, "eval_tokens_per_s": n / elapsed if elapsed > 0 else None,
        "causality": None if not job.causality_check else {
            "method": "scoring batches re-run with every row's tokens after a secret cut replaced",
            "checked_batches": int(sums[2].item()), "batches": len(batches), "rows_checked": rows_all,
            "detects_fraction_95": plan.detectable_fraction(rows_all),
            "fraction": int(sums[2].item()) / len(batches), "worst_deviation": worst_all,
            "tolerance": job.causality_tolerance, "verdict": verdict, "causal": verdict == "causal",
            "reproduction": "one unchanged scoring batch per scorer rank, re-run by the check process at a "
                            "secret place among the perturbed ones",
            "reproduced_batches": int(sums[5].item()), "reproduction_deviation": reproduction_all,
            "determinism": DETERMINISM,
            "worst_at": worst_at if worst_all == worst else None, "seed": f"{seed:016x}",
            "positions_kept": "all up to the cut" if window is None else f"the last {window} up to the cut",
        },
        "model_compute": model_compute(batch_s, check_s),
        "left_running": left_running,  # what each model process's team code had running when it was ended
        "sandbox": {name: r.get("sandbox") for name, r in ready.items()},
        "logits_buffer": str(ready["model"].get("logits_buffer", ""))[:200],  # the model process's word: shown only
        "sandbox_exposed": sorted(exposed),
        "scorer_clean": not any(m.startswith("_harness_submission") for m in sys.modules),
        "model_processes": "forked from a clean template" if template is not None else "fresh interpreters",
    }


def model_compute(scoring_s: list[float], check_s: list[float]) -> dict:
    """How long each model process took over its batches (inputs in, logits out): the median and the
    slowest, for the launcher's check that no batch hid work that is not a forward pass (training
    on data carried in the checkpoint, off every clock; harness/launcher/run/assemble.py)."""
    import statistics

    def summary(times: list[float]) -> dict:
        return {"batches": len(times), "median_s": statistics.median(times) if times else None,
                "slowest_s": max(times, default=None)}

    return {"scoring": summary(scoring_s), "check": summary(check_s)}


def main(argv: list[str]) -> None:
    from harness.ranks.channel import ChannelClient
    from harness.ranks.confine import cgroup
    from harness.ranks.jobs import EvalJob

    job = EvalJob.load(argv[1])
    env = RankEnv.from_environ()
    die_with_launcher()
    # First: every model process it starts is born in the evaluation's cgroup, and ends with it. Not first to be
    # killed when memory runs out (its model processes are: harness/ranks/models/model_worker.py).
    held = cgroup.join_from_environment(oom_first=False)
    redirect_output(f"{job.log_dir}/eval-rank{env.rank}.log")
    channel = ChannelClient(job.channel_path, env.rank)
    channel.send("hello", pid=os.getpid(), local_rank=env.local_rank, world_size=env.world_size)
    holders: list = []
    started: list = []  # every model process: their logs get their roles' names once all are dead
    code = 0
    try:
        if held and not held["active"]:  # its model processes still die with their own PID namespaces: said, not fatal
            print(f"[harness] warning: {held['why']}", file=sys.stderr, flush=True)
        result = evaluate(job, env, holders, started)
        channel.send("eval_result", **result)
    except BaseException as exc:
        report = describe_failure(exc, device=job.device)  # never a CUDA query of its own
        worker_tb = getattr(exc, "worker_traceback", "")
        if worker_tb:
            report["traceback"] = worker_tb
        print(report["traceback"], file=sys.stderr, flush=True)
        channel.send("error", **report)
        code = 1
    for worker in reversed(holders):  # the model processes, then the template they were forked from
        if hasattr(worker, "close"):
            try:
                worker.close()
            except Exception:  # noqa: BLE001  (the others are still ended; the launcher sweeps after)
                traceback.print_exc()
                code = 1
    for worker in started:
        worker.name_log()
    channel.close()
    release_and_exit(code, [h for h in holders if not hasattr(h, "close")])


if __name__ == "__main__":
    main(sys.argv)
