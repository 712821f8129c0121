"""A run's evaluation phase, on every node's GPUs: node 0 offers it, the other nodes join, and one scorer
job spans them all (the scorer ranks themselves: harness/scoring/scorer.py).

Runs in every node's launcher, after training. Only node 0 knows when the checkpoint is taken, checked
and ready to score, so the nodes agree through files in the run's `nodes/` folder (on the shared file
system that holds the run; no rank can write there):

1. node 0 writes `eval-go.json`: what every node needs to build the same evaluation job;
2. node R > 0, done training and waiting for it, answers `node<R>-eval-ready.json`;
3. node 0 waits a few seconds for every answer and writes `eval-start.json`: all the nodes, or node 0
   alone when one did not answer (a node lost since training, or one whose training failed);
4. each node then starts its scorer ranks in one job (global ranks, the training's rendezvous endpoint),
   and node R leaves `node<R>-eval.json`, its account, which node 0 reads when its own ranks saw only
   the echo of a failure elsewhere.

Every token is scored once whatever the number of ranks, so the figure does not depend on how many
nodes joined; node 0 alone is only slower. A node R that never hears from node 0 (node 0 lost, or its
run ended before evaluation) stops waiting when node 0's record is final, or at its deadline.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness.launcher.control.job_cgroup import track_caps, v2_own_and_mount
from harness.data.prepare import PreparedData
from harness.launcher.run.assemble import check_reports, flag_run, set_outcome
from harness.launcher.run.nodes import NodePaths, account_rank, account_text
from harness.launcher.run.check_process import PREFLIGHT_TIMEOUT_S
from harness.launcher.run.phases import PhaseResult, run_evaluation
from harness.launcher.run.training import protected_paths, threads_per_rank
from harness.ranks.jobs import EvalJob
from harness.ranks.confine.scratch import scratch_root
from harness.results.records import FINAL_STATUSES, RunRecord, read_record_json, write_atomic
from harness.scoring.plan import rows_to_detect
from harness.scoring.scorer import KEEP_BYTES
from harness.launcher.control.job_limits import MEMORY_SHARE_OF_NODE, Caps, node_memory_bytes
from harness.tracks.spec import Track

READY_WITHIN_S = 30.0  # node 0's wait for the other nodes' answers
EVAL_RENDEZVOUS_S = 60.0  # the scorers' rendezvous across nodes
ACCOUNT_WITHIN_S = 8.0  # node 0's wait for a node's account of an evaluation that failed
POLL_S = 0.25


@dataclass(frozen=True)
class EvalPlan:
    """What each node needs to build the same evaluation job as node 0 (build_eval_job)."""
    checkpoint_sha256: str
    nproc: int
    precision: str
    vocab_out: int
    model_file: str


def _nodes_dir(node: NodePaths) -> Path:
    folder = node.run_dir / "nodes"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _read(path: Path) -> dict | None:
    try:
        return read_record_json(path)  # bounded, a regular file, an object
    except (OSError, ValueError):
        return None


def _write(path: Path, value: dict) -> None:
    write_atomic(path, json.dumps(value, indent=1) + "\n")


# --------------------------------------------------------------------------- node 0

def offer(node: NodePaths, plan: EvalPlan, nnodes: int, within_s: float = READY_WITHIN_S) -> int:
    """Node 0: offer the evaluation, wait for the other nodes' answers, say who takes part; returns the
    number of nodes that evaluate (all of them, or 1)."""
    folder = _nodes_dir(node)
    _write(folder / "eval-go.json", asdict(plan))
    deadline = time.monotonic() + within_s
    waiting = set(range(1, nnodes))
    while waiting and time.monotonic() < deadline:
        waiting = {r for r in waiting if _read(folder / f"node{r}-eval-ready.json") is None}
        if waiting:
            time.sleep(POLL_S)
    taking_part = 1 if waiting else nnodes
    _write(folder / "eval-start.json", {"nnodes": taking_part, "missing": sorted(waiting)})
    return taking_part


def remote_failure(node: NodePaths, nnodes: int, within_s: float = ACCOUNT_WITHIN_S) -> dict | None:
    """Node 0, when its scorers saw only a failure's echo: the first other node's account that has a cause
    of its own ({"node_rank", "status", "reason", "failing_rank", "traceback"}), or None."""
    folder = _nodes_dir(node)
    deadline = time.monotonic() + within_s
    while True:
        accounts = {r: _read(folder / f"node{r}-eval.json") for r in range(1, nnodes)}
        own = [a for a in accounts.values() if a and a.get("cause") in ("own", "death")]
        if own or all(accounts.values()) or time.monotonic() > deadline:
            return min(own, key=lambda a: a.get("node_rank", 0)) if own else None
        time.sleep(POLL_S)


def accounts(node: NodePaths, nnodes: int) -> dict[int, dict]:
    folder = _nodes_dir(node)
    return {r: a for r in range(1, nnodes) if (a := _read(folder / f"node{r}-eval.json")) is not None}


def wait_for_accounts(node: NodePaths, nnodes: int, within_s: float = ACCOUNT_WITHIN_S) -> dict[int, dict]:
    """Node 0, after an evaluation that went well: the other nodes' accounts (their model processes' times
    and flags), written as soon as their scorers end."""
    deadline = time.monotonic() + within_s
    found = accounts(node, nnodes)
    while len(found) < nnodes - 1 and time.monotonic() < deadline:
        time.sleep(POLL_S)
        found = accounts(node, nnodes)
    return found


# --------------------------------------------------------------------------- node R > 0

def join(node: NodePaths, deadline_s: float, abort=None) -> EvalPlan | None:
    """Node R: wait for node 0's offer, answer it, and return the plan if every node takes part; None when
    node 0's run ended without evaluating, node 0 evaluates alone, or nothing came by the deadline."""
    folder = _nodes_dir(node)
    deadline = time.monotonic() + deadline_s
    plan = None
    while plan is None:
        go = _read(folder / "eval-go.json")
        if go is not None:
            try:
                plan = EvalPlan(**go)
            except TypeError:
                return None
            break
        record = _read(node.run_dir / "run.json")
        if (record and record.get("status") in FINAL_STATUSES) or time.monotonic() > deadline or (abort and abort.is_set):
            return None
        time.sleep(POLL_S)
    _write(folder / f"node{node.node_rank}-eval-ready.json", {"node_rank": node.node_rank})
    # Answered: node 0 may count this node in, so wait for its word whatever the deadline says.
    deadline = max(deadline, time.monotonic() + READY_WITHIN_S + 10.0)
    while time.monotonic() < deadline and not (abort and abort.is_set):
        start = _read(folder / "eval-start.json")
        if start is not None:
            return plan if start.get("nnodes", 1) > 1 else None
        time.sleep(POLL_S)
    return None


