"""`harness scale SUBMISSION --world-sizes 1,2,4`: weak-scaling throughput, measured and extrapolated.

At each world size N the submission trains for a fixed number of steps (same per-rank batch,
outside any budget) through the same training loop as `harness run`; the throughput after warm-up
gives the step time t(N) and efficiency(N) = tokens/s at N / (N x tokens/s at 1) = t(1) / t(N).
The time a step loses to communication at N is t(N) - t(1). A model of it, the ring
all-reduce's a + b * 2(N-1)/N, is fitted to those points (scipy) and predicts the efficiency
t(1) / (t(1) + a + b * 2(N-1)/N) at the track's world size and at 32, 64 and 256 devices: a
prediction, stated with the measurements it was fitted to. Each size also runs the
synchronised vs no_sync probe of `harness run` (`probe_comm_s`): the all-reduce time when
nothing overlaps it, for reference.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.launcher.console import NullReporter
from harness.submission.contract import find_submission, read_team, snapshot_submission, team_slug
from harness.data.prepare import prepare_data
from harness.ranks.jobs import TrainJob
from harness.launcher.elastic import LaunchSpec
from harness.launcher.phases import run_preflight, run_training
from harness.launcher.precision import resolve_precision
from harness.results.records import new_run_id, runs_root, utc_now, write_atomic
from harness.launcher.runner import resolve_nproc
from harness.tracks.spec import load_track
from harness.launcher.watch import Deadlines, abort_on_signals

PREDICT_AT = (32, 64, 256)


@dataclass(kw_only=True)
class ScaleOptions:
    submission: str
    track: str = "local"
    world_sizes: list[int] = field(default_factory=lambda: [1, 2])
    steps: int = 20
    warmup_steps: int = 3
    probe_steps: int = 6
    seed: int = 1
    runs_dir: str | None = None
    data_root: str | None = None

    def __post_init__(self) -> None:
        if not self.world_sizes or any(n < 1 for n in self.world_sizes):
            raise ValueError("--world-sizes must be positive integers, e.g. 1,2,4")
        if 1 not in self.world_sizes:  # efficiency is relative to one device
            self.world_sizes = [1, *self.world_sizes]
        self.world_sizes = sorted(set(self.world_sizes))
        if self.steps < 1 or self.warmup_steps < 0 or self.probe_steps < 1:
            raise ValueError("--steps and --probe-steps must be >= 1, --warmup-steps >= 0")


def comm_model(x: np.ndarray, a: float, b: float) -> np.ndarray:
    return a + b * x


def fit_comm(points: list[dict]) -> dict:
    """Fit all-reduce time = a + b * 2(N-1)/N to the measured (N > 1) points; a, b >= 0."""
    from scipy.optimize import curve_fit

    usable = [p for p in points if p["world_size"] > 1 and p.get("overhead_s") is not None]
    inputs = [{"world_size": p["world_size"], "x": 2 * (p["world_size"] - 1) / p["world_size"],
               "comm_s": max(0.0, p["overhead_s"])} for p in usable]
    if not inputs:
        return {"a_s": None, "b_s": None, "inputs": [], "note": "no world size above 1 was measured: nothing to fit"}
    x = np.array([i["x"] for i in inputs])
    y = np.array([i["comm_s"] for i in inputs])
    if len(set(x.tolist())) < 2:  # one distinct point: a line through it and the origin (a = 0)
        b = float(y.mean() / x.mean()) if x.mean() > 0 else 0.0
        return {"a_s": 0.0, "b_s": max(0.0, b), "inputs": inputs, "stderr": None,
                "note": "one world size above 1: fitted b only (a = 0); measure more sizes for a real fit"}
    import warnings

    with warnings.catch_warnings():  # two points fit exactly: no covariance, which the note says
        warnings.simplefilter("ignore")
        (a, b), cov = curve_fit(comm_model, x, y, p0=[max(0.0, float(y.min())), 0.0],
                                bounds=([0, 0], [np.inf, np.inf]))
    stderr = np.sqrt(np.diag(cov)).tolist() if np.all(np.isfinite(cov)) else None
    residual = float(np.sqrt(np.mean((comm_model(x, a, b) - y) ** 2)))
    if residual > 0.1 * max(float(np.abs(y).max()), 1e-9):
        note = (f"the model fits poorly (rms residual {1000 * residual:.1f} ms): the overhead is not the all-reduce "
                "alone (more ranks than cores? a straggler?)")
    elif len(x) == 2:
        note = "exactly determined (2 points): no spread"
    else:
        note = ""
    return {"a_s": float(a), "b_s": float(b), "inputs": inputs, "stderr": stderr, "rms_residual_s": residual,
            "note": note}


def predict(fit: dict, compute_step_s: float, world_sizes: list[int]) -> dict:
    if fit.get("b_s") is None or compute_step_s <= 0:
        return {}
    out = {}
    for n in world_sizes:
        comm = fit["a_s"] + fit["b_s"] * 2 * (n - 1) / n if n > 1 else 0.0
        out[str(n)] = compute_step_s / (compute_step_s + comm)
    return out


def run_scale(opts: ScaleOptions, reporter=None) -> tuple[dict, Path]:
    reporter = reporter or NullReporter()
    track = load_track(opts.track)
    nproc = resolve_nproc(track)  # the track's own ranks per node: where the prediction matters
    folder = find_submission(opts.submission)
    data = prepare_data(track, opts.data_root, say=reporter.info)
    team = read_team(folder)
    scale_id = "scale-" + new_run_id()
    out_dir = runs_root(opts.runs_dir) / track.name / team_slug(team.name) / scale_id
    (out_dir / "logs").mkdir(parents=True)
    sha = snapshot_submission(folder, out_dir / "submission")
    precision, _ = resolve_precision(track.dtype, track.device)
    report = run_preflight(out_dir / "submission", vocab_size=track.data.vocab_size, device=track.device,
                           seed=opts.seed, log_path=out_dir / "logs" / "preflight.log", eval_seq_len=track.eval.seq_len,
                           precision=precision)
    if not report["ok"]:
        p = report["problems"][0]
        raise ValueError(f"the submission is invalid: {p['file']}: {p['problem']}")
    # The same threads per rank at every size: on a CPU, one "device" is a fixed share of the cores.
    threads = max(1, (os.cpu_count() or 1) // max(opts.world_sizes))
    points = []
    with abort_on_signals() as abort:
        for n in opts.world_sizes:
            reporter.info(f"world size {n}: {opts.warmup_steps} warm-up + {opts.steps} timed steps, "
                          f"then {opts.probe_steps} sync/no-sync probe pairs")
            job = TrainJob(
                run_id=f"{scale_id}-n{n}", track=track.name, submission_dir=str(out_dir / "submission"),
                seed=opts.seed, budget_s=1e9, clock_start="first_forward", backend=track.backend,
                device=track.device, dtype=precision, log_interval_s=0.5,
                collective_timeout_s=track.collective_timeout_s, cpu_threads_per_rank=threads,
                vocab_size=track.data.vocab_size, train_shards=data.train, log_dir=str(out_dir / "logs" / f"n{n}"),
                max_steps=opts.warmup_steps + opts.steps, warmup_steps=opts.warmup_steps,
                comm_probe_steps=opts.probe_steps,
            )
            launch = LaunchSpec(module="harness.ranks.train", args=[], nproc_per_node=n, rdzv_id=job.run_id,
                                shutdown_timeout_s=track.shutdown_timeout_s, threads_per_rank=job.cpu_threads_per_rank)
            deadlines = Deadlines(startup_timeout_s=track.startup_timeout_s, startup_allowance_s=track.startup_allowance_s,
                                  hard_limit_s=3600.0, save_allowance_s=track.save_allowance_s)
            phase = run_training(job, launch, deadlines=deadlines, log_path=out_dir / "logs" / f"launcher-n{n}.log",
                                 abort=abort, reporter=reporter)
            if phase.outcome.status != "ok":
                raise RuntimeError(f"world size {n} ended {phase.outcome.status}: {phase.outcome.reason} "
                                   f"(logs in {out_dir / 'logs'})")
            r0 = phase.reports("result")[0]
            tps = r0["measured_tokens_per_s"]
            cores = os.cpu_count() or 1
            if track.device == "cpu" and n * threads > cores:
                reporter.info(f"note: {n} ranks x {threads} thread(s) on {cores} cores: oversubscribed, "
                              "this size measures CPU contention as much as communication")
            points.append({"world_size": n, "oversubscribed": track.device == "cpu" and n * threads > cores,
                           "tokens_per_s": tps, "tokens_per_step": r0["tokens_per_step"],
                           "step_s": r0["tokens_per_step"] / tps, "probe_comm_s": r0.get("comm_s"),
                           "probe_comm_overlap_efficiency": r0.get("comm_overlap_efficiency"), "device_name": r0.get("device_name")})
    base = points[0]
    for p in points:
        p["efficiency"] = p["tokens_per_s"] / (p["world_size"] * base["tokens_per_s"])
        p["overhead_s"] = p["step_s"] - base["step_s"]
    fit = fit_comm(points)
    compute = base["step_s"]
    targets = sorted({track.nnodes * nproc, *PREDICT_AT, *opts.world_sizes})
    record = {
        "kind": "scale", "scale_id": scale_id, "team": team.name, "track": track.name, "submission_sha256": sha,
        "created_at": utc_now(), "device_name": points[0].get("device_name"), "precision": precision, "steps": opts.steps,
        "threads_per_rank": threads if track.device == "cpu" else None,
        "warmup_steps": opts.warmup_steps, "probe_steps": opts.probe_steps, "points": points, "fit": fit,
        "prediction": {
            "efficiency": predict(fit, compute, targets), "compute_step_s": compute,
            "note": (f"Predicted from the step-time overhead measured at world sizes "
                     f"{[i['world_size'] for i in fit.get('inputs', [])]} on {points[0].get('device_name')}; "
                     "links between nodes (and between GPUs) differ from these, so treat the figures beyond the "
                     "measured sizes as a model, not a measurement."),
        },
    }
    write_atomic(out_dir / "scale.json", json.dumps(record, indent=2) + "\n")
    _chart(record, out_dir / "scale.png")
    return record, out_dir


def _chart(record: dict, path: Path) -> None:
    from harness.results.plots import save_png
    from harness.results.rate_charts import scaling_figure

    save_png(scaling_figure(record["track"], [record], assumptions=True), path)
