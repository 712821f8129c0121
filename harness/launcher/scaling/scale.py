"""`harness scale SUBMISSION --world-sizes 1,2,4`: weak-scaling efficiency, measured and predicted.

At each world size N the submission trains for a fixed number of steps (same per-rank batch,
outside any budget) through the same training loop as `harness run`; the throughput after
warm-up gives the step time t(N) and the measured weak-scaling efficiency(N) = tokens/s at N /
(N x tokens/s at 1) = t(1) / t(N). Each size also runs the communication probe of `harness run`
(synchronised vs no_sync steps) for reference: a different quantity (comm overlap efficiency).

The prediction beyond what was measured is harness/launcher/scaling/comm_model.py's: DDP's bucketed
all-reduce (ring, tree or hierarchical, with latency and bandwidth terms, inside and between
nodes) against the backward it overlaps, from the measured step time and parameter count and
the track's stated links. The intra-node link is fitted to the measured overheads when the
measurement ran on the track's kind of device and can support a fit (comm_model.fit_refusal: not
overheads within the noise of the step times, nor ones the probe does not find as communication);
the inter-node one is never seen from one node and is the track's. The record says which figure
came from where, and why a fit was refused.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.launcher.control.job_cgroup import track_caps
from harness.launcher.scaling import comm_model
from harness.launcher.control import process_tree
from harness.launcher.run.console import NullReporter
from harness.submission.contract import find_submission, read_team, snapshot_submission
from harness.data.prepare import prepare_data
from harness.ranks.jobs import TrainJob
from harness.ranks.confine.scratch import refuse_unusable
from harness.launcher.control.elastic import LaunchSpec
from harness.launcher.run.check_process import run_preflight
from harness.launcher.run.phases import run_training
from harness.tracks.precision import resolve_precision
from harness.results.records import new_run_id, runs_root, utc_now, write_atomic
from harness.launcher.run.identity import resolve_identity
from harness.launcher.run.runner import resolve_nproc
from harness.tracks.spec import load_track
from harness.launcher.control.watch import Deadlines, abort_on_signals

PREDICT_AT = (8, 16, 32, 64, 128, 256)
HIDDEN_BY_PROBE = 0.97  # a probe ratio at least this close to 1: no exposed communication, within timing noise
# Rank 0 reports every step (the spread of the step times decides whether the link can be fitted); the channel
# takes 20,000 messages and 4 MiB a rank, and 5,000 reports of ~200 bytes stay well under both.
MAX_STEPS = 5_000


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
        if self.warmup_steps + self.steps > MAX_STEPS:
            raise ValueError(f"--warmup-steps + --steps must be at most {MAX_STEPS:,} (every step is reported)")


def run_scale(opts: ScaleOptions, reporter=None) -> tuple[dict, Path]:
    reporter = reporter or NullReporter()
    refuse_unusable()  # the check process's private folder goes there
    track = load_track(opts.track)
    nproc = resolve_nproc(track)  # the track's own ranks per node: where the prediction matters
    folder = find_submission(opts.submission)
    team = read_team(folder)
    # Who the team is, as for a run (identity.py): a scaling chart under another folder's name would be shown as
    # that team's on the board's scaling view
    identity = resolve_identity(runs_root(opts.runs_dir), team.name, folder)
    if identity.refused:
        raise ValueError(f"not measured: {identity.refused}")
    data = prepare_data(track, opts.data_root, say=reporter.info)
    scale_id = "scale-" + new_run_id()
    out_dir = runs_root(opts.runs_dir) / track.name / identity.records_folder / scale_id
    (out_dir / "logs").mkdir(parents=True)
    sha = snapshot_submission(folder, out_dir / "submission")
    precision, _ = resolve_precision(track.dtype, track.device)
    report = run_preflight(out_dir / "submission", vocab_size=track.data.vocab_size, device=track.device,
                           seed=opts.seed, log_path=out_dir / "logs" / "preflight.log", eval_seq_len=track.eval.seq_len,
                           precision=precision, caps=track_caps(track))
    if not report["ok"]:
        p = report["problems"][0]
        raise ValueError(f"the submission is invalid: {p['file']}: {p['problem']}")
    params = int(report.get("params") or 0)
    # The same threads per rank at every size: on a CPU, one "device" is a fixed share of the cores.
    threads = max(1, process_tree.usable_cpus() // max(opts.world_sizes))
    points = []
    with abort_on_signals() as abort:
        for n in opts.world_sizes:
            reporter.info(f"world size {n}: {opts.warmup_steps} warm-up + {opts.steps} timed steps, "
                          f"then {opts.probe_steps} sync/no-sync probe pairs")
            job = TrainJob(
                run_id=f"{scale_id}-n{n}", track=track.name, submission_dir=str(out_dir / "submission"),
                seed=opts.seed, budget_s=1e9, clock_start="first_forward", backend=track.backend,
                device=track.device, dtype=precision, log_interval_s=0.0,  # a progress report every step
                collective_timeout_s=track.collective_timeout_s, cpu_threads_per_rank=threads,
                vocab_size=track.data.vocab_size, train_shards=data.train, log_dir=str(out_dir / "logs" / f"n{n}"),
                max_steps=opts.warmup_steps + opts.steps, warmup_steps=opts.warmup_steps,
                comm_probe_steps=opts.probe_steps, ddp=asdict(track.ddp),
            )
            launch = LaunchSpec(module="harness.ranks.training.train", args=[], nproc_per_node=n, rdzv_id=job.run_id,
                                shutdown_timeout_s=track.shutdown_timeout_s, threads_per_rank=job.cpu_threads_per_rank,
                                caps=track_caps(track))
            deadlines = Deadlines(startup_timeout_s=track.startup_timeout_s, startup_allowance_s=track.startup_allowance_s,
                                  hard_limit_s=3600.0, save_allowance_s=track.save_allowance_s)
            phase = run_training(job, launch, deadlines=deadlines, log_path=out_dir / "logs" / f"launcher-n{n}.log",
                                 abort=abort, reporter=reporter)
            if phase.outcome.status != "ok":
                raise RuntimeError(f"world size {n} ended {phase.outcome.status}: {phase.outcome.reason} "
                                   f"(logs in {out_dir / 'logs'})")
            r0 = phase.reports("result")[0]
            tps = r0["measured_tokens_per_s"]
            step_times = timed_step_times(phase.messages, opts.warmup_steps)
            cores = process_tree.usable_cpus()
            if track.device == "cpu" and n * threads > cores:
                reporter.info(f"note: {n} ranks x {threads} thread(s) on {cores} cores: oversubscribed, "
                              "this size measures CPU contention as much as communication")
            points.append({"world_size": n, "oversubscribed": track.device == "cpu" and n * threads > cores,
                           "tokens_per_s": tps, "tokens_per_step": r0["tokens_per_step"],
                           "step_s": r0["tokens_per_step"] / tps, "step_s_samples": len(step_times),
                           "step_s_spread": comm_model.step_spread_s(step_times),
                           "probe_comm_s": r0.get("comm_s"),
                           "probe_comm_overlap_efficiency": r0.get("comm_overlap_efficiency"),
                           "probe_compute_step_s": r0.get("comm_probe_compute_step_s"),
                           "device_name": r0.get("device_name")})
    base = points[0]
    for p in points:
        p["weak_scaling_efficiency"] = p["tokens_per_s"] / (p["world_size"] * base["tokens_per_s"])
        p["overhead_s"] = p["step_s"] - base["step_s"]
    model = build_model(track, nproc, points, params)
    summary = model.pop("summary")
    notes = measurement_notes(points)
    for note in notes:
        reporter.info(f"note: {note}")
    targets = sorted({1, track.nnodes * nproc, *PREDICT_AT, *opts.world_sizes})
    record = {
        "kind": "scale", "schema_version": 2, "scale_id": scale_id, "team": identity.name, "track": track.name,
        "submission_sha256": sha, "created_at": utc_now(), "device_name": points[0].get("device_name"),
        "precision": precision, "steps": opts.steps, "threads_per_rank": threads if track.device == "cpu" else None,
        "warmup_steps": opts.warmup_steps, "probe_steps": opts.probe_steps, "params": params,
        "track_world_size": track.nnodes * nproc, "points": points, "notes": notes, "model": summary,
        "prediction": comm_model.predict(targets, **model),
    }
    write_atomic(out_dir / "scale.json", json.dumps(record, indent=2) + "\n")
    _chart(record, out_dir / "scale.png")
    return record, out_dir


def timed_step_times(messages, warmup_steps: int) -> list[float]:
    """Each timed step's duration, seconds, from rank 0's progress reports (one a step here): the time between
    the agreements that start two consecutive steps, after warm-up. A report the launcher could not take leaves
    a gap, and the two steps around it out."""
    reports = sorted((m.body for m in messages if m.kind == "progress" and m.body.get("rank") == 0),
                     key=lambda body: body["step"])
    return [b["train_time_s"] - a["train_time_s"] for a, b in zip(reports, reports[1:])
            if a["step"] >= warmup_steps and b["step"] == a["step"] + 1]


def measurement_notes(points: list[dict]) -> list[str]:
    """What a reader should know before trusting the measured points: readings the probe contradicts, and
    efficiencies above 1 (the one-device measurement was the slow one)."""
    notes = []
    for p in points[1:]:
        eff, probe = p["weak_scaling_efficiency"], p.get("probe_comm_overlap_efficiency")
        if eff > 1.05:
            notes.append(f"{eff:.3f} at {p['world_size']} is above 1: the one-device measurement ran slower per "
                         "device (a busy machine, caches); measure again, with more --steps")
        elif probe is not None and probe >= HIDDEN_BY_PROBE and eff < 0.9:
            notes.append(f"at {p['world_size']} the probe found no exposed all-reduce ({probe:.3f}) while throughput "
                         f"per device fell to {eff:.3f}: the loss is not communication (ranks competing for cores?)")
    return notes


def build_model(track, nproc: int, points: list[dict], params: int) -> dict:
    """The model's inputs: measured step time and gradient bytes, the track's links, the intra-node link
    fitted to the measurement where it ran on the track's kind of device. Returns predict()'s keyword
    arguments and a `summary` for the record that states every assumption."""
    base = points[0]
    step_s = base["step_s"]
    fwd_bwd = base.get("probe_compute_step_s")
    backward_s = comm_model.BACKWARD_SHARE * (fwd_bwd if fwd_bwd else step_s)
    grad_bytes = comm_model.GRAD_BYTES_PER_PARAM * params
    stated = comm_model.Links.from_interconnect(track.interconnect, nproc)
    fit = comm_model.fit_intra_node(points, backward_s=backward_s, grad_bytes=grad_bytes, links=stated)
    device = str(base.get("device_name") or "")
    same_kind = (track.device == "cpu") == (device == "cpu") and (
        not track.device_peak or track.device_peak == "auto" or track.device_peak.upper() in device.upper())
    links, source = stated, "the track's [interconnect]"
    # The probe times synchronised against compute-only steps at each size: where it finds the all-reduce
    # hidden, the measured overhead t(N) - t(1) is something else (CPU contention, a step that is slower with
    # more ranks), and fitting it to the link would blame the link.
    probed = [p for p in points if p["world_size"] > 1 and p.get("probe_comm_overlap_efficiency") is not None]
    hidden = bool(probed) and all(p["probe_comm_overlap_efficiency"] >= HIDDEN_BY_PROBE for p in probed)
    if fit["links"] is not None and hidden:
        seen = ", ".join(f"{p['probe_comm_overlap_efficiency']:.3f} at {p['world_size']}" for p in probed)
        fit["note"] = (f"not used: the communication probe found no exposed all-reduce ({seen}), so the step-time "
                       "overhead is not the link (CPU contention? a slower step with more ranks?); the intra-node "
                       "figures are the track's")
    elif fit["links"] is not None and same_kind:
        links, source = fit["links"], f"fitted to the overheads measured on {device}"
    elif fit["links"] is not None:
        fit["note"] = (f"measured on {device}, the track runs {track.device_peak}: the fit is shown, the track's "
                       "intra-node figures are used")
    fit_out = {k: v for k, v in fit.items() if k != "links"}
    if fit["links"] is not None:
        fit_out["links"] = fit["links"].describe()
    summary = {
        "step_s": step_s, "backward_s": backward_s, "grad_bytes": grad_bytes, "params": params,
        "links": links.describe(), "track_links": stated.describe(), "intra_node_from": source,
        "inter_node_from": "the track's [interconnect] (one node cannot measure it)", "fit": fit_out,
        "assumptions": [
            f"step time t(1) = {1000 * step_s:.2f} ms measured at 1 device on {device}",
            f"gradients fp32: {grad_bytes / 1e6:.1f} MB all-reduced per step ({params:,} parameters x 4 bytes)",
            f"backward = 2/3 of forward + backward ({1000 * backward_s:.2f} ms), producing gradients at a constant rate",
            "DDP buckets of 25 MiB (the first 1 MiB), all-reduced one at a time as the backward fills them",
            "the fastest of ring, tree and hierarchical all-reduce, alpha-beta costs (NCCL's tuner constants)",
            f"nodes of {nproc} devices; intra-node link {source}; inter-node link the track's",
        ],
    }
    return {"step_s": step_s, "backward_s": backward_s, "grad_bytes": grad_bytes, "links": links,
            "summary": summary}


def _chart(record: dict, path: Path) -> None:
    """scale.png beside the record (runs/<track>/<team>/scale-<id>/), the team in its colour on the track's charts."""
    from harness.results.charts.colors import track_colors
    from harness.results.charts.kit import save_png
    from harness.results.charts.rate_charts import scaling_figure

    colors = track_colors(path.parents[3], record["track"])  # the runs root
    save_png(scaling_figure(record["track"], [record], assumptions=True, colors=colors), path)