def save_account(node: NodePaths, ev: PhaseResult, flagged: bool, flag_reason: str) -> None:
    o = ev.outcome
    _write(_nodes_dir(node) / f"node{node.node_rank}-eval.json", {
        "node_rank": node.node_rank, "status": o.status, "reason": o.reason, "cause": o.cause,
        "failing_rank": o.failing_rank, "traceback": o.traceback, "flagged": flagged, "flag_reason": flag_reason,
        "model_compute": [r.get("model_compute") for r in ev.reports("eval_result").values()],
        "left_running": [r.get("left_running") for r in ev.reports("eval_result").values()],
    })


# --------------------------------------------------------------------------- the phase, on each node

def build_eval_job(track: Track, data: PreparedData, run_dir: Path, checkpoint_sha256: str, nproc: int,
                   precision: str, vocab_out: int, protected: list[str], model_file: str = "submission.py") -> EvalJob:
    return EvalJob(
        checkpoint=str(run_dir / "checkpoint.pt"), checkpoint_sha256=checkpoint_sha256,
        submission_dir=str(run_dir / "submission"), model_file=model_file, val_shards=data.val, val_tokens=track.data.val_tokens,
        seq_len=track.eval.seq_len, batch_size=track.eval.batch_size, vocab_size=track.data.vocab_size,
        vocab_out=vocab_out, device=track.device, dtype=precision,  # the scorers' collectives are gloo's: no backend
        collective_timeout_s=max(track.collective_timeout_s, 60.0),
        cpu_threads_per_rank=threads_per_rank(track, nproc),
        causality_check=track.eval.causality_check, causality_fraction=track.eval.causality_fraction,
        causality_min_rows=rows_to_detect(track.eval.causality_detect_fraction),
        causality_tolerance=track.eval.causality_tolerance, sandbox=track.sandbox, protected=protected,
        log_dir=str(run_dir / "logs"), scratch_dir=str(scratch_root()),  # the scorers see no HARNESS_* variable
    )


