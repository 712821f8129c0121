"""What every rank process (training or evaluation) does the same way: environment, logs, device,
process group, failure reports and a clean exit.

The exit path matters: about one 2-rank DDP run in five aborts at interpreter exit while the DDP
module still holds the process group. A rank therefore releases its objects, destroys the group,
flushes, and leaves with os._exit; success is reported on the channel, not read from exit codes.
"""

from __future__ import annotations

import datetime
import gc
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Collection

# Bound at import, before any submission code runs: monkeypatching time.perf_counter later
# cannot slow the harness's own clock.
perf_counter = time.perf_counter

# The processes that run a team's model for a score or a check (evaluation's model processes, the check
# process) compile it in Inductor's deterministic mode: each compiles on its own, and kernels picked by
# timing them (autotuning) could sum a bf16 reduction in another order in the scoring process than in the
# check process, a difference an honest model would be failed for (the causality tolerance is 1e-3).
# Read by torch when Inductor's config is first imported, which a model that compiles does after this.
MODEL_PROCESS_ENV = {"TORCHINDUCTOR_DETERMINISTIC": "1"}

# How long a rank's rendezvous waits for its peers to arrive (Rendezvous): what the launcher itself gives the
# ranks of a node to say hello (check_phase.BIND_WITHIN_S) and their imports of torch, on a busy machine.
MEET_WITHIN_S = 120.0


def deterministic_compile() -> None:
    """MODEL_PROCESS_ENV's setting, also where Inductor's config is already loaded (its value was read then)."""
    os.environ.update(MODEL_PROCESS_ENV)
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        config.deterministic = True


class SandboxMissing(RuntimeError):
    harness_status = "aborted"  # the machine, not the team: the run cannot be held to the rules here


@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    group_rank: int  # the node's rank among the nodes

    @classmethod
    def from_environ(cls) -> "RankEnv":
        e = os.environ
        return cls(
            rank=int(e["RANK"]),
            local_rank=int(e["LOCAL_RANK"]),
            world_size=int(e["WORLD_SIZE"]),
            local_world_size=int(e.get("LOCAL_WORLD_SIZE", e["WORLD_SIZE"])),
            group_rank=int(e.get("GROUP_RANK", "0")),
        )


def die_with_launcher() -> None:
    """If the launcher is killed outright (SIGKILL), its ranks die with it (Linux), never orphaned.

    torch elastic starts each rank in its own session, so nothing else would reach them.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    launcher = os.environ.get("HARNESS_LAUNCHER_PID")
    if launcher and os.getppid() != int(launcher):  # it died before prctl took effect
        os._exit(1)


def enter_job(socket_path: str | None, work_dir: str | None = None) -> dict:
    """A training rank's first act: the job's namespaces (a private /dev/shm and IPC; harness/ranks/
    namespaces.py join_job), where the launcher made them, then no capabilities (in its user namespace a
    process has them all). Single-threaded, before anything else. Returns the record's account."""
    if not socket_path:
        return {"active": False, "why": "the launcher made no namespace for the job (sandbox off, or refused here)"}
    from harness.ranks.confine import namespaces, rootfs

    # the parent left outside the job's PID namespace only waits: no capability of the job's user namespace stays
    # with it (checked without /proc/self, which it has none of there)
    why, pids = namespaces.join_job(socket_path, work_dir, lambda: rootfs.drop_capabilities(verify=False))
    dropped = rootfs.drop_capabilities()
    if why or dropped:
        return {"active": False, "why": why or f"its capabilities could not be dropped ({dropped})"}
    return {"active": True, "pid_namespace": pids,
            "why": "the job's own user, mount (a private /dev/shm, read-only but its private folder) and IPC namespaces"
                   + (", and its PID namespace (a /proc of its own)" if pids else "") + "; no capabilities"}


