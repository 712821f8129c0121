"""`harness rehearse SUBMISSION... --track T`: the event's day on one machine, the week before.

A real SLURM cluster is started on this machine (slurm_cluster.sh: slurmctld and one slurmd per node),
every team x seed is queued as `harness slurm` queues it (one job array, one run per task, exclusive
nodes), faults are injected on request while it runs (harness/launcher/event/faults.py: a node lost, the
organiser's scancel, a stalled file system, a full scratch, a team that hangs), the queue is resumed
round after round as an organiser would (`harness slurm --resume`: what was lost, never what a team
failed), the board is built, the cluster stopped, and a report says what happened to each entry and
whether each fault ended as it must.

Runs in the `harness` process as root (it starts SLURM's daemons and mounts file systems); the runs
themselves are `harness run` launchers started by SLURM, as on the day. Everything it makes is in the
work folder: runs/, slurm-logs/, leaderboard/, plots/, the sbatch scripts, report.md and report.json.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.launcher.event.cluster import ClusterError, one_machine, submitted_job_id, wait_for_job
from harness.launcher.event.faults import FAULTS, HANG_TEAM, FaultPlan, Task, write_hang_team
from harness.launcher.event.queue import DONE, FAILED, Queue, build_queue, pending, state_of, records_of
from harness.launcher.event.slurm import SlurmOptions, render_queue, submit, wall_time_s
from harness.launcher.control.workarea import patched_environ
from harness.ranks.confine.scratch import SCRATCH_ENV
from harness.tracks.resolve import track_option
from harness.tracks.spec import Track, load_track

FS_IMAGE_GIB = 2  # the loop-mounted records file system of `fs-stall` (a sparse file)


@dataclass(kw_only=True)
class RehearsalOptions:
    submissions: tuple[str, ...]
    track: str
    workdir: str = "rehearsal"
    repeat: int = 2
    seed: int = 1
    faults: tuple[str, ...] = ()
    max_concurrent: int = 1
    nodes: int | None = None  # the cluster's size; default: the track's nodes x max_concurrent
    max_rounds: int = 3
    stall_s: float | None = None  # default: the track's lost_after_s + 2 s, so that a stall outlasts a loss
    keep_cluster: bool = False

    def __post_init__(self) -> None:
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault(s) {', '.join(unknown)}: the faults are {', '.join(FAULTS)}")
        if not self.submissions:
            raise ValueError("give the SUBMISSION folders of the teams to rehearse with")
        if self.repeat < 1 or self.max_rounds < 1 or self.max_concurrent < 1:
            raise ValueError("--repeat, --max-rounds and --max-concurrent must be at least 1")
        if self.stall_s is not None and self.stall_s <= 0:
            raise ValueError("--stall-s must be positive")


@dataclass
class EntryOutcome:
    team: str
    seed: int
    state: str  # the queue's: done, failed, lost, stuck, queued
    attempts: list[dict] = field(default_factory=list)  # {run_id, status, reason}, oldest first
    expected: str = ""  # what this entry must end as
    as_expected: bool = True


@dataclass
class RehearsalReport:
    track: str
    workdir: str
    nodes: int
    rounds: list[dict] = field(default_factory=list)  # {round, array, tasks, seconds}
    entries: list[EntryOutcome] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)  # injections, each with its verdict
    board: list[dict] = field(default_factory=list)  # {rank, team, val_loss, status}
    leaderboard: str = ""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)  # what did not end as it must

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def _need_root() -> None:
    if os.geteuid() != 0:
        raise ValueError("harness rehearse starts SLURM's daemons and mounts file systems: run it as root (a machine "
                         "of its own, the week before)")


class Mounts:
    """The file systems a rehearsal mounts for its faults, always unmounted at the end."""

    def __init__(self) -> None:
        self.mounted: list[Path] = []
        self.made: list[Path] = []

    def loop_ext4(self, image: Path, at: Path, gib: int) -> Path:
        image.parent.mkdir(parents=True, exist_ok=True)
        with open(image, "wb") as f:
            f.truncate(gib << 30)
        self._sh(["mkfs.ext4", "-q", "-F", str(image)])
        at.mkdir(parents=True, exist_ok=True)
        self._sh(["mount", "-o", "loop", str(image), str(at)])
        self.mounted.append(at)
        return at

    def tmpfs(self, size_bytes: int) -> Path:
        # a short path: the ranks' sockets are made under the scratch root (harness/ranks/confine/scratch.py)
        at = Path(tempfile.mkdtemp(prefix="hrs-", dir="/tmp"))
        self._sh(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=1777", "tmpfs", str(at)])
        self.mounted.append(at)
        self.made.append(at)
        return at

    @staticmethod
    def _sh(argv: list[str]) -> None:
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed: {(proc.stderr or proc.stdout).strip()} (the fault needs "
                               "root and, for fs-stall, loop devices)")

    def close(self) -> None:
        for at in reversed(self.mounted):
            subprocess.run(["fsfreeze", "-u", str(at)], capture_output=True)  # never leave one frozen
            if subprocess.run(["umount", str(at)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(at)], capture_output=True)
        for at in self.made:
            shutil.rmtree(at, ignore_errors=True)
        self.mounted, self.made = [], []


def _entries(opts: RehearsalOptions, workdir: Path, runs_root: Path):
    honest = build_queue(list(opts.submissions), opts.seed, opts.repeat, runs_root)  # named as their runs will be
    if any(e.team == HANG_TEAM for e in honest):
        raise ValueError(f"a team is named {HANG_TEAM!r}: that name is the rehearsal's own (--fault team-hangs)")
    extra = build_queue([str(write_hang_team(workdir / "teams" / HANG_TEAM))], opts.seed, 1, runs_root) \
        if "team-hangs" in opts.faults else []
    return extra + honest  # the hanging team first: its run is settled (timeout) before a cancel can cut it


def _round_tasks(array: str, todo, runs_root: Path, track: Track, log_dir: Path) -> list[Task]:
    return [Task(f"{array}_{i}", e.team, e.seed, runs_root / track.name / e.records_folder / f"{array}_{i}",
                 log_dir / f"harness-queue-{array}_{i}-node0.out") for i, e in enumerate(todo)]


def _scratch_tmpfs_bytes(track: Track, nodes: int) -> int:
    """The scratch tmpfs of `scratch-full`: room for every node's run at once, twice over. tmpfs pages are this
    machine's memory, and the fault fills them: refused where that is more than half of what is available."""
    from harness.launcher.run.runner import scratch_need_gib

    size = int(max(1.0, 2 * nodes * scratch_need_gib(track)) * 2**30)
    available = _mem_available_bytes()
    if available is not None and size > available // 2:
        raise ValueError(f"--fault scratch-full mounts a {size / 2**30:.0f} GiB tmpfs (memory) for the jobs' scratch "
                         f"and fills it, more than half of this machine's available memory ({available / 2**30:.0f} "
                         "GiB): rehearse on a track copy with a smaller checkpoint_cap_gib and scratch_cap_gib")
    return size