def eval_caps(track: Track, nproc: int) -> Caps:
    """Evaluation's caps: the track's for the team's model processes, and room for the scorers beside them in the
    job's cgroups (harness code: the log-probabilities each keeps for the causality check, its logits buffer, the
    copy it reads, a batch's losses, and torch), the whole never past the default share of the node."""
    logits = track.eval.batch_size * track.eval.seq_len * track.data.vocab_size * 4
    node = int(node_memory_bytes(*v2_own_and_mount()) * MEMORY_SHARE_OF_NODE)
    return track_caps(track).with_room(nproc * (KEEP_BYTES + 3 * logits + (1 << 30)), node)


def _evaluate(opts, track: Track, data: PreparedData, run_dir: Path, plan: EvalPlan, nodes: int, node_rank: int,
              abort, reporter, log_path: Path) -> PhaseResult:
    """This node's part of the evaluation (all of it, with nodes == 1)."""
    job = build_eval_job(track, data, run_dir, plan.checkpoint_sha256, plan.nproc, plan.precision, plan.vocab_out,
                         protected_paths(opts.runs_dir, data), model_file=plan.model_file)
    if node_rank:
        job.log_dir = str(run_dir / "logs" / f"eval-node{node_rank}")
    # Every node answered moments ago: a rendezvous that takes more than a minute will not complete.
    multi = {"nnodes": nodes, "node_rank": node_rank, "rdzv_endpoint": opts.rdzv_endpoint, "rdzv_id": f"{run_dir.name}-eval",
             "rendezvous_timeout_s": min(track.rendezvous_timeout_s, EVAL_RENDEZVOUS_S)} if nodes > 1 else {}
    return run_evaluation(job, plan.nproc, timeout_s=track.eval.timeout_s, shutdown_timeout_s=track.shutdown_timeout_s,
                          log_path=log_path, abort=abort, reporter=reporter, caps=eval_caps(track, plan.nproc), **multi)


def evaluate_run(opts, track: Track, data: PreparedData, node: NodePaths, record: RunRecord, plan: EvalPlan, abort,
                 reporter) -> None:
    """Node 0: score the run's checkpoint on every node that answers, and put the result in the record."""
    nodes = offer(node, plan, track.nnodes) if track.nnodes > 1 else 1
    if nodes < track.nnodes:
        record.notes.append(f"evaluated on node 0 alone: not every node answered within {READY_WITHIN_S:.0f} s "
                            "(the figure is the same, only slower)")
    ev = _evaluate(opts, track, data, node.run_dir, plan, nodes, 0, abort, reporter,
                   node.run_dir / "logs" / "eval-launcher.log")
    theirs: dict[int, dict] = {}
    if nodes > 1:
        remote = remote_failure(node, nodes) if ev.outcome.cause not in ("own", "kill", "ok") else None
        if remote is not None:  # node 0's scorers saw the echo; the cause is on another node
            ev.outcome.status = remote["status"] if remote.get("status") in ("crashed", "invalid") else "crashed"
            ev.outcome.reason = f"node {remote['node_rank']}: {remote.get('reason', '')}"
            ev.outcome.failing_rank = account_rank(remote.get("failing_rank"))
            ev.outcome.traceback = account_text(remote.get("traceback"))
        if remote is None and ev.outcome.cause in ("launch", "collective", "death") and not abort.is_set:
            # Failed with no cause of the team's (a node that answered and never launched, a node lost, the
            # rendezvous): the same figure comes from node 0 alone, slower.
            record.notes.append(f"the evaluation over {nodes} nodes failed without a cause of the team's "
                                f"({ev.outcome.status}: {ev.outcome.reason}); scored again on node 0 alone")
            _write(_nodes_dir(node) / "eval-start.json", {"nnodes": 1, "retried_alone": True})
            ev = _evaluate(opts, track, data, node.run_dir, plan, 1, 0, abort, reporter,
                           node.run_dir / "logs" / "eval-launcher-alone.log")
            nodes = 1
        theirs = {} if nodes == 1 else wait_for_accounts(node, nodes) if ev.outcome.status == "ok" \
            else accounts(node, nodes)
        for r, account in sorted(theirs.items()):
            if account.get("flagged"):
                flag_run(record, f"node {r}: {account.get('flag_reason', '')}")
    # every scorer's model processes, on every node, in the slow-batch check
    apply_evaluation(record, ev, [c for a in theirs.values() for c in a.get("model_compute") or []],
                     [c for a in theirs.values() for c in a.get("left_running") or []])
    check_reports(record, ev, "evaluation")