def redirect_output(log_path: str) -> None:
    """Send this process's stdout and stderr (fd level, so C++ output too) to its own log file."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    show_native_crashes()


def hello_and_sandbox(job: dict, env: "RankEnv", job_ns: dict, held: dict | None, no_sandbox_why: str):
    """A rank's start, after its cgroup and its job's namespace, the same in both divisions: its output to its own
    log, hello on the control channel, then the sandbox (one thread still), whose report leaves before any team
    code. Returns (the channel, the sandbox report)."""
    from harness.ranks.channel import ChannelClient
    from harness.ranks.confine import sandbox

    redirect_output(f"{job['log_dir']}/rank{env.rank}.log")
    channel = ChannelClient(job.get("channel_path"), env.rank)
    channel.send("hello", pid=os.getpid(), local_rank=env.local_rank, group_rank=env.group_rank,
                 world_size=env.world_size)
    box = sandbox.apply(sandbox.Policy.from_dict(job["sandbox_policy"])) if job.get("sandbox_policy") else \
        sandbox.SandboxReport(False, no_sandbox_why)
    box.namespaces, box.cgroup = job_ns, held or {}
    channel.send("sandbox", **box.to_dict())  # before any team code: the report the record keeps
    return channel, box


def show_native_crashes() -> None:
    """A crash in native code (a segfault in an extension, an abort) writes the Python stack of every
    thread to stderr, this process's log, before the process dies of the same signal: the team sees
    which line of theirs it was, where the log would otherwise be empty."""
    import faulthandler

    faulthandler.enable(file=sys.stderr, all_threads=True)


def setup_device(device_kind: str, env: RankEnv, threads: int):
    import torch

    torch.set_num_threads(max(1, threads))  # decided by the launcher (runner._threads_per_rank)
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("the track needs CUDA but no GPU is visible to this process")
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


class Rendezvous(threading.Thread):
    """torch's own env:// rendezvous (the store torchrun's environment names), done in a thread from the moment it
    is made, its store wrapped as init_process_group wraps it; `result()` is (store, rank, world size) for
    `init_process_group(..., rendezvous=...)`, or raises what the rendezvous raised.

    On one node rank 0 hosts the store (TORCHELASTIC_USE_AGENT_STORE=False, harness/launcher/control/elastic.py),
    and torch's client that finds no server yet tries again only after about half a second. Ranks that start
    the process group at the same moment, as they do on the launcher's word, lost that half second on every
    run; begun before the rank's last imports and the word, the wait overlaps them (the client waits without
    the interpreter's lock)."""

    def __init__(self, timeout_s: float, meet_within_s: float = 0.0):
        super().__init__(name="harness-rendezvous", daemon=True)  # a rank told stop leaves without it
        # The store's operations keep the track's collective timeout; the peers may take longer to arrive: begun
        # at a rank's start, the rendezvous absorbs the skew of their imports that the wait for the word used to.
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.meet_within = datetime.timedelta(seconds=max(timeout_s, meet_within_s))
        self._value: tuple | None = None
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            import torch.distributed as dist
            from torch.distributed.rendezvous import rendezvous

            store, rank, world_size = next(rendezvous("env://", timeout=self.meet_within))
            store.set_timeout(self.timeout)
            self._value = (dist.PrefixStore("default_pg", store), rank, world_size)
        except BaseException as exc:  # noqa: BLE001  (raised in the rank's own thread by result())
            self._error = exc

    def result(self) -> tuple:
        self.join()
        if self._error is not None:
            raise self._error
        return self._value


def init_process_group(backend: str, device, timeout_s: float, rendezvous: tuple | None = None) -> None:
    """The process group, with a timeout sized by the track: a hung rank surfaces in seconds, not 30 min.
    `rendezvous`: a Rendezvous's result, where it was begun before; else torch's env:// rendezvous here."""
    import torch.distributed as dist

    kwargs = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s)}
    if device.type == "cuda":
        kwargs["device_id"] = device  # eager NCCL init, bound to this rank's GPU
    if rendezvous is not None:
        store, rank, world_size = rendezvous
        kwargs.update(store=store, rank=rank, world_size=world_size)
    dist.init_process_group(**kwargs)


def is_collective_error(exc: BaseException, device: str | None = None) -> bool:
    """True for failures of the communication itself (a peer died or hung), not of the rank's own code."""
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    if not isinstance(exc, RuntimeError):
        return False
    needles = ("gloo", "connection closed", "connection reset", "timed out", "timeout", "broken pipe",
               "socket", "c10d", "store")
    if any(n in text for n in needles):
        return True
    # NCCL communicates only between GPUs: on a CPU track (or a machine without one), an NCCL error is the
    # code's asking for it (a script's hard-coded backend), not a peer that died, and its line is the team's.
    return "nccl" in text and (device == "cuda" if device is not None else _has_gpu())