def _mem_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def run_rehearsal(opts: RehearsalOptions, say=print) -> RehearsalReport:
    from harness.launcher.control.heartbeat import lost_after_s

    t0 = time.monotonic()
    track = load_track(opts.track)
    if track.device != "cpu":
        raise ValueError(f"track {track.name!r} runs on {track.device}: a rehearsal on one machine runs a CPU copy of "
                         "the event's track (device = \"cpu\", backend = \"gloo\", the event's nnodes; docs/organizer.md)")
    if "node-lost" in opts.faults and track.nnodes < 2:
        raise ValueError(f"--fault node-lost needs a track of several nodes; {track.name!r} has {track.nnodes}")
    _need_root()
    workdir = Path(opts.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    nodes = opts.nodes or track.nnodes * opts.max_concurrent
    scratch_bytes = _scratch_tmpfs_bytes(track, nodes) if "scratch-full" in opts.faults else 0
    lost_after = lost_after_s(track.collective_timeout_s)
    stall_s = opts.stall_s if opts.stall_s is not None else lost_after + 2.0  # longer than a node's loss takes
    report = RehearsalReport(track=track.name, workdir=str(workdir), nodes=nodes)
    mounts = Mounts()
    # every run refreshes the board where its launcher stands: the rehearsal's, not the caller's folder
    env: dict[str, str] = {"HARNESS_LEADERBOARD_DIR": str(workdir / "leaderboard"), "HARNESS_PLOTS_DIR": str(workdir / "plots")}
    try:
        try:
            say(f"rehearsal: a SLURM cluster of {nodes} node(s) on this machine (scripts/slurm-cluster up {nodes})...")
            one_machine("up", nodes)
            shared = mounts.loop_ext4(workdir / "records.img", workdir / "shared", FS_IMAGE_GIB) \
                if "fs-stall" in opts.faults else workdir
            runs_root, log_dir = shared / "runs", workdir / "slurm-logs"
            if scratch_bytes:
                env[SCRATCH_ENV] = str(mounts.tmpfs(scratch_bytes))
            entries = _entries(opts, workdir, runs_root)
            queue = Queue(entries, runs_root / track.name, {}, track.budget_s)
            plan = FaultPlan(tuple(opts.faults), stall_mount=shared if "fs-stall" in opts.faults else None,
                             stall_s=stall_s, lost_after_s=lost_after,
                             scratch=Path(env[SCRATCH_ENV]) if SCRATCH_ENV in env else None,
                             scratch_need_bytes=scratch_bytes // max(1, 2 * nodes), say=say)
            slurm_opts = SlurmOptions(submission="", track=track_option(track), runs_dir=str(runs_root),
                                      log_dir=str(log_dir))
            log_dir.mkdir(parents=True, exist_ok=True)
            for round_no in range(1, opts.max_rounds + 1):
                todo = entries if round_no == 1 else pending(queue, say)
                if not todo:
                    break
                _run_round(round_no, todo, slurm_opts, track, runs_root, log_dir, workdir, env, opts, plan, report, say)
            plan.release()
            if runs_root != workdir / "runs":  # out of the loop-mounted image, which is unmounted below
                shutil.copytree(runs_root, workdir / "runs", symlinks=True, dirs_exist_ok=True)  # a dead link of a cut run stays one
            _settle(report, entries, workdir / "runs" / track.name, track, plan)
            _board(report, workdir, track)
        finally:
            if not opts.keep_cluster:
                try:
                    one_machine("down")
                except ClusterError as exc:
                    report.problems.append(f"the cluster did not stop cleanly: {exc}")
    finally:  # a second Ctrl-C in the first cleanup still unmounts (and thaws) what the rehearsal mounted
        mounts.close()
        report.seconds = time.monotonic() - t0
        (workdir / "report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
        (workdir / "report.md").write_text("\n".join(render(report)) + "\n")
    return report


def _run_round(round_no, todo, slurm_opts, track, runs_root, log_dir, workdir, env, opts, plan, report, say) -> None:
    runs = [(e.folder, e.team, e.seed) for e in todo]
    text, _ = render_queue(slurm_opts, runs, opts.max_concurrent)
    script = workdir / f"round{round_no}.sbatch"
    script.write_text(text)
    with patched_environ(env):  # sbatch hands the submitting environment to every task
        array = submitted_job_id(submit(script))
    say(f"round {round_no}: array {array}, {len(todo)} run(s), at most {opts.max_concurrent} at once ({script.name})")
    tasks = _round_tasks(array, todo, runs_root, track, log_dir)
    started = time.monotonic()
    bound_s = wall_time_s(track)[0] * math.ceil(len(todo) / opts.max_concurrent) + 120.0
    finished = wait_for_job(array, bound_s, poll_s=0.5, while_waiting=lambda: plan.tick(array, tasks, round_no == 1))
    plan.end_round(tasks)
    seconds = time.monotonic() - started
    report.rounds.append({"round": round_no, "array": array, "runs": len(todo), "seconds": round(seconds, 1),
                          "tasks": [{"run_id": t.run_id, "team": t.team, "seed": t.seed} for t in tasks]})
    if not finished:
        report.problems.append(f"round {round_no} (array {array}) was still running after {bound_s:.0f} s")


EXPECTED = {  # fault: what the run it was injected into must end as, and why
    "node-lost": ("aborted", "a node lost is the infrastructure's failure: the run is aborted and run again"),
    "cancel": ("aborted", "the organiser's scancel: the runs it cut are lost and run again"),
    "fs-stall": ("ok", "a stall of the records' file system shorter than a run's limits must not end the run"),
    "scratch-full": ("aborted", "a full scratch is refused before any team code runs: aborted, run again"),
}


def _settle(report: RehearsalReport, entries, track_dir: Path, track: Track, plan: FaultPlan) -> None:
    by_run: dict[str, dict] = {}
    for e in entries:
        state = state_of(e, track_dir, {}, track.budget_s)
        records = sorted(records_of(e, track_dir, {}, track.budget_s), key=lambda r: str(r[1].get("started_at") or ""))
        attempts = [{"run_id": d.name, "status": r.get("status"), "reason": str(r.get("reason") or "")[:300]}
                    for d, r in records]
        for a in attempts:
            by_run[a["run_id"]] = a
        hangs = e.team == HANG_TEAM
        expected = "failed (timeout: the team's own)" if hangs else "done"
        good = (state.state == FAILED and attempts[-1]["status"] == "timeout") if hangs and attempts else \
            (state.state == DONE and not hangs)
        report.entries.append(EntryOutcome(e.team, e.seed, state.state, attempts, expected, good))
        if not good:
            report.problems.append(f"{e.team} seed {e.seed} ended {state.state}, not {expected}")
    for inj in plan.to_list():
        status, why = EXPECTED[inj["fault"]]
        if inj["fault"] == "scratch-full":  # the run refused for it, not the run after which it was filled
            met = [a for a in by_run.values() if a["status"] == "aborted" and "GiB free" in a["reason"]]
            seen = met[0]["status"] if met else "no run met it"
        elif inj["fault"] == "fs-stall":  # every run training when it began, and only if it lasted long enough
            seen = _stall_outcome(plan, track_dir)
        else:
            seen = (by_run.get(inj["run_id"]) or {}).get("status", "no record")
            if inj["fault"] == "cancel" and seen == "running":
                seen = "aborted"  # a record its launcher never closed: lost all the same
        inj.update(expected=status, seen=seen, why=why, as_expected=seen == status)
        report.faults.append(inj)
        if seen != status:
            report.problems.append(f"fault {inj['fault']} on {inj['run_id']}: the run ended {seen}, not {status} ({why})")
    for fault in plan.faults:
        if fault != "team-hangs" and not plan.done(fault):
            report.problems.append(f"fault {fault} was asked for and never injected (no run was in the state it needs)")


def _stall_outcome(plan: FaultPlan, track_dir: Path) -> str:
    """"ok" when every run that trained through the stall ended ok and at least one still trained when a node's
    silence could have been called a loss (the stall's start + lost_after); else what happened."""
    began, _ = plan.stall_window
    exercised, seen = False, []
    for run_id in plan.stall_runs:
        paths = list(track_dir.glob(f"*/{run_id}/run.json"))
        record = json.loads(paths[0].read_text()) if paths else {}
        t = record.get("timings") or {}
        if isinstance(t.get("train_start_unix"), (int, float)) and isinstance(t.get("train_s"), (int, float)):
            exercised |= t["train_start_unix"] + t["train_s"] > began + plan.lost_after_s
        seen.append(f"{run_id} {record.get('status', 'no record')}")
    if any(not s.endswith(" ok") for s in seen):
        return ", ".join(seen)
    return "ok" if exercised else (f"not exercised: every run's training ended within {plan.lost_after_s:.0f} s of the "
                                   "stall's start, before a node could be called lost (give the teams longer training)")


def _board(report: RehearsalReport, workdir: Path, track: Track) -> None:
    import csv

    from harness.results.views import rebuild

    out = rebuild(workdir / "runs", track.name, workdir / "leaderboard", workdir / "plots")
    report.leaderboard = str(out.html)
    with open(out.csv, newline="") as f:
        report.board = [{"rank": row["rank"], "team": row["team"], "val_loss": row["val_loss"], "n_runs": row["n_runs"],
                         "status": row["status"]} for row in csv.DictReader(f)]


def render(report: RehearsalReport) -> list[str]:
    """The report: rounds, each entry's attempts, each fault's verdict, the board."""
    lines = [f"# Rehearsal on track {report.track}: {len(report.entries)} entries, {report.nodes} SLURM node(s), "
             f"{report.seconds:.0f} s", ""]
    lines += ["## Rounds", ""] + [f"- round {r['round']}: array {r['array']}, {r['runs']} run(s), {r['seconds']:.0f} s"
                                  for r in report.rounds] + [""]
    lines += ["## Entries", "", "| team | seed | ended | attempts (run: status) | as it must |", "|---|---|---|---|---|"]
    for e in report.entries:
        tries = "; ".join(f"{a['run_id']}: {a['status']}" for a in e.attempts) or "none"
        lines.append(f"| {e.team} | {e.seed} | {e.state} | {tries} | {'yes' if e.as_expected else 'NO: ' + e.expected} |")
    lines += ["", "## Faults", ""]
    for f in report.faults:
        lines.append(f"- {f['fault']} on {f['team']} seed {f['seed']} (run {f['run_id']}, {f['at']}): {f['what']}. "
                     f"Ended {f['seen']}; must end {f['expected']}: {'as it must' if f['as_expected'] else 'NOT AS IT MUST'}"
                     f" ({f['why']}).")
    if not report.faults:
        lines.append("- none injected")
    lines += ["", "## Board", "", "| rank | team | val_loss | runs | status |", "|---|---|---|---|---|"]
    lines += [f"| {b['rank']} | {b['team']} | {b['val_loss']} | {b['n_runs']} | {b['status']} |" for b in report.board]
    lines += ["", f"Leaderboard: {report.leaderboard}", ""]
    lines += ["## Verdict", ""] + ([f"- {p}" for p in report.problems] or
                                    ["Every entry and every fault ended as it must."])
    return lines
