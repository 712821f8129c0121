"""The faults a rehearsal injects into a real SLURM queue (harness/launcher/event/rehearsal.py), each one real:

- `node-lost`: every process of one run's node 1 stopped at once (SIGSTOP: its launcher and whatever it
  started), mid-training: a node that stops answering with its sockets left open, as when its power goes
  or its kernel hangs (a SIGKILL would close them, and its peers would learn at once). The run must end
  `aborted` (the infrastructure's) and be run again; once node 0's record is final the stopped processes
  are killed, so that SLURM's step ends. (slurmd itself is left running: SLURM's own NODE_FAIL, after its
  SlurmdTimeout, and a node left DOWN, are not rehearsed.)
- `cancel`: the organiser's `scancel` of the whole array while a run trains, once every task has started:
  SLURM's SIGTERM to every step. The runs it cut must be lost, and run again.
- `fs-stall`: the file system that holds the records (a loop-mounted ext4 the rehearsal made) frozen with
  `fsfreeze` for longer than a node's loss takes (the track's lost_after_s + 2 s by default) while runs
  train: writes block, as on an NFS server that stops answering. Every run training then must end as it
  would have (no node called lost for a stall of the file system); one whose training ended before the
  stall could have made a node lost did not exercise it, and the report says so.
- `scratch-full`: the scratch root (a tmpfs the rehearsal mounted, HARNESS_SCRATCH_DIR of every job)
  filled once the first run has ended, emptied once a run has been refused for it. The run that met it
  must end `aborted` before any team code ran, and be run again.
- `team-hangs`: one more team, made by the rehearsal, whose rank 0 hangs in its forward from the third
  step on. Its run must end `timeout`, the team's, and never be run again.

Runs in the `harness rehearse` process, beside no team code; it reads the records and SLURM's logs and acts
through SLURM, the kernel and the mounts. Each fault is injected once per rehearsal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.launcher.event.cluster import cancel
from harness.results.records import utc_now

FAULTS = ("node-lost", "cancel", "fs-stall", "scratch-full", "team-hangs")
# A node's SLURM log in training: `train 2.2s / 4s | step 1 | loss ...`, or `step 3/20 | loss ...` by steps
PROGRESS = re.compile(r"\bstep \d+")

HANG_TEAM = "rehearsal-hangs"
HANG_SUBMISSION = '''"""Made by `harness rehearse --fault team-hangs`: a bigram whose rank 0 hangs from its third step on."""

import os
import time

import torch.nn as nn
import torch.nn.functional as F

CONFIG = {"micro_batch_size": 4, "seq_len": 32, "learning_rate": 0.05}
RANK = int(os.environ.get("RANK", "0"))
calls = 0


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets=None):
        global calls
        if targets is not None and self.training:
            calls += 1
            if RANK == 0 and calls >= 3:
                time.sleep(3600)
        logits = self.table(idx)
        loss = None if targets is None else F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def get_model(config):
    return Bigram(config["vocab_size"])
'''


def write_hang_team(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "submission.py").write_text(HANG_SUBMISSION)
    (folder / "submission.toml").write_text(f'[team]\nname = "{HANG_TEAM}"\n')
    return folder


@dataclass
class Injection:
    """One fault as it was injected: on which run, when, and what was done."""

    fault: str
    run_id: str
    team: str
    seed: int
    at: str
    what: str


@dataclass
class Task:
    """One array task of a round: the run it makes, and where its node logs are."""

    run_id: str
    team: str
    seed: int
    run_dir: Path
    node_log: Path  # node 0's SLURM log

    def record(self) -> dict | None:
        try:
            return json.loads((self.run_dir / "run.json").read_text())
        except (OSError, ValueError):
            return None

    def training(self) -> bool:
        """Node 0's log shows a step and its record is not final: the run is in its training window."""
        record = self.record()
        if record is None or record.get("status") not in ("running",):
            return False
        try:
            return bool(PROGRESS.search(self.node_log.read_text(errors="replace")))
        except OSError:
            return False

    def final(self) -> bool:
        record = self.record()
        return record is not None and record.get("status") not in ("running", "evaluating")


def node_processes(run_id: str, node_rank: int) -> list:
    """Node `node_rank`'s launcher of the run (`harness run ... --node-rank R --run-id ID`) and every process
    under it."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if "harness" in cmd and "run" in cmd and _arg(cmd, "--run-id") == run_id and _arg(cmd, "--node-rank") == str(node_rank):
            try:
                found += [proc, *proc.children(recursive=True)]
            except psutil.Error:
                continue
    return found


def _arg(cmd: list[str], name: str) -> str | None:
    return cmd[cmd.index(name) + 1] if name in cmd and cmd.index(name) + 1 < len(cmd) else None


def stop_node(run_id: str, node_rank: int) -> list:
    """SIGSTOP every process of one node's part of a run at once; returns them (to be killed later)."""
    procs = node_processes(run_id, node_rank)
    for proc in procs:
        try:
            os.kill(proc.pid, signal.SIGSTOP)
        except OSError:
            pass
    return procs