def _has_gpu() -> bool:
    import torch

    try:
        return torch.cuda.is_available()
    except Exception:  # a broken driver is no GPU to communicate through
        return False


MEMLOCK_MARKERS = ("ibv_reg_mr", "ibv_reg_dmabuf_mr", "memlock")


def is_memlock_refusal(exc: BaseException) -> bool:
    """NCCL's InfiniBand transport could not register (pin) a buffer: "Call to ibv_reg_mr failed with error Cannot
    allocate memory" is the node's locked-memory limit (`ulimit -l`), not the model's size."""
    text = str(exc).lower()
    return any(marker in text for marker in MEMLOCK_MARKERS)


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, MemoryError) or isinstance(exc, getattr(torch, "OutOfMemoryError", ())):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def _causes(exc: BaseException) -> list[BaseException]:
    """The exception and what it was raised from or while handling, as a traceback prints them."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
    return chain


def team_site(exc: BaseException, team_dir: str | os.PathLike | None) -> str:
    """`<file>:<line>` of the innermost frame in the team's own files (under team_dir) of the
    exception's traceback, its root cause's first (a harness error that wraps the team's names the
    team's line, not the harness's); "" when no frame is the team's. The path is the one the process
    ran; the launcher names it relative to the submission folder (assemble.name_team_files)."""
    if not team_dir:
        return ""
    roots = {os.path.join(str(team_dir), ""), os.path.join(os.path.realpath(team_dir), "")}

    def teams(filename: object) -> bool:
        # A name a frame merely claims (compile(source, "<folder>/model.py\n...", "exec")) is no file of the
        # team's: only a real file under the folder counts, so a reason's prefix is a path, never a message.
        name = str(filename or "")
        return (any(name.startswith(root) for root in roots) and name.isprintable() and os.path.isfile(name)
                and any(os.path.realpath(name).startswith(root) for root in roots))

    for cause in reversed(_causes(exc)):
        if isinstance(cause, SyntaxError) and teams(cause.filename):
            return f"{cause.filename}:{cause.lineno}"  # the broken file has no frame: the error names it
        for frame in reversed(traceback.extract_tb(cause.__traceback__)):
            if teams(frame.filename):
                return f"{frame.filename}:{frame.lineno}"
    return ""


def describe_failure(exc: BaseException, team_dir: str | os.PathLike | None = None, device: str | None = None) -> dict:
    """A rank's failure as a report: status, a one-line reason, the traceback and its kind. Where the
    team's code is on the traceback, the reason starts with its innermost file:line (team_site)."""
    from harness.submission.contract import SubmissionError

    tb = "".join(traceback.format_exception(exc))
    last = f"{type(exc).__name__}: {exc}".strip().splitlines()
    line = last[0] if last else type(exc).__name__
    site = team_site(exc, team_dir)
    at = f"{site}: " if site else ""
    if isinstance(exc, SubmissionError):
        reason = f"{site}: {exc.problem}" + (f" Fix: {exc.fix}" if exc.fix else "") if site else str(exc)
        return {"status": "invalid", "reason": reason, "traceback": tb, "cause": "contract"}
    if getattr(exc, "harness_status", None):
        return {"status": exc.harness_status, "reason": str(exc), "traceback": tb, "cause": "rule"}
    if is_memlock_refusal(exc):  # before is_oom: its text says "Cannot allocate memory" too
        return {"status": "crashed", "reason": f"{at}NCCL could not register memory with InfiniBand ({line[:200]}): "
                "the node's locked-memory limit (ulimit -l), not the model's size", "traceback": tb, "cause": "memlock"}
    if is_oom(exc):
        return {"status": "crashed", "reason": f"{at}out of memory ({line[:200]})", "traceback": tb, "cause": "oom"}
    if is_collective_error(exc, device):  # the job's device ("cuda", "cpu"): the track's, not the host's
        # No team line: where a rank waited when its peer died is not the cause (the launcher names the peer).
        return {"status": "crashed", "reason": line[:300], "traceback": tb, "cause": "collective"}
    return {"status": "crashed", "reason": f"{at}{line[:300]}", "traceback": tb, "cause": "exception"}


