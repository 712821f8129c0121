"""`harness slurm SUBMISSION --track T [--submit]`: an sbatch script that runs the track's job.
(`harness slurm --doctor --track T`: the same allocation running `harness doctor` on every node.)

One `harness run` launcher per node through srun, node 0 (the first host of the allocation)
as the rendezvous endpoint on a port of the job's own, the run id from the job id, exclusive nodes
and all their memory, a wall time that covers every limit the track itself allows (the check before
the run, start-up, budget, grace, the save allowance, the nodes' accounts, evaluation and its retry
on node 0 alone, and a margin: each part written in the script, so SLURM never ends a run the
harness would still have let finish), no requeue by SLURM, and one log per node. Every path is
absolute, for a shared file system.
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
# A job's rendezvous port is RDZV_PORT + its job id modulo this: two jobs whose first node is one host (a
# test cluster on one machine, nodes shared between runs) never meet on one port; jobs 1,000 ids apart
# would, and never run at once in a day's queue.
RDZV_PORT_SPAN = 1000
MAX_ARRAY_TASKS = 1000  # SLURM's default MaxArraySize is 1001: task ids 0..1000
# Folders that are each node's own on a cluster: a path the script names there is not what the other nodes see.
NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm", "/run")


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
    port: int | None = None  # a fixed rendezvous port; None: RDZV_PORT + the job id modulo RDZV_PORT_SPAN

    def __post_init__(self) -> None:
        if self.port is not None and not 1024 <= self.port <= 65535 - RDZV_PORT_SPAN:
            raise ValueError(f"--port must be in 1024..{65535 - RDZV_PORT_SPAN}, got {self.port}")


def wall_time_s(track: Track) -> tuple[float, dict[str, float]]:
    """The longest a run of the track can take with every phase at its own limit. On several nodes: node 0's
    wait for the other nodes' accounts (harness/launcher/run/nodes.py), its wait for their answer to the evaluation's
    offer, and the evaluation again on node 0 alone when the one over every node failed without a cause of the
    team's (harness/launcher/run/evaluation.py)."""
    from harness.launcher.run.evaluation import ACCOUNT_WITHIN_S, READY_WITHIN_S
    from harness.launcher.control.heartbeat import silent_after_s
    from harness.launcher.run.check_process import PREFLIGHT_TIMEOUT_S

    parts = {"check_s": PREFLIGHT_TIMEOUT_S, "startup_s": track.startup_timeout_s, "budget_s": track.budget_s,
             "grace_s": track.grace_s, "save_s": track.save_allowance_s}
    if track.nnodes > 1:
        parts["accounts_s"] = silent_after_s(track)
        parts["offer_s"] = READY_WITHIN_S
    parts["eval_s"] = track.eval.timeout_s
    if track.nnodes > 1:
        parts["eval_alone_s"] = track.eval.timeout_s + ACCOUNT_WITHIN_S
    parts["margin_s"] = MARGIN_S
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
    # --exclusive alone does not give the node's memory where the cluster sets a default per CPU: --mem=0 does
    lines += ["#SBATCH --exclusive", "#SBATCH --mem=0", f"#SBATCH --time={opts.time_limit or hhmmss(total)}",
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
        *_port_lines(opts),
        "",
        "# One launcher per node; SLURM_NODEID (0..N-1) is expanded on each node, not here.",
        "# shellcheck disable=SC2016  # the single quotes are the point: each task expands its own variables",
        # A step gets only the CPUs it asks for (one per task by default since SLURM 20.11): ask for the node's.
        # --wait=0: a site's WaitTime would SIGTERM node 0 a fixed time after another node's launcher ended (a node
        # that ended before training, say), and a run stopped by SIGTERM reads as the organiser's stop (a re-run).
        'srun --nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" '
        '--kill-on-bad-exit=0 --wait=0 \\',
        f"     --output={shlex.quote(str(logs))}/{node_log} \\",
        f"     bash -c 'exec \"$HARNESS_PYTHON\" -P -m harness {command}'",
        "",
    ]


def _port_lines(opts: SlurmOptions) -> list[str]:
    if opts.port is not None:
        return [f"export HARNESS_RDZV_PORT={opts.port}"]
    return [f"# The job's own port: two jobs whose first node is one host never meet on one ({RDZV_PORT} + job id "
            f"mod {RDZV_PORT_SPAN}).",
            f"export HARNESS_RDZV_PORT=$(({RDZV_PORT} + SLURM_JOB_ID % {RDZV_PORT_SPAN}))"]


def _run_command(opts: SlurmOptions, seed_arg: str, run_id: str) -> str:
    return (f'run "$HARNESS_SUBMISSION" --track "$HARNESS_TRACK" {seed_arg}--node-rank "$SLURM_NODEID" '
            f'--rdzv-endpoint "$HARNESS_RDZV_HOST:$HARNESS_RDZV_PORT" --run-id "{run_id}"')