def stall(mount: Path, seconds: float) -> None:
    """Freeze the file system at `mount` for `seconds`, from a process of its own in a session of its own: the
    thaw happens even if this process dies meanwhile, and no thread of this one waits on the frozen mount."""
    subprocess.Popen(["setsid", "sh", "-c", f'fsfreeze -f "$0" && sleep {seconds:.1f}; fsfreeze -u "$0"', str(mount)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@dataclass
class FaultPlan:
    """Which faults to inject and the state of each; `tick` is called every half second while a round runs."""

    faults: tuple[str, ...]
    stall_mount: Path | None = None
    stall_s: float = 6.0
    lost_after_s: float = 10.0
    scratch: Path | None = None
    scratch_need_bytes: int = 0  # what a run needs free there at its start (runner.scratch_need_gib)
    say: object = print
    injected: list[Injection] = field(default_factory=list)
    stall_window: tuple[float, float] | None = None  # unix times of the freeze
    stall_runs: list[str] = field(default_factory=list)  # the runs training when it began
    _filler: Path | None = None
    _stopped: list[tuple[Task, list]] = field(default_factory=list)

    def done(self, fault: str) -> bool:
        return any(i.fault == fault for i in self.injected)

    def _note(self, fault: str, task: Task, what: str) -> None:
        self.injected.append(Injection(fault, task.run_id, task.team, task.seed, utc_now(), what))
        self.say(f"fault {fault}: {what} ({task.team} seed {task.seed}, run {task.run_id})")

    def tick(self, array_id: str, tasks: list[Task], first_round: bool) -> None:
        self._end_stopped(force=False)
        if "scratch-full" in self.faults:
            self._release_scratch(tasks)
        if not first_round:
            return
        training = [t for t in tasks if t.team != HANG_TEAM and t.training()]
        fresh = [t for t in training if not any(i.run_id == t.run_id for i in self.injected)]
        if "node-lost" in self.faults and not self.done("node-lost") and fresh:
            task = fresh[0]
            procs = stop_node(task.run_id, 1)
            if procs:
                self._stopped.append((task, procs))
                self._note("node-lost", task, f"SIGSTOP to node 1's launcher and its {len(procs) - 1} process(es), "
                           "mid-training (killed once node 0's record is final)")
        elif "fs-stall" in self.faults and not self.done("fs-stall") and self.stall_mount is not None and fresh:
            began = time.time()
            stall(self.stall_mount, self.stall_s)
            self.stall_window = (began, began + self.stall_s)
            self.stall_runs = [t.run_id for t in training]
            self._note("fs-stall", fresh[0], f"fsfreeze of {self.stall_mount} for {self.stall_s:.0f} s, mid-training "
                       f"of {', '.join(self.stall_runs)}")
        elif "cancel" in self.faults and not self.done("cancel") and fresh and all(t.record() is not None for t in tasks) \
                and all(self.done(f) for f in ("node-lost", "fs-stall") if f in self.faults):
            # late in the round, every task started: what it cuts is a run, never a wait in SLURM's queue
            cancel(array_id)
            self._note("cancel", fresh[0], f"scancel {array_id} (the whole array), mid-training")
        if "scratch-full" in self.faults and self.scratch is not None and not self.done("scratch-full"):
            ended = [t for t in tasks if t.final()]
            if ended:
                self._fill_scratch()
                self._note("scratch-full", ended[0], f"{self.scratch} filled once this run had ended")

    def _end_stopped(self, force: bool) -> None:
        """Kill a lost node's stopped processes once node 0's record is final (or at the round's end)."""
        for task, procs in list(self._stopped):
            if force or task.final():
                for proc in procs:
                    for sig in (signal.SIGKILL, signal.SIGCONT):
                        try:
                            os.kill(proc.pid, sig)
                        except OSError:
                            pass
                self._stopped.remove((task, procs))

    def _fill_scratch(self) -> None:
        st = os.statvfs(self.scratch)
        free = st.f_bavail * st.f_frsize
        keep = max(0, min(free, self.scratch_need_bytes // 2))  # less than a run needs at its start
        self._filler = self.scratch / "rehearsal-filler"
        with open(self._filler, "wb") as f:
            os.posix_fallocate(f.fileno(), 0, max(1, free - keep))

    def _release_scratch(self, tasks: list[Task]) -> None:
        """Empty the scratch once a run has met it full (refused, `aborted`)."""
        if self._filler is None:
            return
        met = any((t.record() or {}).get("status") == "aborted" and "GiB free" in str((t.record() or {}).get("reason"))
                  for t in tasks)
        if met:
            self.release()

    def release(self) -> None:
        """Whatever a fault still holds: the scratch emptied, a lost node's stopped processes ended."""
        self._end_stopped(force=True)
        if self._filler is not None:
            self._filler.unlink(missing_ok=True)
            self._filler = None
            self.say(f"fault scratch-full: {self.scratch} emptied again")

    def end_round(self, tasks: list[Task]) -> None:
        self.release()

    def to_list(self) -> list[dict]:
        return [asdict(i) for i in self.injected]