def ended_how(returncode: int | None) -> str:
    """How a child process ended, in words, from its return code as subprocess gives it (negative: the
    signal that ended it)."""
    import signal

    if returncode is None:
        return "how it ended is not known"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def reap_children(unclaimed: Collection[int] = ()) -> None:
    """Collect the exit status of every finished child (adopted orphans included), so none lingers as a
    zombie: the launcher after torch elastic's agent, a scorer after its model processes.

    A child that a Popen of this process still waits for (subprocess's, or multiprocessing's where it is loaded) is
    reaped by that Popen (its poll), never here: another thread may be about to wait for it (the launcher's check
    process runs beside the training job that calls this), and a status reaped behind a Popen's back is lost:
    subprocess reads the ECHILD it then gets as exit code 0, so a check process that crashed would look as if it
    had ended well. (One window stays: a Popen made in another thread between its fork and its pid's assignment.)
    `unclaimed`: pids the caller knows no Popen of this process holds (what the scorer's kill_tree found below its
    model process): those are reaped without the walk over every object that finding the Popens takes."""
    zombies = _ended_children()
    if zombies:
        for pid in zombies.intersection(unclaimed):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        zombies.difference_update(unclaimed)
    if not zombies and zombies is not None:
        return  # the usual answer, in the scorer's rounds of 20 ms too: no walk over every object
    waited = _live_popens()
    for proc in waited:
        try:
            proc.poll()  # reaps it if it has ended, keeping the status where its owner reads it
        except Exception:  # noqa: BLE001  (its owner's to read; nothing of it is this function's to raise)
            pass
    claimed = {proc.pid for proc in waited}
    if zombies is None:  # no /proc of this process's own: one ended child at a time, looked at before it is reaped
        while True:
            try:
                ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if ended is None or ended.si_pid in claimed:
                return  # none ended, or the first is a Popen's (its owner takes it; the rest wait for the next call)
            try:
                os.waitpid(ended.si_pid, os.WNOHANG)
            except ChildProcessError:
                pass
    for pid in zombies - claimed:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped meanwhile (a Popen created since, or another thread)
            pass


def _live_popens() -> list:
    """Every Popen of this process whose child it has not yet reaped. One whose __init__ failed before its fork
    (a fork refused at a task cap) has no pid: it holds no child, and is left out."""
    import subprocess

    kinds: tuple = (subprocess.Popen,)
    forked = sys.modules.get("multiprocessing.popen_fork")
    if forked is not None:  # its own children (fork, spawn); a forkserver's are the server's, and polled over a pipe
        kinds += (forked.Popen,)
    return [o for o in gc.get_objects() if issubclass(type(o), kinds) and getattr(o, "returncode", 0) is None
            and isinstance(getattr(o, "pid", None), int)
            and (forked is None or not issubclass(type(o), forked.Popen) or type(o).poll is forked.Popen.poll)]


def thread_group_lives(pid: int) -> bool:
    """Whether a process that /proc shows as a zombie still runs: its main thread has exited and another of its
    threads has not. /proc shows the main thread's state, but the process runs code, holds files and starts
    processes as any other, and a SIGKILL to its pid ends it; waitpid cannot reap it yet."""
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def listed_children() -> set[int] | None:
    """This process's children, from every thread's list (a child is its creating thread's, an adopted orphan some
    live thread's); None without /proc or where the kernel keeps no such list (CONFIG_PROC_CHILDREN off)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return None
    pids: set[int] = set()
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as listed:
                pids.update(int(pid) for pid in listed.read().split())
        except FileNotFoundError:
            if os.path.isdir(f"/proc/self/task/{task}"):  # the thread lives, the kernel keeps no list
                return None
        except OSError:  # the thread ended meanwhile
            pass
    return pids


def _ended_children() -> set[int] | None:
    """This process's children that have ended and wait to be reaped (zombies); None where /proc is not this
    process's own (absent, or a PID namespace's whose /proc is the parent's: its pids are not ours) or does not
    list children."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
    except OSError:
        return None
    children = listed_children()
    if children is None:
        return None
    ended = set()
    for pid in children:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state == b"Z" and not thread_group_lives(pid):
            ended.add(pid)
    return ended


def release_and_exit(code: int, *objects_to_drop: list) -> None:
    """Drop the DDP model and optimizers, destroy the process group, flush, and leave for good."""
    try:
        for holder in objects_to_drop:
            holder.clear()
        gc.collect()
        dist = sys.modules.get("torch.distributed")  # not imported: no group to destroy (and no torch to load)
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a failing teardown must not turn a finished run into a crash
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
