"""The sandbox every process that runs a team's code enters before importing it (Linux Landlock).

Landlock lets an unprivileged process forbid itself, and every process it starts, access to all
paths but those it allows; it is applied while the process still has one thread (it binds the
calling thread and its future children), before anything of the submission is imported. (A model
process forked from its template, harness/ranks/models/model_template.py, has torch loaded but one thread.)

What a process may touch is a `Policy`, decided by the harness process that starts it:
- read (and execute): the Python installation, the harness package, the system's libraries and
  tools (/usr, /lib*, /bin, /etc, /proc, /sys, GPU device files; libraries and C compilers installed
  elsewhere, `library_dirs`, `compiler_dirs`), the submission's own folder,
  and exactly the files the phase needs (the train shards one by one, or the checkpoint);
- write: its own private folder, and /dev/shm: training ranks their job's (NCCL needs it; the host's,
  swept after the job, where the host refuses the job a namespace), the check and model processes
  one of their own (harness/ranks/confine/rootfs.py; none where they have no root of their own, never the
  host's). In the private folder only, files may also be renamed and linked from one folder to
  another (Landlock's REFER: Triton's cache moves each file it builds into place so), and training
  ranks may make Unix sockets and FIFOs there (Python's multiprocessing hands every tensor a
  DataLoader worker returns over a socket it binds in the temporary folder: the private folder's tmp/);
- its processes' own files in /proc: CUDA's driver names each thread it starts by writing
  /proc/self/task/<tid>/comm at cuInit; refused, every CUDA call fails with error 304 "OS call failed"
  (measured on the lent H200), in this process and in those it starts (Inductor's compile workers).
  Granted on /proc where /proc is the job's own, hidepid=ptraceable, its global entries read-only, and the
  process either has its own network or does not run as root (harness/ranks/confine/private_proc.py: to root,
  /proc/sys, /proc/sysrq-trigger and the shared network's /proc/<pid>/net files are writable by owner);
  elsewhere on this process's own /proc/<pid>/task only (private_proc.OWN_TASKS), Inductor then compiling in
  the process, and the report says so;
- network: TCP for training ranks (the process group); none for evaluation's model processes;
- IPC: abstract Unix sockets only where NCCL needs them (training); signals only to itself and
  its children (Landlock scopes).
Never readable: the validation shards, the runs tree, the leaderboard, the data cache's other
files, and the Python test suites (`<stdlib>/test` of every Python in an allowed folder: the
`local-text` track's validation text, harness/data/text.py): an allowed folder that holds one is
granted entry by entry around it (`grant_around`), since Landlock only ever adds rights. `check_protected`
refuses a policy that would expose one of the others through an allowed folder.

Where Landlock is missing (another OS, an old or configured-out kernel), `apply` reports that
it is not active and why; the track decides whether that is allowed (`sandbox = "auto"`) or
stops the run (`"required"`). The record says which it was. The cap on what a check or model process writes, and
what the launcher or the scorer undoes on its log once it is gone: harness/ranks/confine/logs.py.
"""

from __future__ import annotations

import glob
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from harness.ranks import interpreter
from harness.ranks.confine.host_dirs import SYSTEM_DIRS, compiler_dirs, library_dirs  # noqa: F401  (sandbox's names)
from harness.ranks.confine.logs import FILE_CAP_BYTES, cap_file_size