def join_run(opts, track: Track, data: PreparedData, node: NodePaths, record: RunRecord, abort, reporter) -> None:
    """Node R > 0, its training done: take part in node 0's evaluation when it offers one."""
    node.save_report(record)  # its training's account first: node 0 merges it before it evaluates
    wait_s = track.save_allowance_s + track.checkpoint_allowance_s + PREFLIGHT_TIMEOUT_S + 120.0
    plan = join(node, wait_s, abort)
    if plan is None:
        return
    ev = _evaluate(opts, track, data, node.run_dir, plan, track.nnodes, opts.node_rank, abort, reporter,
                   node.log("eval-launcher.log"))
    scratch = RunRecord(run_id=record.run_id, team=record.team, track_name=record.track_name)
    check_model_compute(scratch, [r.get("model_compute") for r in ev.reports("eval_result").values()])
    save_account(node, ev, scratch.flagged, scratch.flag_reason)


# ------------------------------------------------------------ what evaluation's result makes of the record


def note_left_running(record: RunRecord, scorers: list) -> None:
    """Whether the team's code still had processes running when a model process was ended, on every scorer of every
    node: ended by the scorer, and said, as the training teardown says what it ended. Not how many: a count is the
    team's choice made after it saw validation tokens, and would carry that many more bits into the record."""
    for role, what in (("model", "scoring"), ("check", "check")):
        counts = [s.get(role) if isinstance(s, dict) else None for s in scorers]
        left = sum(1 for n in counts if isinstance(n, int) and not isinstance(n, bool) and n > 0)
        if left:
            record.notes.append(f"evaluation: the {what} model process's code still had processes running when it "
                                f"was ended, on {left} of {len(scorers)} scorer(s); the scorer ended them")


def apply_evaluation(record: RunRecord, ev: PhaseResult, other_nodes_compute: list = (),
                     other_nodes_left: list = ()) -> None:
    """The evaluation's outcome and figures into the record; `other_nodes_compute`: the model processes'
    times of the scorers on the other nodes (harness/launcher/run/evaluation.py), checked with this node's;
    `other_nodes_left`: what their model processes left running (note_left_running)."""
    record.extra.setdefault("containment", {})["evaluation"] = ev.containment
    o = ev.outcome
    if o.status != "ok":
        prefix = "evaluation: " if o.status != "aborted" else ""
        set_outcome(record, o.status, prefix + o.reason, o.failing_rank, o.traceback)
        return
    r0 = ev.reports("eval_result").get(0, {})
    record.eval = {k: r0.get(k) for k in ("val_tokens", "eval_world_size", "eval_time_s", "eval_tokens_per_s",
                                          "causality", "scorer_clean", "model_processes", "model_compute",
                                          "logits_buffer")}
    # every scorer's model processes, not rank 0's alone
    check_model_compute(record, [*(result.get("model_compute") for result in ev.reports("eval_result").values()),
                                 *other_nodes_compute])
    record.sandbox["evaluation"] = r0.get("sandbox") or {}
    note_left_running(record, [*(r.get("left_running") for r in ev.reports("eval_result").values()),
                               *other_nodes_left])
    exposed = r0.get("sandbox_exposed") or []
    if exposed:
        record.notes.append("the evaluation sandbox would expose protected paths under folders it allows: "
                            + ", ".join(exposed))
    value = r0.get("val_loss")
    if value is None or not math.isfinite(value):
        record.eval["unscored_val_loss"] = str(value)
        set_outcome(record, "diverged", f"evaluation: the validation loss is {value} (the trained weights produce "
                                        "non-finite logits)")
        return
    causality = r0.get("causality")
    verdict = causality_verdict(causality)
    if verdict == "non-causal":
        # The figure is kept for the audit, but it is not a result: a model that looks ahead is not scored.
        record.eval["unscored_val_loss"] = value
        set_outcome(record, "invalid", describe_noncausal(causality))
        return
    record.val_loss = value
    set_outcome(record, "ok")  # the record is final only now
    if verdict == "inconclusive":  # scored, and hidden from the ranking until a person has looked
        flag_run(record, describe_inconclusive(causality, record.run_id))
    if record.loss_floor is not None:
        record.loss_gap = record.val_loss - record.loss_floor
        check_below_floor(record, r0)


