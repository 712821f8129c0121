"""`harness slurm SUBMISSION --track T [--submit]`: an sbatch script that runs the track's job.
(`harness slurm --doctor --track T`: the same allocation running `harness doctor` on every node.)

One `harness run` launcher per node through srun, node 0 (the first host of the allocation)
as the rendezvous endpoint, the run id from the job id, exclusive nodes, a wall time that covers
every limit the track itself allows (the check before the run, start-up, budget, grace, the save
allowance, evaluation, and a margin: each part written in the script, so SLURM never ends a run
the harness would still have let finish), and one log per node. Every path is absolute, for a
shared file system.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harness.ranks import interpreter
from harness.submission.contract import find_submission, read_team, team_slug
from harness.tracks.resolve import track_option
from harness.tracks.spec import Track, load_track

MARGIN_S = 60.0  # data preparation, writing the record, the leaderboard
RDZV_PORT = 29500
MAX_ARRAY_TASKS = 1000  # SLURM's default MaxArraySize is 1001: task ids 0..1000


@dataclass(kw_only=True)
class SlurmOptions:
    submission: str
    track: str = "paris2026"
    runs_dir: str = "runs"
    log_dir: str = "slurm-logs"
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None  # HH:MM:SS, replaces the computed wall time
    python: str = sys.executable  # the environment that has the harness, on every node
    port: int = RDZV_PORT


def wall_time_s(track: Track) -> tuple[float, dict[str, float]]:
    """The longest a run of the track can take with every phase at its own limit."""
    from harness.launcher.phases import PREFLIGHT_TIMEOUT_S

    parts = {"check_s": PREFLIGHT_TIMEOUT_S, "startup_s": track.startup_timeout_s, "budget_s": track.budget_s,
             "grace_s": track.grace_s, "save_s": track.save_allowance_s, "eval_s": track.eval.timeout_s,
             "margin_s": MARGIN_S}
    return sum(parts.values()), parts


def hhmmss(seconds: float) -> str:
    s = int(-(-seconds // 1))
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _header(opts: SlurmOptions, track: Track, job_name: str, comment: str, output: str,
            extra: list[str] = (), parts: dict[str, float] | None = None) -> list[str]:
    """The #SBATCH lines of one run's job: the track's nodes, exclusive, a wall time for every limit (`parts`,
    seconds by name; a run's by default)."""
    total, parts = (sum(parts.values()), parts) if parts else wall_time_s(track)
    gpus = track.nproc_per_node if track.device == "cuda" and isinstance(track.nproc_per_node, int) else None
    lines = ["#!/bin/bash", comment,
             f"# Wall time {hhmmss(total)} = " + " + ".join(f"{k[:-2]} {v:.0f} s" for k, v in parts.items()) + ".",
             f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={track.nnodes}", "#SBATCH --ntasks-per-node=1"]
    if gpus:
        lines.append(f"#SBATCH --gpus-per-node={gpus}")
    lines += ["#SBATCH --exclusive", f"#SBATCH --time={opts.time_limit or hhmmss(total)}",
              f"#SBATCH --output={Path(opts.log_dir).resolve()}/{output}", *extra]
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    return lines


def _pythonpath_lines() -> list[str]:
    """Every node imports the harness this command imported: `-P` keeps the job's working folder off the
    path (a `harness/` folder there would shadow it), and a harness outside the interpreter's site folders
    (an editable install, a checkout) is named on PYTHONPATH (harness/ranks/interpreter.py)."""
    root = interpreter.harness_path({}).get("PYTHONPATH")
    if not root:
        return []
    return [f"export PYTHONPATH={shlex.quote(root)}\"${{PYTHONPATH:+:$PYTHONPATH}}\""]


def _launch(opts: SlurmOptions, track: Track, node_log: str, command: str) -> list[str]:
    """The body: one `harness <command>` per node through srun (a run's launcher, or the doctor), node 0 the
    rendezvous endpoint. `command` is expanded by each task: its variables are single-quoted here."""
    logs = Path(opts.log_dir).resolve()
    return [
        "# Every node reads these paths as they are written here: keep them on a shared file system.",
        # an organiser's file by its absolute path: its name loads nothing on a node
        f"export HARNESS_TRACK={shlex.quote(track_option(track))}",
        f"export HARNESS_RUNS_DIR={shlex.quote(str(Path(opts.runs_dir).resolve()))}",
        f"export HARNESS_PYTHON={shlex.quote(opts.python)}",
        *_pythonpath_lines(),
        f"mkdir -p {shlex.quote(str(logs))} \"$HARNESS_RUNS_DIR\"",
        "",
        "# Node 0 of the allocation hosts the rendezvous and global rank 0 (which writes a run's record).",
        'HARNESS_RDZV_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export HARNESS_RDZV_HOST",
        "",
        "# One launcher per node; SLURM_NODEID (0..N-1) is expanded on each node, not here.",
        "# shellcheck disable=SC2016  # the single quotes are the point: each task expands its own variables",
        # A step gets only the CPUs it asks for (one per task by default since SLURM 20.11): ask for the node's.
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" '
        '--kill-on-bad-exit=0 \\',
        f"     --output={shlex.quote(str(logs))}/{node_log} \\",
        f"     bash -c 'exec \"$HARNESS_PYTHON\" -P -m harness {command}'",
        "",
    ]


def _run_command(opts: SlurmOptions, seed_arg: str, run_id: str) -> str:
    return (f'run "$HARNESS_SUBMISSION" --track "$HARNESS_TRACK" {seed_arg}--node-rank "$SLURM_NODEID" '
            f'--rdzv-endpoint "$HARNESS_RDZV_HOST:{opts.port}" --run-id "{run_id}"')


def render(opts: SlurmOptions) -> tuple[str, Track, str]:
    track = load_track(opts.track)
    folder = find_submission(opts.submission)
    team = read_team(folder).name
    lines = _header(opts, track, f"harness-{team_slug(team)}",
                    f"# Generated by `harness slurm` for team {team!r} on track {track.name!r}.", "%x-%j.out")
    lines += ["set -euo pipefail", "", f"export HARNESS_SUBMISSION={shlex.quote(str(folder))}"]
    lines += _launch(opts, track, "%x-%j-node%n.out", _run_command(opts, "", "$SLURM_JOB_ID"))
    return "\n".join(lines), track, team


def render_queue(opts: SlurmOptions, runs: list[tuple[Path, str, int]], max_concurrent: int | None = None) -> tuple[str, Track]:
    """A queue of runs ([(submission folder, team, seed)]) as one SLURM job array: each task is one run on
    the track's nodes, exclusive (two runs never share a node), SLURM starting the next as nodes free up
    (at most `max_concurrent` at once, when given). The run id is the array job's id and the task's."""
    if not runs:
        raise ValueError("the queue has no run left to do")
    if len(runs) > MAX_ARRAY_TASKS:
        raise ValueError(f"{len(runs)} runs are more than a SLURM job array takes by default ({MAX_ARRAY_TASKS}, "
                         "MaxArraySize): write the queue in parts (a few submissions at a time)")
    track = load_track(opts.track)
    limit = f"%{max_concurrent}" if max_concurrent else ""
    teams = sorted({team for _, team, _ in runs})
    lines = _header(opts, track, "harness-queue",
                    f"# Generated by `harness slurm` for a queue of {len(runs)} run(s) of {len(teams)} team(s) on track "
                    f"{track.name!r}: one array task per team x seed.", "%x-%A_%a.out",
                    # SLURM's own requeue would start the task again under the same run id, into a folder that
                    # holds the lost run: --resume is how a lost run is run again, with a new id.
                    [f"#SBATCH --array=0-{len(runs) - 1}{limit}", "#SBATCH --no-requeue"])
    lines += [
        "set -euo pipefail",
        "",
        "# Task i runs SUBMISSIONS[i] with SEEDS[i].",
        "SUBMISSIONS=(" + " ".join(shlex.quote(str(folder)) for folder, _, _ in runs) + ")",
        "SEEDS=(" + " ".join(str(seed) for _, _, seed in runs) + ")",
        'export HARNESS_SUBMISSION="${SUBMISSIONS[$SLURM_ARRAY_TASK_ID]}"',
        'export HARNESS_SEED="${SEEDS[$SLURM_ARRAY_TASK_ID]}"',
        'export HARNESS_RUN_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
    ]
    lines += _launch(opts, track, "%x-%A_%a-node%n.out", _run_command(opts, '--seed "$HARNESS_SEED" ', "$HARNESS_RUN_ID"))
    return "\n".join(lines), track


def render_doctor(opts: SlurmOptions) -> tuple[str, Track]:
    """`harness doctor` on every node of one run's allocation (the track's nodes, exclusive, its GPUs), the day
    before: each node's table in its own log, the all-reduce between the nodes through node 0, and a job that
    fails (srun's exit status) when any node fails a check."""
    from harness.launcher.doctor_comm import bench_timeout_s

    track = load_track(opts.track)
    parts = {"node_allreduce_s": bench_timeout_s(track, 1), "nodes_allreduce_s": bench_timeout_s(track, track.nnodes),
             "margin_s": MARGIN_S}
    lines = _header(opts, track, "harness-doctor", f"# Generated by `harness slurm --doctor` for track {track.name!r}: "
                    "`harness doctor` on each node; each node's table is in its own log.", "%x-%j.out", parts=parts)
    lines += ["set -euo pipefail", ""]
    lines += _launch(opts, track, "%x-%j-node%n.out", f'doctor --track "$HARNESS_TRACK" --node-rank "$SLURM_NODEID" '
                                                      f'--rdzv-endpoint "$HARNESS_RDZV_HOST:{opts.port}"')
    return "\n".join(lines), track


def submit(script_path: Path) -> str:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise RuntimeError("sbatch is not on PATH: run this on the cluster's login node, or submit the script there")
    proc = subprocess.run([sbatch, str(script_path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()