def render(opts: SlurmOptions) -> tuple[str, Track, str]:
    track = load_track(opts.track)
    folder = find_submission(opts.submission)
    team = read_team(folder).name
    lines = _header(opts, track, f"harness-{team_slug(team)}",
                    f"# Generated by `harness slurm` for team {team!r} on track {track.name!r}.", "%x-%j.out",
                    # SLURM's own requeue would start the run again under the same run id, into a folder that
                    # holds the lost run: a lost run is run again by hand (or by a queue's --resume), with a new id.
                    ["#SBATCH --no-requeue"])
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
    from harness.launcher.doctor.comm import bench_timeout_s

    track = load_track(opts.track)
    parts = {"node_allreduce_s": bench_timeout_s(track, 1), "nodes_allreduce_s": bench_timeout_s(track, track.nnodes),
             "margin_s": MARGIN_S}
    lines = _header(opts, track, "harness-doctor", f"# Generated by `harness slurm --doctor` for track {track.name!r}: "
                    "`harness doctor` on each node; each node's table is in its own log.", "%x-%j.out", parts=parts)
    lines += ["set -euo pipefail", ""]
    lines += _launch(opts, track, "%x-%j-node%n.out", f'doctor --track "$HARNESS_TRACK" --node-rank "$SLURM_NODEID" '
                                                      '--rdzv-endpoint "$HARNESS_RDZV_HOST:$HARNESS_RDZV_PORT"')
    return "\n".join(lines), track


def node_local_warnings(opts: SlurmOptions, folders: list[Path], track: Track) -> list[str]:
    """Paths the script names that are under a folder each node has of its own (/tmp on most clusters): node 0
    would write the records where the other nodes never look, and a node would not find a submission."""
    named = {"--runs-dir": Path(opts.runs_dir), "--log-dir": Path(opts.log_dir), "the harness's python": Path(opts.python)}
    track_file = track_option(track)
    if "/" in track_file:
        named["the track file"] = Path(track_file)
    named.update({f"submission {folder.name}": folder for folder in folders})
    checkout = interpreter.harness_path({}).get("PYTHONPATH")  # a harness outside site-packages, named in the script
    if checkout:
        named["the harness (PYTHONPATH)"] = Path(checkout.split(":")[0])
    out = []
    for what, path in named.items():
        absolute = path.absolute()
        if any(absolute == Path(p) or Path(p) in absolute.parents for p in NODE_LOCAL):
            out.append(f"{what} is {absolute}, under a folder each node of a cluster has of its own: every node must "
                       "read and write the same files (a shared file system); ignore this on a cluster of one machine")
    return out


def rejected(folders: list[Path], track_name: str, runs_dir: str, say=lambda text: None) -> dict[Path, str]:
    """The submissions the check before a run would reject on this track ({folder: the first problem}), each
    checked as its run's check process will be: the track's sandbox, and the records, the board and every other
    team's folder out of its reach (this command runs each team's code on the organiser's machine). A queue
    that holds a rejected one spends an allocation on a run that ends `invalid`. A check that could not
    finish for a reason that is not the team's (its process died: killed by this machine's limits, say) is
    said and the folder queued: its run checks it again. Raises ValueError when the track requires a sandbox
    this machine does not give (then --no-check, or another machine)."""
    from harness.launcher.run.check import check
    from harness.ranks.confine.scratch import ScratchError
    from harness.results.records import leaderboard_root, runs_root
    from harness.submission.contract import SubmissionError

    track = load_track(track_name)
    out = {}
    for i, folder in enumerate(folders, 1):
        say(f"checking {i}/{len(folders)}: {folder.name} (harness check --track {track_name})")
        others = [str(f) for f in folders if f != folder]
        protected = [str(runs_root(runs_dir).resolve()), str(leaderboard_root(runs=runs_root(runs_dir)).resolve()), *others]
        try:
            result = check(str(folder), track_name, runs_dir=runs_dir, sandbox_mode=track.sandbox, protected=protected)
        except SubmissionError as exc:
            out[folder] = str(exc)
            continue
        except ScratchError:  # this machine's scratch root, not the team: the command says it
            raise
        except Exception as exc:  # noqa: BLE001 (what one team's folder does to its check is that team's, never the queue's)
            out[folder] = f"its check failed: {type(exc).__name__}: {exc}"[:2000]
            continue
        box = result.report.get("sandbox") or {}
        if track.sandbox == "required" and box.get("reported") and not box.get("active"):  # said by the process
            raise ValueError(f"checking the submissions runs each team's code here, and track {track.name!r} requires "
                             f"the sandbox, which this machine does not give ({box.get('why', 'unknown')}): run "
                             "`harness slurm` on a machine with Landlock, or pass --no-check (each run checks its "
                             "submission again before it trains)")
        if result.accepted:
            continue
        first = result.report["problems"][0]
        if "the check process died" in first["problem"]:
            say(f"warning: {folder.name} could not be checked here ({first['problem']}); queued all the same: its "
                "run checks it again")
            continue
        out[folder] = f"{first['file']}: {first['problem']}" + (f" Fix: {first['fix']}" if first.get("fix") else "")
    return out


def submit(script_path: Path) -> str:
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise RuntimeError("sbatch is not on PATH: run this on the cluster's login node, or submit the script there")
    proc = subprocess.run([sbatch, str(script_path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip()