DEVICE_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
GPU_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps/*", "/dev/dri/*")
# Training ranks between nodes: InfiniBand verbs and RDMA CM (NCCL's IB transport), GDRCopy. Denied, NCCL
# falls back to TCP sockets without a word, and every figure would describe the fallback.
NETWORK_DEVICE_GLOBS = ("/dev/infiniband/*", "/dev/gdrdrv")


# The one list of variables a process running team code may inherit (training ranks, the check process,
# evaluation's model processes): the system's basics, the libraries' own settings (torch, its compilers,
# CUDA, NCCL and the transports under it, the thread pools) and the harness's three (the run, the launcher,
# and the submission's folder for a team's spawned workers: contract.PACKAGE_DIR_ENV). Everything else an
# organiser's environment holds (tokens, credentials, where runs, data and caches live, SLURM's view
# of the allocation) is dropped; home, temporary folder and compiler caches are the process's private
# folder. torch elastic adds each rank's RANK, WORLD_SIZE, MASTER_ADDR... on top.
KEEP_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "LD_LIBRARY_PATH", "PYTHONPATH",
            "PYTHONHASHSEED", "PYTHONUNBUFFERED", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_HOME",
            "CUDA_PATH", "CUDA_DEVICE_ORDER", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "CC", "CXX", "HARNESS_RUN_ID", "HARNESS_LAUNCHER_PID",
            "HARNESS_SUBMISSION_PACKAGE_DIR")  # CC, CXX: the compilers Triton and Inductor call
KEEP_ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHINDUCTOR_", "TRITON_", "PYTORCH_", "CUDA_", "CUDNN_", "CUBLAS_",
                     "NVIDIA_", "GLOO_", "UCX_", "FI_", "OFI_", "MLX5_", "RDMAV_", "IBV_", "SHARP_", "HCOLL_", "OMP_",
                     "KMP_", "MKL_", "NVSHMEM_", "CUTLASS_")
# Whatever its prefix, a variable whose name says it holds a secret stays with the organiser (NVIDIA_API_KEY).
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASS", "CREDENTIAL", "AUTH", "COOKIE", "PRIVATE")


def allowed_environment(environ=None) -> dict[str, str]:
    """The variables of `environ` (default: this process's) that team code may see (KEEP_ENV)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items()
            if (k in KEEP_ENV or k.startswith(KEEP_ENV_PREFIXES)) and not any(w in k.upper() for w in SECRET_WORDS)}


def private_environment(private_dir: str | Path) -> dict[str, str]:
    d = Path(private_dir)
    env = allowed_environment()
    env.update(interpreter.harness_path(env))  # the harness the parent imported, whatever the working folder holds
    env.update(HOME=str(d), TMPDIR=str(d), TORCHINDUCTOR_CACHE_DIR=str(d / "inductor"), TRITON_CACHE_DIR=str(d / "triton"),
               CUDA_CACHE_PATH=str(d / "cuda"), PYTHONDONTWRITEBYTECODE="1")
    return env


@dataclass(frozen=True, kw_only=True)
class Policy:
    read_dirs: tuple[str, ...] = ()  # read and execute beneath
    read_files: tuple[str, ...] = ()  # read, one file each
    write_dirs: tuple[str, ...] = ()  # read, write, create, remove beneath (no sockets, no fifos)
    private_dir: str = ""  # the one of write_dirs that is the process's own: renames and links across its folders
    sockets: bool = False  # Unix sockets and FIFOs may be made in private_dir (training ranks' DataLoader workers)
    device_files: tuple[str, ...] = ()  # read, write and ioctl (GPUs need ioctl)
    network: bool = False  # TCP bind and connect
    abstract_unix: bool = False  # abstract Unix sockets across processes (NCCL)
    hidden: tuple[str, ...] = ()  # folders under read_dirs that stay unreadable (the Python test suites)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Policy":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def python_dirs() -> list[str]:
    """The interpreter, its standard library and site-packages, and the harness package itself."""
    import harness

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(harness.__file__).resolve().parent)}
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p) and os.path.isdir(p):
            dirs.add(p)
    return sorted(dirs)


# Held out of every sandbox: the Python test suites, where local-text's validation text comes from. Matched
# under every folder a policy allows (the running Python's, and any other Python under /usr).
HIDDEN_GLOBS = ("lib/python3*/test", "lib64/python3*/test", "python3*/test", "local/lib/python3*/test")


def hidden_paths(roots: list[str]) -> list[str]:
    """The existing folders under `roots` that no sandboxed process may read (HIDDEN_GLOBS)."""
    found = set()
    for root in roots:
        for pattern in HIDDEN_GLOBS:
            found.update(os.path.realpath(p) for p in glob.glob(os.path.join(root, pattern)) if os.path.isdir(p))
    return sorted(found)