def scale_lines(record: dict, out_dir: Path) -> list[str]:
    """What `harness scale` prints: the measurements, then the prediction with what it assumed."""
    lines = [f"measured on {record.get('device_name')} (weak scaling: same per-device batch at every size)",
             f"{'world size':>10}  {'tokens/s':>10}  {'step ms':>8}  {'weak-scaling eff.':>17}  {'overhead ms':>11}  "
             f"{'probe comm overlap':>18}"]
    for p in record["points"]:
        probe = p.get("probe_comm_overlap_efficiency")
        lines.append(f"{p['world_size']:>10}  {p['tokens_per_s']:>10,.0f}  {1000 * p['step_s']:>8.1f}  "
                     f"{p['weak_scaling_efficiency']:>17.3f}  {1000 * p['overhead_s']:>11.2f}  "
                     f"{'-' if probe is None else format(probe, '.3f'):>18}"
                     + ("  (oversubscribed)" if p.get("oversubscribed") else ""))
    for note in record.get("notes", []):
        lines.append(f"note: {note}")
    model = record["model"]
    fit = model.get("fit") or {}
    lines.append("")
    lines.append("PREDICTION (a model, not a measurement): weak-scaling efficiency = t(1) / (t(1) + exposed comm)")
    for a in model["assumptions"]:
        lines.append(f"  - {a}")
    if fit.get("refused"):
        lines.append(f"  - fit refused: {fit['refused']}; the prediction uses the track's intra-node figures")
    elif fit.get("links") and model["intra_node_from"].startswith("fitted"):
        f = fit["links"]
        lines.append(f"  - fit: intra-node {f['intra_gb_per_s']:.3g} GB/s, {f['intra_latency_us']:.3g} us a step "
                     f"(rms residual {1000 * fit['rms_residual_s']:.2f} ms)" + (f"; {fit['note']}" if fit.get("note") else ""))
    elif fit.get("note"):
        lines.append(f"  - fit: {fit['note']}")
    lines.append(f"{'devices':>8}  {'nodes x per node':>16}  {'algorithm':>12}  {'comm ms':>8}  {'exposed ms':>10}  "
                 f"{'predicted eff.':>14}")
    for n, p in sorted(record["prediction"].items(), key=lambda kv: int(kv[0])):
        shape = f"{p['nodes']} x {p['devices_per_node']}"
        lines.append(f"{n:>8}  {shape:>16}  {p['algorithm']:>12}  "
                     f"{1000 * p['comm_s']:>8.2f}  {1000 * p['exposed_s']:>10.2f}  {p['efficiency']:>14.3f}")
    lines.append(f"record {out_dir / 'scale.json'}, chart {out_dir / 'scale.png'}")
    return lines