def below_floor_margin(n_tokens: int, model_token_std: float, floor_token_std: float) -> float:
    """How far below the floor a figure may fall by chance. The gap (model - source, per token) has an
    expectation >= 0 (a KL divergence); the standard error of its mean is at most (s_model + s_source)
    / sqrt(n). Five of those, and never less than 0.01 nats (neighbouring tokens of a chain are not
    independent): an honest model is below it with a probability under 1e-4."""
    return max(0.01, 5.0 * (model_token_std + floor_token_std) / math.sqrt(max(1, n_tokens)))


def check_below_floor(record: RunRecord, result: dict) -> None:
    """A figure below the true source's own loss by more than chance: no model reaches it in expectation,
    so the validation tokens reached the model somehow. Flagged for review, whatever the cause."""
    spread, floor_spread = result.get("val_loss_token_std"), record.extra.get("loss_floor_token_std")
    if spread is None or floor_spread is None:
        return
    margin = below_floor_margin(int(result.get("val_tokens") or 0), float(spread), float(floor_spread))
    record.extra["floor_check"] = {"floor": record.loss_floor, "margin": margin,
                                   "below_by": record.loss_floor - record.val_loss}
    if record.val_loss < record.loss_floor - margin:
        flag_run(record, f"the validation loss {record.val_loss:.4f} is below the data's own floor {record.loss_floor:.4f} "
                         f"by more than chance allows ({margin:.4f}): no model reaches it; did the validation tokens "
                         "reach the model?")


SLOW_BATCH_FLOOR_S, SLOW_BATCH_FACTOR = 5.0, 20.0


def check_model_compute(record: RunRecord, computes: list) -> None:
    """A model process answers each batch with one forward pass, so its batches take about the same time; one
    that took far longer than the others (SLOW_BATCH_FACTOR times the median, and SLOW_BATCH_FLOOR_S at
    least, for the first batch's warm-up) did other work there: training, off every clock, on data the
    model carried in its checkpoint (a replay buffer of training batches, trained on for 400 steps at
    its first forward, scored 2.92 against 3.37). Flagged for review. Work spread evenly over every
    batch is bounded by the evaluation timeout only (docs/rules.md). One scorer's slow batch flags the run
    once, whichever scorer it was."""
    for compute in computes:
        for role, times in (compute.items() if isinstance(compute, dict) else ()):
            if not isinstance(times, dict) or not times.get("median_s") or times.get("slowest_s") is None:
                continue
            bound = max(SLOW_BATCH_FLOOR_S, SLOW_BATCH_FACTOR * float(times["median_s"]))
            if float(times["slowest_s"]) > bound:
                flag_run(record, f"evaluation: the {role} model process took {float(times['slowest_s']):.1f} s over "
                                 f"one batch, against a median of {float(times['median_s']):.3f} s (more than "
                                 f"{bound:.1f} s): work in evaluation that is not a forward pass?")
                return


def causality_verdict(c: dict | None) -> str | None:
    """The check's verdict ("causal", "non-causal", "inconclusive"); None without a check. A record's
    causality from before the verdict existed has only `causal`."""
    if c is None:
        return None
    if c.get("verdict") in ("causal", "non-causal", "inconclusive"):
        return c["verdict"]
    return "causal" if c.get("causal", True) else "non-causal"


def describe_inconclusive(c: dict, run_id: str) -> str:
    return (f"causality inconclusive: on the scoring batches re-run with every row's tokens after a secret cut "
            f"replaced, the log-probabilities before the cut changed by up to {c['worst_deviation']:.3g} nats (more "
            f"than the {c['tolerance']:.3g} tolerance), but the check process also gave other log-probabilities, "
            f"by up to {c['reproduction_deviation']:.3g} nats, for a scoring batch it re-ran unchanged: the model "
            "does not reproduce its own output on this machine (nondeterministic kernels or atomics, kernels "
            "autotuned differently in the two processes, noise), so the check cannot tell whether it looks ahead. "
            f"Re-score it (`harness eval` on its record folder: a fresh secret sample) or read the model for "
            f"look-ahead and for what makes it nondeterministic; `harness unflag {run_id}` ranks it")


def describe_noncausal(c: dict) -> str:
    at = c.get("worst_at") or {}
    where = (f" (batch {at['batch']}, row {at['row']}, position {at['position']}, cut after {at['cut']})"
             if at else "")
    return (f"non-causal: {c['checked_batches']} of {c['batches']} scoring batches were run again with every row's "
            f"tokens after a secret cut replaced, and the log-probabilities before the cut changed by up to "
            f"{c['worst_deviation']:.3g} nats{where}, more than the {c['tolerance']:.3g} an honest model shows: "
            "the model used tokens after the position it predicts")