def _below(path: str, folder: str) -> bool:
    """`path` lies strictly beneath `folder` (both normalised, absolute)."""
    return path != folder and path.startswith(folder if folder.endswith("/") else folder + "/")


def grant_around(dirs: list[str], hidden: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(folders, files, folders to list only) to grant so that everything under `dirs` is reachable except
    the contents of `hidden`: a folder that holds a hidden path is replaced by its entries, recursively
    along the way to it (Landlock rules add rights beneath a path and cannot take any away), and may
    still be listed (Python's import system lists every folder on its path when its caches are
    invalidated; a listing below it shows names, never text). A few hundred rules for an installation.

    Every sandboxed process computes this before its first import, evaluation's twice on its critical
    path: so an entry's real path is its folder's real path and its name, unless the entry is itself a
    link (one realpath per link, not one lstat per component of every entry).

    A folder is listed once, by whichever name reaches it first: Landlock's rules hold the inodes they
    name, so another name's rules would grant nothing more, and two links back up the tree (`a -> ..`,
    `b -> ..`) would otherwise make the walk exponential."""
    hidden_real = [os.path.realpath(h) for h in hidden]  # `..` or a link in a hidden path hides what it names
    out_dirs: list[str] = []
    out_files: list[str] = []
    list_only: list[str] = []
    listed: set[str] = set()
    queue: list[tuple[str, str, bool | None]] = [(d, os.path.realpath(d), None) for d in dirs]
    while queue:
        d, real, is_dir = queue.pop()
        if any(real == h or _below(real, h) for h in hidden_real):
            continue  # hidden itself, or inside it
        if not (os.path.isdir(d) if is_dir is None else is_dir):
            out_files.append(d)
            continue
        if not any(_below(h, real) for h in hidden_real):
            out_dirs.append(d)
            continue
        if real in listed:
            continue
        listed.add(real)
        try:
            with os.scandir(d) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            continue
        list_only.append(d)
        for entry in entries:
            path = os.path.join(d, entry.name)
            try:
                linked = entry.is_symlink()
                kind = None if linked else entry.is_dir(follow_symlinks=False)
            except OSError:
                linked, kind = True, None  # resolve it the slow way
            queue.append((path, os.path.realpath(path) if linked else os.path.join(real, entry.name), kind))
    return sorted(set(out_dirs)), sorted(set(out_files)), sorted(set(list_only))


def build_policy(*, submission_dir: str, private_dir: str, read_files: list[str] = (), gpu: bool = False,
                 training: bool = False, protected: list[str] = ()) -> Policy:
    """The policy of a process that runs the submission: training ranks (network, /dev/shm, NCCL's
    abstract sockets) or evaluation and check processes (none of those)."""
    devices = list(DEVICE_FILES)
    if gpu:
        devices += [p for g in GPU_GLOBS for p in glob.glob(g) if os.path.exists(p)]
    if gpu and training:
        devices += [p for g in NETWORK_DEVICE_GLOBS for p in glob.glob(g) if os.path.exists(p)]
    read_dirs = [*python_dirs(), *(d for d in SYSTEM_DIRS if os.path.isdir(d)), *library_dirs(protected=protected),
                 *compiler_dirs(protected=protected), submission_dir]
    if gpu and os.path.isdir("/run/nvidia-persistenced"):
        read_dirs.append("/run/nvidia-persistenced")  # its socket; not the rest of /run (secrets, other daemons)
    read_files = list(read_files)
    if training:  # name resolution for the process group, where these link out of /etc (into /run, often)
        for name in ("/etc/resolv.conf", "/etc/hosts"):
            real = os.path.realpath(name)
            if real != name and os.path.isfile(real):
                read_files.append(real)
    write_dirs = [private_dir]
    if training and os.path.isdir("/dev/shm"):
        write_dirs.append("/dev/shm")
    return Policy(read_dirs=tuple(read_dirs), read_files=tuple(read_files), write_dirs=tuple(write_dirs),
                  private_dir=private_dir, sockets=training, device_files=tuple(devices), network=training,
                  abstract_unix=training and gpu, hidden=tuple(hidden_paths(read_dirs)))


def check_protected(policy: Policy, protected: list[str]) -> list[str]:
    """The protected paths (validation shards, runs tree, leaderboard, data cache) that an allowed
    folder would expose; the launcher refuses such a policy or says so in the record."""
    exposed = []
    roots = [Path(d).resolve() for d in (*policy.read_dirs, *policy.write_dirs)]
    for path in protected:
        target = Path(path).resolve()
        if any(target == root or root in target.parents for root in roots):
            exposed.append(str(target))
    return exposed


@dataclass
class SandboxReport:
    active: bool
    why: str = ""
    abi: int | None = None
    threads: int | None = None
    policy: dict = field(default_factory=dict)
    namespaces: dict = field(default_factory=dict)  # evaluation's model processes: harness/ranks/confine/namespaces.py
    filesystem: dict = field(default_factory=dict)  # evaluation's model processes: harness/ranks/confine/rootfs.py
    seccomp: str = ""  # "on", or why the filter of harness/ranks/confine/seccomp.py is not installed
    proc_writes: str = ""  # what of /proc it may write: its processes' own files, or its own threads' names only
    cgroup: dict = field(default_factory=dict)  # the job's cgroup, where the launcher made one (harness/ranks/confine/cgroup.py)

    def to_dict(self) -> dict:
        return asdict(self)


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def apply(policy: Policy, own_network: bool = False) -> SandboxReport:
    """Restrict this process (and everything it starts) to the policy. Call it single-threaded. `own_network`:
    the process is in a network namespace of its own (enter's), which decides what of /proc it may write."""
    if not sys.platform.startswith("linux"):
        return SandboxReport(False, f"Landlock is Linux-only; this is {sys.platform}")
    try:
        from py_landlock import Landlock, get_abi_version
        from py_landlock.flags import AccessFs, Scope
    except ImportError:
        return SandboxReport(False, "the py-landlock package is not installed")
    try:
        abi = int(get_abi_version())
    except Exception as exc:  # not compiled in, or disabled at boot
        return SandboxReport(False, f"Landlock is not available on this kernel ({exc})")
    threads = _threads()
    if threads != 1:  # Landlock binds the calling thread only: threads started earlier would escape
        return SandboxReport(False, f"the process already runs {threads} threads", abi, threads)
    rx = AccessFs.READ_FILE | AccessFs.READ_DIR | AccessFs.EXECUTE
    rw = (rx | AccessFs.WRITE_FILE | AccessFs.MAKE_REG | AccessFs.MAKE_DIR | AccessFs.REMOVE_FILE
          | AccessFs.REMOVE_DIR | AccessFs.MAKE_SYM)
    if abi >= 3:
        rw |= AccessFs.TRUNCATE
    # The private folder's rule alone grants REFER (ABI 2 on; before it every rename across folders fails):
    # Landlock then lets a file move or link only between folders whose rules both grant it, and never to
    # where it would gain rights, so nothing moves in from a read-only folder or out to /dev/shm.
    own = rw | (AccessFs.REFER if abi >= 2 else AccessFs(0))
    if policy.sockets:
        own |= AccessFs.MAKE_SOCK | AccessFs.MAKE_FIFO
    device = AccessFs.READ_FILE | AccessFs.WRITE_FILE | (AccessFs.IOCTL_DEV if abi >= 5 else AccessFs(0))
    if abi >= 3:
        device |= AccessFs.TRUNCATE
    from harness.ranks.confine import private_proc

    ll = Landlock(strict=False)  # best effort: the kernel's ABI decides which rights exist
    read_dirs, around_files, list_only = grant_around(list(policy.read_dirs), list(policy.hidden))
    for d in read_dirs:
        if os.path.isdir(d):
            ll.add_path_rule(d, access=rx)
    for d in list_only:  # the folders that hold a hidden one: their names, not their files
        ll.add_path_rule(d, access=AccessFs.READ_DIR)
    for f in around_files:  # files beside a hidden folder, granted one by one
        if os.path.isfile(f):
            ll.add_path_rule(f, access=AccessFs.READ_FILE | AccessFs.EXECUTE)
    for f in policy.read_files:
        if os.path.isfile(f):
            ll.add_path_rule(f, access=AccessFs.READ_FILE)
    private = os.path.realpath(policy.private_dir) if policy.private_dir else None
    for d in policy.write_dirs:
        if os.path.isdir(d):
            ll.add_path_rule(d, access=own if os.path.realpath(d) == private else rw)
    for f in policy.device_files:
        if os.path.exists(f):
            ll.add_path_rule(f, access=device)
    proc_writes = private_proc.grant_writes(ll, AccessFs.WRITE_FILE | (AccessFs.TRUNCATE if abi >= 3 else AccessFs(0)),
                                            own_network)
    if policy.network:
        ll.allow_all_network()
    if policy.abstract_unix and abi >= 6:
        ll.allow_scope(Scope.ABSTRACT_UNIX_SOCKET)
    try:
        ll.apply()
    except Exception as exc:
        return SandboxReport(False, f"Landlock refused the rules ({type(exc).__name__}: {exc})", abi, threads)
    from harness.ranks.confine import seccomp  # Landlock scopes signals; this, the limits and priorities of others

    refused = seccomp.install()
    return SandboxReport(True, f"Landlock ABI {abi}", abi, threads, policy.to_dict(), seccomp=refused or "on",
                         proc_writes=proc_writes)


def preload() -> None:
    """For a process that forks sandboxed children (evaluation's model template): load now what `enter`
    would load in each child, on its critical path: Landlock's bindings, whose first call looks libc up
    by running `ldconfig -p`, and the seccomp filter's module. Restricts nothing in this process."""
    try:
        from harness.ranks.confine import seccomp  # noqa: F401
        from py_landlock import get_abi_version

        get_abi_version()  # a query of the kernel's ABI: no ruleset, no restriction
    except Exception:  # noqa: BLE001  (missing or refused: `enter` says why, in the child, as without this)
        pass


def enter(policy: Policy | None, off_why: str) -> SandboxReport:
    """Everything a process that runs team code without the network enters, in order, on one thread
    and before the submission: new namespaces (harness/ranks/confine/namespaces.py: writing the uid map needs
    /proc, which Landlock then closes), a root of the policy's paths only (harness/ranks/confine/rootfs.py:
    mounting needs the new user namespace), no capabilities, then Landlock. `off_why` says why there
    is no policy. On success this process has forked (namespaces.isolate): the caller goes on in
    the child."""
    if policy is None:
        report = SandboxReport(False, off_why)
        report.namespaces = report.filesystem = {"active": False, "why": off_why}
        return report
    from harness.ranks.confine import namespaces, rootfs

    isolation = namespaces.isolate()
    root, proc_note = rootfs.confine(policy) if not isolation else ("no namespaces, so no root of its own", "")
    dropped = rootfs.drop_capabilities()  # whatever happened above
    root = root or (f"its capabilities could not be dropped ({dropped})" if dropped else "")
    cap_file_size(FILE_CAP_BYTES)  # its log included: no file it writes outgrows the cap (EFBIG past it)
    if not root:  # its own root holds a /dev/shm of its own: writable like the private folder
        policy = replace(policy, write_dirs=(*policy.write_dirs, rootfs.SHM))
    report = apply(policy, own_network=not isolation)
    report.namespaces = {"active": not isolation, "why": isolation or "new user, PID, IPC and network namespaces"}
    report.filesystem = {"active": not root, "why": root or rootfs.describe(proc_note),
                         "own_proc": proc_note.startswith("a /proc of its own")}
    return report
