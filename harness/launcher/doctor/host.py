"""`harness doctor`'s checks of this node itself: the machine, the sandbox's host settings, the files, the
clock (harness/launcher/doctor/checkup.py says what each is for). Each function returns Checks; none starts a rank
(the all-reduce and what a rank sees from inside its sandbox are harness/launcher/doctor/comm.py's)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness.launcher.doctor.table import Check, DoctorOptions, disk
from harness.launcher.control.process_tree import usable_cpus
from harness.ranks.confine.namespaces import USERNS_OTHER_CAUSES, userns_restriction_parts
from harness.tracks.spec import Track

GIB = 2**30
NVIDIA_SMI_TIMEOUT_S = 20.0


# --------------------------------------------------------------------------- the machine


def query_gpus() -> tuple[list[dict], str]:
    """([{index, name, driver, memory_mib}], "") from nvidia-smi, which opens no CUDA context; ([], why) without it."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return [], "nvidia-smi is not on PATH"
    try:
        out = subprocess.run([smi, "--query-gpu=index,name,driver_version,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"nvidia-smi failed ({exc})"
    if out.returncode != 0:
        return [], f"nvidia-smi failed: {(out.stderr or out.stdout).strip()[:300]}"
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append({"index": parts[0], "name": parts[1], "driver": parts[2], "memory_mib": parts[3]})
    return gpus, ""


def machine_checks(track: Track, wanted: list[str]) -> list[Check]:
    """gpus, driver, cpus, memlock."""
    checks = []
    if track.device != "cuda":
        why = f"track {track.name} runs on {track.device} ({track.backend})"
        checks += [Check(name="gpus", status="skipped", measured=why), Check(name="driver", status="skipped", measured=why)]
    elif "gpus" in wanted or "driver" in wanted:
        checks += _gpu_checks(track)
    cpus = usable_cpus()
    per_node = track.nproc_per_node if isinstance(track.nproc_per_node, int) else None
    if track.device == "cpu" and per_node and cpus < per_node:
        checks.append(Check(name="cpus", status="warn", measured=f"{cpus} usable of {os.cpu_count()}, for {per_node} ranks",
                            fix="ranks will share cores and measure contention: give the job a CPU per rank (SLURM "
                                "--cpus-per-task, taskset)", value=cpus))
    else:
        checks.append(Check(name="cpus", status="ok", measured=f"{cpus} usable (affinity) of {os.cpu_count()}", value=cpus))
    checks.append(_memlock(track))
    return checks


def _gpu_checks(track: Track) -> list[Check]:
    gpus, why = query_gpus()
    import torch

    if not gpus:  # no nvidia-smi: torch's view (it initialises CUDA in this process, which a doctor may)
        if torch.cuda.is_available():
            gpus = [{"index": str(i), "name": torch.cuda.get_device_name(i), "driver": "?", "memory_mib": "?"}
                    for i in range(torch.cuda.device_count())]
    want = track.nproc_per_node if isinstance(track.nproc_per_node, int) else 1
    names = sorted({g["name"] for g in gpus})
    if not gpus:
        gpu = Check(name="gpus", status="fail", measured=f"no GPU visible ({why})",
                    fix="check the node's GPUs (nvidia-smi), CUDA_VISIBLE_DEVICES and the job's GPU request "
                        f"(--gpus-per-node={want})", value=0)
    elif len(gpus) < want:
        gpu = Check(name="gpus", status="fail", measured=f"{len(gpus)} x {', '.join(names)}; the track runs {want} a node",
                    fix="ask SLURM for the node's every GPU (--gpus-per-node) or fix CUDA_VISIBLE_DEVICES", value=len(gpus))
    elif track.device_peak not in ("", "auto") and any(track.device_peak.upper() not in n.upper() for n in names):
        gpu = Check(name="gpus", status="warn", measured=f"{len(gpus)} x {', '.join(names)}; the track says {track.device_peak}",
                    fix=f"the track's device_peak ({track.device_peak}) sets MFU: correct it, or run on the event's GPUs",
                    value=len(gpus))
    elif len(names) > 1:
        gpu = Check(name="gpus", status="warn", measured=f"{len(gpus)} GPUs of {len(names)} models: {', '.join(names)}",
                    fix="one model per node: the slowest sets every step's pace", value=len(gpus))
    else:
        gpu = Check(name="gpus", status="ok", measured=f"{len(gpus)} x {names[0]} ({gpus[0]['memory_mib']} MiB)",
                    value=len(gpus))
    driver = gpus[0]["driver"] if gpus and gpus[0]["driver"] != "?" else _proc_driver_version()
    if not torch.cuda.is_available():
        drv = Check(name="driver", status="fail",
                    measured=f"driver {driver}; torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU",
                    fix="install the torch build that matches the driver (or a driver new enough for torch's CUDA): "
                        "docs/organizer.md, Install")
    else:
        drv = Check(name="driver", status="ok", measured=f"driver {driver}, torch {torch.__version__} built for CUDA "
                                                         f"{torch.version.cuda}")
    return [gpu, drv]


def _proc_driver_version() -> str:
    """The NVIDIA kernel module's version (/proc/driver/nvidia/version), or "not found"."""
    import re

    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return "not found"
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return found.group(1) if found else "not found"


def _memlock(track: Track) -> Check:
    """NCCL registers its buffers with InfiniBand: locked memory must not be limited."""
    import resource

    if track.device != "cuda":
        return Check(name="memlock", status="skipped", measured=f"track {track.name} uses no InfiniBand (cpu)")
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Check(name="memlock", status="ok", measured="locked memory unlimited")
    return Check(name="memlock", status="warn" if track.nnodes == 1 else "fail",
                 measured=f"locked memory limited to {soft / 2**20:.0f} MiB",
                 fix="`ulimit -l unlimited` for the harness's user (limits.conf memlock, or SLURM's PropagateResourceLimits)",
                 value=soft / 2**20, unit="MiB")


# --------------------------------------------------------------------------- the sandbox's host settings


def sandbox_host_checks(track: Track, opts: DoctorOptions, wanted: list[str]) -> list[Check]:
    """user, namespaces, containment."""
    checks = [_user(opts)]
    if "namespaces" in wanted:
        checks.append(namespaces_check(track, opts.proc_sys))
    if "containment" in wanted:
        checks.append(containment_check(track))
    return checks


def containment_check(track: Track | None = None) -> Check:
    """A job's cgroup (harness/launcher/control/job_cgroup.py) made, joined by a process as a rank joins it, and
    ended, for real: with one, whatever a job starts ends with it; without one, a process that forks faster than
    the teardown lists can outlive a run."""
    import subprocess

    import dataclasses

    from harness.launcher.control.job_cgroup import JobCgroup, track_caps, v2_own_and_mount
    from harness.launcher.control.job_limits import caps_for
    from harness.ranks import interpreter

    # The track's caps, as its jobs get them; without a track, a track's defaults (90% of the node's memory)
    defaults = {f.name: f.default for f in dataclasses.fields(Track)}
    caps = track_caps(track) if track is not None else \
        caps_for(defaults["job_memory_gib"], defaults["job_pids_max"], *v2_own_and_mount())
    cgroup = JobCgroup("doctor", caps)
    made, why = cgroup.active, cgroup.why
    if made:
        joiner = "from harness.ranks.confine import cgroup; print((cgroup.join_from_environment(False) or {}).get('why'))"
        try:
            out = subprocess.run([sys.executable, "-P", "-c", joiner], env={**interpreter.child_environment(),
                                 **cgroup.env()}, capture_output=True, text=True, timeout=60)
            said = (out.stdout.strip() or out.stderr.strip()[-300:]).splitlines()[-1:] or ["nothing"]
            if not said[0].startswith("in the job's cgroup"):
                made, why = False, f"a process could not join {why}: {said[0]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            made, why = False, f"a process to join it could not run: {exc}"
    limits = cgroup.limits.report() if cgroup.limits is not None else {"held": {}, "why": {"memory": "turned off",
                                                                                             "pids": "turned off"}}
    cgroup.close()
    caps = "; ".join([*(f"{c} capped in {where}" for c, where in limits["held"].items()),
                      *(f"no {c} cap: {why}" for c, why in (limits.get("why") or {}).items())])
    if not made:
        return Check(name="containment", status="fail",
                     measured=f"{why}: nothing caps a job's memory or tasks, and a job is ended through the "
                              "training job's PID namespace (the namespaces line) or, without one, by listing its "
                              "processes, which a process that forks fast outlives (it could carry a run's weights "
                              "into the team's next one)",
                     fix="give the harness's user a writable cgroup v2 subtree: root with a writable cgroup2 mount "
                         "(a container's is often read-only), or a subtree delegated to it (systemd Delegate=yes "
                         "on the system unit that starts it, with User=)")
    if limits.get("why"):  # ended as a whole, but a job that allocates or forks without end reaches the node's limits
        return Check(name="containment", status="warn", measured=f"a cgroup of the job's own, joined and ended: {why}; "
                                                                f"{caps}",
                     fix="pure cgroup v2: the caps are not held (job cgroups are made below the launcher's own, which "
                         "holds the launcher, and the kernel hands controllers down only from a cgroup without "
                         "processes, the root excepted): bound jobs with the scheduler's per-job limits (SLURM "
                         "ConstrainRAMSpace, systemd MemoryMax and TasksMax). A hybrid host: memory and pids v1 "
                         "hierarchies the harness's user may write where it runs (root, or a subtree chowned to it "
                         "that it is started in); the track's job_memory_gib and job_pids_max are then held there")
    return Check(name="containment", status="ok", measured=f"a cgroup of the job's own, joined and ended: {why}; {caps}")


def _user(opts: DoctorOptions) -> Check:
    """docs/organizer.md, "A user that owns nothing": not root, and none of what it reads is its own."""
    import harness

    uid = os.getuid()
    if uid == 0:
        return Check(name="user", status="warn", measured="running as root",
                     fix="run the event as an unprivileged user that owns nothing it reads: root owns everything, "
                         "and Landlock is then the only defence (docs/organizer.md)")
    owned = [str(p) for p in (Path(harness.__file__).resolve().parent, Path(sys.prefix)) if p.exists() and p.stat().st_uid == uid]
    if owned:
        return Check(name="user", status="warn", measured=f"uid {uid} owns {', '.join(owned)}",
                     fix="install the harness as another user: team code can change modes and times of what its "
                         "user owns where the sandbox does not govern it (docs/organizer.md)")
    return Check(name="user", status="ok", measured=f"uid {uid}, owns neither the harness nor its Python")


def namespaces_check(track: Track, proc_sys: str) -> Check:
    """The training job's namespaces (harness/launcher/control/job_namespace.py) made for real, and the distribution's
    setting that refuses unprivileged user namespaces. Either way, a host that refuses them leaves the sandbox
    Landlock alone: a fail, with the fix."""
    if track.sandbox == "off":
        return Check(name="namespaces", status="skipped", measured=f"track {track.name} turns the sandbox off")
    from harness.launcher.control.job_namespace import JobNamespace

    from harness.ranks.confine.scratch import private_folder

    what, fix = userns_restriction_parts(proc_sys)
    try:  # as a job's private folder, in the scratch root jobs use: a tmpfs over it, 1 MiB
        folder = str(private_folder("harness-doctor-"))
    except OSError as exc:
        return Check(name="namespaces", status="fail", measured=f"no private folder in the scratch root: {exc}",
                     fix="set HARNESS_SCRATCH_DIR to a writable folder on a local disk (docs/organizer.md)")
    try:
        holder = JobNamespace(writable=folder, scratch_bytes=1 << 20)
        scratch_refused = holder.scratch_refused
        if scratch_refused:  # as a job does: the namespaces again, the folder on disk
            holder = JobNamespace(writable=folder)
        made, why, pid_why = holder.active, holder.why, holder.pid_why
        if holder.folder_fd is not None:
            os.close(holder.folder_fd)
        holder.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    weakened = "the sandbox would be Landlock alone (a shared /dev/shm and IPC; no PID, IPC or network namespace " \
               "for evaluation's model processes)"
    if what:
        seen = "made here (root is not restricted)" if made else "refused"
        return Check(name="namespaces", status="fail", measured=f"{what}; the job's namespaces {seen}: {weakened}",
                     fix=fix)
    if not made:
        return Check(name="namespaces", status="fail", measured=f"{why}: {weakened}",
                     fix=f"allow unprivileged user namespaces for the harness's user ({USERNS_OTHER_CAUSES})")
    if scratch_refused:
        return Check(name="namespaces", status="warn",
                     measured=f"user, mount and IPC namespaces of the job's own: made; the ranks' private folder "
                              f"cannot be a file system of the job's own ({scratch_refused}): it stays on the "
                              "launcher's disk, where a file without a name is not under the track's scratch_cap_gib",
                     fix="let the harness's user mount a tmpfs in a user namespace of its own (a container's "
                         "seccomp or AppArmor profile may refuse mount), and read /proc/<pid>/root of its own "
                         "children (no hidepid mount of /proc that hides them)")
    if pid_why:
        return Check(name="namespaces", status="warn",
                     measured=f"user, mount and IPC namespaces of the job's own and its private folder a tmpfs: made; no "
                              f"PID namespace of the job's own ({pid_why}): where no cgroup can be had either (the "
                              "containment line), a process a rank starts can outlive its job",
                     fix="let the harness's user make PID namespaces and mount a /proc in them (a container's seccomp "
                         "profile or masked /proc paths refuse it; Docker: --security-opt seccomp=unconfined and "
                         "systempaths=unconfined, or run the harness outside the container)")
    return Check(name="namespaces", status="ok", measured="user, mount, IPC and PID namespaces of the job's own (a /proc "
                                                          "of its own), its private folder a tmpfs of the job's own: made")


# --------------------------------------------------------------------------- the files


def runs_root_of(opts: DoctorOptions) -> Path:
    from harness.results.records import runs_root

    return runs_root(opts.runs_dir)


def filesystem_of(path: Path) -> str:
    """The file system type and mount point that hold `path` (/proc/mounts: the longest matching mount)."""
    best, kind = "", "?"
    target = str(path.resolve())
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3:
                mount = parts[1].replace("\\040", " ")
                if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                    best, kind = mount, parts[2]
    except OSError:
        return "?"
    return f"{kind} at {best}"


def file_checks(track: Track, opts: DoctorOptions, runs: Path, wanted: list[str]) -> list[Check]:
    """locks, disk-runs, disk-scratch, scratch-root."""
    from harness.launcher.doctor import scratch

    checks = []
    if "locks" in wanted:
        checks.append(locks_check(runs))
    run_bytes = track.checkpoint_cap_gib * GIB + track.log_cap_mib * 2**20  # a record at the track's caps
    checks.append(disk("disk-runs", runs, run_bytes, "a run's record at the track's caps (checkpoint and logs)",
                        "free space on the records' file system, or give --runs-dir (HARNESS_RUNS_DIR) on a larger one"))
    checks.append(scratch.disk_scratch_check(track))
    if "scratch-root" in wanted:
        checks.append(scratch.scratch_root_check())
    return checks


def locks_check(runs: Path) -> Check:
    """flock on the runs folder's file system, as the records' locks take it (harness/results/locks.py)."""
    import fcntl
    import socket

    from harness.results.locks import no_locks_here, open_lock_file

    where = filesystem_of(runs) if runs.exists() else "?"
    try:
        runs.mkdir(parents=True, exist_ok=True)
        where = filesystem_of(runs)
        path = runs / f".doctor-{socket.gethostname()}-{os.getpid()}.lock"
        fh = open_lock_file(path)
    except OSError as exc:
        return Check(name="locks", status="fail", measured=f"{runs} is not writable ({exc})",
                     fix="make the runs folder writable by the harness's user, or give --runs-dir")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError as exc:
        if not no_locks_here(exc):
            return Check(name="locks", status="fail", measured=f"flock on {runs} ({where}): {exc}",
                         fix="read the error: the records' locks must be taken")
        return Check(name="locks", status="warn",
                     measured=f"no flock on {runs} ({where}: {os.strerror(exc.errno)}): runs go on unlocked",
                     fix="mount the records' file system with locks (Lustre -o flock; NFS without nolock, NFSv4 "
                         "local_lock=none): docs/organizer.md")
    finally:
        fh.close()
        path.unlink(missing_ok=True)
    return Check(name="locks", status="ok", measured=f"flock works on {runs} ({where}; between hosts only if the "
                                                     "file system says so: Lustre -o flock, NFSv4)")


def data_check(track: Track, opts: DoctorOptions):
    """The track's data found, its headers and samples checked, fingerprinted (harness/data/prepare.py), as a run
    does; against --data-fingerprint when given. Returns (the check, the prepared data or None)."""
    from harness.data.prepare import prepare_data
    from harness.data.shards import DataError

    try:
        data = prepare_data(track, opts.data_root)
    except (DataError, OSError, ValueError) as exc:
        return Check(name="data", status="fail", measured=str(exc)[:600],
                     fix="stage the shards where the track's [data] root says, or give --data-root (HARNESS_DATA_ROOT)"), None
    measured = (f"{len(data.train)} train + {len(data.val)} val shard(s), {data.train_tokens:,} train tokens, "
                f"fingerprint {data.fingerprint}")
    if opts.data_fingerprint and opts.data_fingerprint != data.fingerprint:
        return Check(name="data", status="fail", measured=f"{measured}, expected {opts.data_fingerprint}",
                     fix=f"this node's data at {data.location} differs from the data the fingerprint was taken on: "
                         "stage it again (or check --data-root)"), data
    return Check(name="data", status="ok", measured=measured), data


# --------------------------------------------------------------------------- the clock


class _Timex(ctypes.Structure):  # struct timex's first fields (adjtimex(2)), with room for the rest
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("rest", ctypes.c_byte * 256)]


TIME_ERROR, STA_UNSYNC = 5, 0x0040


def clock_checks(opts: DoctorOptions, wanted: list[str]) -> list[Check]:
    """clock-sync: the kernel's own word on NTP (what `timedatectl`'s NTPSynchronized and chrony report)."""
    if "clock-sync" not in wanted:
        return []
    if not sys.platform.startswith("linux"):
        return [Check(name="clock-sync", status="skipped", measured=f"adjtimex is Linux-only; this is {sys.platform}")]
    tx = _Timex()  # modes 0: read only
    state = ctypes.CDLL(None, use_errno=True).adjtimex(ctypes.byref(tx))
    if state < 0:
        return [Check(name="clock-sync", status="skipped", measured=f"adjtimex failed: {os.strerror(ctypes.get_errno())}")]
    if state == TIME_ERROR or tx.status & STA_UNSYNC:
        return [Check(name="clock-sync", status="warn",
                      measured=f"the kernel's clock is not NTP-synchronised (adjtimex state {state}, "
                               f"max error {tx.maxerror / 1e6:.3g} s)",
                      fix="run chronyd or systemd-timesyncd on every node (`chronyc tracking` shows it): record and "
                          "log times across nodes are compared")]
    return [Check(name="clock-sync", status="ok", measured=f"NTP-synchronised (max error {tx.maxerror / 1e3:.3g} ms)",
                  value=tx.maxerror / 1e3, unit="ms")]
