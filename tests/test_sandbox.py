"""What the sandbox lets a process do in its own folders (harness/ranks/confine/sandbox.py, rootfs.py): what
compilers and data loaders need there, and nothing that reaches past them.

Each test runs a small script in a fresh process: the sandbox, once applied, is for life.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, ROOT, TINY_TRACK, only_record, processes_of_run, quick_track

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Landlock and namespaces are Linux's")

# The process's sandbox as the harness builds it: a training rank's (sandbox.apply; the job's namespace is
# not part of this), or the check's and evaluation's model processes' (sandbox.enter: namespaces, a root
# of its own, Landlock). Then `body`, which fills `out`; `attempt` records "done" or the errno's name.
SANDBOXED = """
import errno, json, os, sys
from harness.ranks.confine import sandbox
args = json.loads(sys.argv[1])
policy = sandbox.build_policy(submission_dir=args["submission"], private_dir=args["private"],
                              training=args["kind"] == "training")
box = sandbox.apply(policy) if args["kind"] == "training" else sandbox.enter(policy, "")
out = {"active": box.active, "why": box.why, "filesystem": box.filesystem}
P, S = args["private"], args["submission"]

def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
"""


def sandboxed(tmp_path, kind: str, body: str, env: dict | None = None, timeout_s: float = 120,
              prelude: str = "") -> dict:
    """Run `prelude`, SANDBOXED, then `body` as a process of `kind` ("training", "check"); returns its `out`."""
    private, submission = tmp_path / "private", tmp_path / "submission"
    private.mkdir()
    submission.mkdir()
    (submission / "submission.py").write_text("# the team's code\n")
    args = {"private": str(private), "submission": str(submission), "kind": kind}
    code = prelude + SANDBOXED + body + "\nprint('OUT ' + json.dumps(out), flush=True)\n"
    ran = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True,
                         timeout=timeout_s, cwd=private, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    lines = [line for line in ran.stdout.splitlines() if line.startswith("OUT ")]
    assert ran.returncode == 0 and lines, ran.stdout + ran.stderr
    out = json.loads(lines[-1][4:])
    assert out["active"], out  # Landlock on this machine: what follows is the sandbox's doing
    return out


# ----------------------------------------------------------------------------- renames across folders (REFER)


RENAMES = """
os.makedirs(f"{P}/tmp/build"); os.makedirs(f"{P}/triton/KEY")
open(f"{P}/tmp/build/kernel.so", "w").write("built")
attempt("rename_across_folders", lambda: os.replace(f"{P}/tmp/build/kernel.so", f"{P}/triton/KEY/kernel.so"))
open(f"{P}/tmp/a", "w").write("a")
attempt("link_across_folders", lambda: os.link(f"{P}/tmp/a", f"{P}/triton/KEY/a"))
attempt("rename_folder", lambda: os.rename(f"{P}/tmp/build", f"{P}/triton/build"))
attempt("link_in_from_read_only", lambda: os.link(f"{S}/submission.py", f"{P}/stolen.py"))
attempt("rename_in_from_read_only", lambda: os.rename(f"{S}/submission.py", f"{P}/stolen.py"))
attempt("rename_out_to_read_only", lambda: os.rename(f"{P}/tmp/a", f"{S}/planted.py"))
attempt("link_out_to_read_only", lambda: os.link(f"{P}/tmp/a", f"{S}/planted.py"))
out["moved"] = open(f"{P}/triton/KEY/kernel.so").read() if os.path.exists(f"{P}/triton/KEY/kernel.so") else None
"""


@pytest.mark.parametrize("kind", ["training", "check"])
def test_a_file_moves_between_folders_of_the_private_folder_and_never_in_or_out_of_it(tmp_path, kind):
    """Triton's cache writes each file in a temporary folder and renames it into <cache>/<key>/: a rename
    across folders, which Landlock refuses (EXDEV) unless the rule grants REFER. Granted on the private
    folder alone: a file moves or links between its folders, never in from a folder the process may only
    read (a link to a file it may not write, under a name it may) nor out into one."""
    got = sandboxed(tmp_path, kind, RENAMES)
    assert got["rename_across_folders"] == "done" and got["moved"] == "built", got
    assert got["link_across_folders"] == "done" and got["rename_folder"] == "done", got
    for name in ("link_in_from_read_only", "rename_in_from_read_only", "rename_out_to_read_only",
                 "link_out_to_read_only"):
        assert got[name] in ("EXDEV", "EACCES", "EROFS"), (name, got)
    assert (tmp_path / "submission" / "submission.py").read_text() == "# the team's code\n"
    assert not (tmp_path / "submission" / "planted.py").exists() and not (tmp_path / "private" / "stolen.py").exists()


OLD_KERNEL = """
import py_landlock, py_landlock.landlock
py_landlock.get_abi_version = py_landlock.landlock.get_abi_version = lambda: 1  # Linux 5.13 to 5.18
"""


def test_on_a_kernel_without_refer_the_sandbox_applies_as_before(tmp_path):
    """Landlock ABI 1 has no REFER: every rename across folders is refused whatever the rules say. The
    sandbox still applies there, with every other right of the private folder, and says its ABI."""
    body = RENAMES + "open(f'{P}/tmp/b', 'w').write('b')\n" \
                     "attempt('rename_in_one_folder', lambda: os.replace(f'{P}/tmp/b', f'{P}/tmp/c'))\n"
    got = sandboxed(tmp_path, "training", body, prelude=OLD_KERNEL)
    assert got["why"] == "Landlock ABI 1" and got["rename_in_one_folder"] == "done", got
    assert got["rename_across_folders"] == "EXDEV" and got["link_in_from_read_only"] == "EXDEV", got


# ----------------------------------------------------------------------------- a /dev/shm of its own


SHARED_MEMORY = """
import multiprocessing
def locks():
    lock = multiprocessing.Lock()  # sem_open: a file in /dev/shm
    with lock:
        pass
def pool():
    with multiprocessing.Pool(1) as p:  # its queues hold locks too; Inductor's compile pool is one
        out["pool_sum"] = sum(p.map(abs, [-1, -2, -3]))
attempt("lock", locks)
attempt("pool", pool)
attempt("shm_write", lambda: open(f"/dev/shm/{args['mark']}", "w").write("x"))
st = os.statvfs("/dev/shm") if os.path.isdir("/dev/shm") else None
out["shm_bytes"] = st and st.f_blocks * st.f_frsize
"""


def test_the_check_and_model_processes_have_a_private_dev_shm(tmp_path):
    """multiprocessing.Lock() (sem_open) and a Pool need /dev/shm; the check's and evaluation's model
    processes' own root had none, so locks failed and Inductor's compile pool died unseen. They get a
    fresh tmpfs there, capped, never the host's /dev/shm (another process could use that as a channel)."""
    mark = f"harness-test-shm-{os.getpid()}-{tmp_path.name}"
    try:
        got = sandboxed(tmp_path, "check", SHARED_MEMORY.replace("args['mark']", repr(mark)))
    finally:
        leaked = os.path.exists(f"/dev/shm/{mark}")
        if leaked:
            os.unlink(f"/dev/shm/{mark}")
    assert got["filesystem"]["active"], got  # a root of its own on this machine
    assert got["lock"] == "done" and got["pool"] == "done" and got["pool_sum"] == 6, got
    assert got["shm_write"] == "done" and not leaked, got  # its own: nothing of it reaches the host's
    assert got["shm_bytes"] and got["shm_bytes"] <= 1 << 30, got


@pytest.mark.slow
def test_a_get_model_that_takes_a_lock_and_runs_pools_works_in_the_check_training_and_evaluation(cli, tmp_path):
    """shared_memory's get_model takes a multiprocessing lock and maps over a forked pool of one, as Inductor's
    compile pool does, then over a spawned one a function of submission.py (imported by its name in the
    worker): in the check process, a training rank and evaluation's model process, each in its sandbox."""
    result = cli("run", str(FIXTURES / "shared_memory"), "--track", str(quick_track(tmp_path)))
    run_dir, record = only_record(tmp_path / "runs")
    assert result.code == 0 and record["status"] == "ok", record["reason"]
    for log in ("preflight.log", "rank0.log", "eval-model-rank0.log"):
        text = (run_dir / "logs" / log).read_text()
        assert "SHARED-MEMORY lock and pool ok" in text and "SPAWNED pool ok" in text, (log, text)
    box = record["sandbox"]
    assert box["check"]["filesystem"]["active"] and box["training"]["active"] and box["evaluation"]["model"]["active"], box
    assert processes_of_run(record["run_id"]) == []


# ----------------------------------------------------------------------------- sockets and FIFOs


SOCKETS = """
import socket
def bind(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
attempt("socket_private", lambda: bind(f"{P}/tmp/s.sock"))
attempt("fifo_private", lambda: os.mkfifo(f"{P}/tmp/f.fifo"))
if os.path.isdir("/dev/shm") and args["kind"] == "training":
    attempt("socket_shm", lambda: bind(f"/dev/shm/harness-test-{os.getpid()}.sock"))
"""


def test_training_ranks_make_sockets_and_fifos_in_their_private_folder_only(tmp_path):
    """Python's multiprocessing binds a Unix socket under the temporary folder for every tensor a DataLoader
    worker hands back (its resource sharer): training ranks may make sockets and FIFOs in their private
    folder, nowhere else; the check and model processes need none and get none."""
    (tmp_path / "t").mkdir()
    got = sandboxed(tmp_path / "t", "training", "os.makedirs(f'{P}/tmp')\n" + SOCKETS)
    assert got["socket_private"] == "done" and got["fifo_private"] == "done", got
    assert got.get("socket_shm", "EACCES") == "EACCES", got
    (tmp_path / "c").mkdir()
    got = sandboxed(tmp_path / "c", "check", "os.makedirs(f'{P}/tmp')\n" + SOCKETS)
    assert got["socket_private"] == "EACCES" and got["fifo_private"] == "EACCES", got


DATALOADER = """
os.makedirs(f"{P}/tmp")
import tempfile; tempfile.tempdir = None  # TMPDIR, set before the process started, is the private folder's
import torch
from torch.utils.data import DataLoader, Dataset
class Numbers(Dataset):
    def __len__(self):
        return 6
    def __getitem__(self, i):
        return torch.full((4,), float(i))
loader = DataLoader(Numbers(), batch_size=2, num_workers=1, timeout=20)  # a hang is a failure, not a wait
try:
    out["sums"] = [float(b.sum()) for b in loader]
except RuntimeError as exc:
    out["sums"] = str(exc)
"""


@pytest.mark.slow
def test_a_dataloader_with_a_worker_returns_tensors_in_a_training_rank(tmp_path):
    """What an open-division script with num_workers > 0 does: each batch a worker returns travels as a
    shared-memory file descriptor, handed over through a Unix socket bound in the temporary folder. Without
    the socket the batch never arrives and the rank hangs to the hard limit."""
    import tempfile

    # A short folder, as the ranks' own is (/tmp/harness-train-XXXXXXXX): a Unix socket's path holds 107 bytes,
    # and pytest's folders under xdist (…/popen-gw1/test_a_dataloader_with_a_worke0/private/tmp/pymp-…) do not fit.
    short = Path(tempfile.mkdtemp(prefix="dl-", dir="/tmp"))
    try:
        got = sandboxed(short, "training", DATALOADER, env={"TMPDIR": str(short / "private" / "tmp"),
                                                            "OMP_NUM_THREADS": "1"})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert got["sums"] == [4.0, 20.0, 36.0], got


FORKSERVER = """
os.makedirs(f"{P}/tmp")
import multiprocessing
with multiprocessing.get_context("forkserver").Pool(1) as pool:
    out["pool"] = pool.map(abs, [-1, 2])
"""


@pytest.mark.slow
def test_a_forkserver_pool_runs_in_a_training_rank():
    """Python's forkserver (3.14's default start method) listens on a Unix socket in the temporary folder,
    which a training rank may make in its private folder."""
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))  # a socket's path holds 107 bytes
    try:
        got = sandboxed(short, "training", FORKSERVER, env={"TMPDIR": str(short / "private" / "tmp")})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    assert got["pool"] == [1, 2], got


NAME_A_THREAD = """
import threading
def name_a_thread():  # as CUDA's driver names the threads it starts at cuInit: fopen(".../comm", "w")
    ready, done = threading.Event(), threading.Event()
    t = threading.Thread(target=lambda: (ready.set(), done.wait()))
    t.start()
    ready.wait()
    try:
        with open(f"/proc/self/task/{t.native_id}/comm", "w") as fh:
            fh.write("cuda-EvtHandlr")
        with open(f"/proc/self/task/{t.native_id}/comm") as fh:
            return fh.read().strip()
    finally:
        done.set()
        t.join()
"""
THREAD_NAMES = NAME_A_THREAD + """
attempt("thread_name", lambda: out.update(name_read_back=name_a_thread()))
attempt("proc_self_other", lambda: open("/proc/self/coredump_filter", "w").write("0x33"))
attempt("proc_sys", lambda: open("/proc/sys/kernel/hostname", "w").write("x"))
"""


@pytest.mark.parametrize("kind", ["training", "check"])
def test_a_sandboxed_process_names_its_own_threads_and_writes_nothing_global_in_proc(tmp_path, kind):
    """CUDA's driver names each thread it starts by writing /proc/self/task/<tid>/comm; refused (Landlock
    granted /proc read-only), cuInit fails with error 304 and no GPU works (seen on the lent H200: every
    check, training rank and model process). Its own threads' names are granted, nothing global of /proc."""
    got = sandboxed(tmp_path, kind, THREAD_NAMES)
    assert got["thread_name"] == "done" and got["name_read_back"] == "cuda-EvtHandlr", got
    # its own process's other files: where /proc is the host's (this training rank, sandboxed without the job's
    # namespace), its threads' names only; in a /proc of its own (the check's), its processes' files
    assert got["proc_self_other"] == ("EACCES" if kind == "training" else "done"), got
    assert got["proc_sys"] in ("EACCES", "EROFS"), got


CHILD_NAMES_THREADS = """
import subprocess
child = subprocess.run([sys.executable, "-c", THREAD_NAMES_CHILD], capture_output=True, text=True)
out["child_thread_name"] = child.stdout.strip() or child.stderr.strip()[-300:]
out["pids_seen"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["own_pid"] = os.getpid()
out["proc_writes"] = box.proc_writes
attempt("proc_sys", lambda: open("/proc/sys/kernel/hostname", "w").write("x"))
attempt("sysrq", lambda: open("/proc/sysrq-trigger", "w").write("h"))
"""
THREAD_NAMES_CHILD = NAME_A_THREAD + """
try:
    name_a_thread()
    print("done")
except OSError as exc:
    print(type(exc).__name__, exc.errno)
"""


def test_what_the_check_and_model_processes_start_names_its_threads_in_a_proc_that_shows_and_opens_nothing_else(
        tmp_path):
    """Inductor's compile workers ask CUDA for the GPU before they compile a kernel: a process started by a
    sandboxed one must name its threads too (error 304 otherwise; on the H200 every torch.compile of the 124M
    baseline failed so). The check's and model processes' /proc is their own, hidepid=ptraceable, every global
    entry read-only: they write their processes' files, see only themselves and what they start, and write
    nothing global (as root, the owner of /proc/sys and /proc/sysrq-trigger, included)."""
    got = sandboxed(tmp_path, "check", CHILD_NAMES_THREADS.replace("THREAD_NAMES_CHILD", repr(THREAD_NAMES_CHILD)))
    assert got["child_thread_name"] == "done", got
    assert got["proc_writes"].startswith("its processes' own files"), got
    assert got["pids_seen"] == [got["own_pid"]], got  # the child is gone; nothing outside it is shown
    assert got["proc_sys"] == "EROFS" and got["sysrq"] in ("EROFS", "ENOENT"), got


def test_where_proc_is_the_hosts_a_training_rank_names_its_own_threads_only_and_says_so(tmp_path):
    """Without the job's own /proc (a rank sandboxed with the host's), the grant falls back to the process's own
    threads: it starts CUDA, what it starts cannot, and its sandbox report says which it got."""
    got = sandboxed(tmp_path, "training", CHILD_NAMES_THREADS.replace("THREAD_NAMES_CHILD", repr(THREAD_NAMES_CHILD)))
    assert got["proc_writes"].startswith("its own threads' names only"), got
    assert got["child_thread_name"] == "PermissionError 13", got
    assert got["proc_sys"] == "EACCES", got


def test_in_a_real_run_what_the_team_starts_names_its_threads_and_sees_no_process_of_the_harness(cli, tmp_path):
    """The run's own path, the training ranks in the job's namespace included: get_model starts a process that
    names a thread (as Inductor's compile workers make CUDA do), in the check, the training rank and evaluation's
    model process; each sees in /proc only itself (its child gone), none of the harness's processes (the job's
    PID 1, the torch elastic agent); the record says what of /proc each may write."""
    result = cli("run", str(FIXTURES / "child_names_threads"), "--track", str(quick_track(tmp_path)))
    run_dir, record = only_record(tmp_path / "runs")
    assert result.code == 0 and record["status"] == "ok", record["reason"]
    # A training rank keeps the host's network: run as root (this suite, CI), it names its own threads
    # only, and Inductor compiles in the rank; run as a plain user, what it starts names its threads too.
    from harness.ranks.confine import private_proc

    as_root = private_proc.runs_as_root()
    training = record["sandbox"]["training"]["proc_writes"]
    assert training.startswith("its own threads' names only" if as_root else "its processes' own files"), training
    for log in ("preflight.log", "rank0.log", "eval-model-rank0.log"):
        lines = [json.loads(line.split(" ", 1)[1]) for line in (run_dir / "logs" / log).read_text().splitlines()
                 if line.startswith("CHILD-THREAD-NAME ")]
        child = "PermissionError" if log == "rank0.log" and as_root else "done"
        assert lines and all(got["child"] == child and got["seen"] == [got["own"]] for got in lines), (log, lines)
        if log == "rank0.log":
            passed = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")  # the harness passes Inductor's variables on
            assert all(got["compile_threads"] == ("1" if as_root else passed) for got in lines), lines
    box = record["sandbox"]
    for report in (box["check"], box["evaluation"]["model"]):  # networks of their own
        assert report["proc_writes"].startswith("its processes' own files"), report
    assert processes_of_run(record["run_id"]) == []


def test_proc_is_called_hardened_only_hidden_from_what_it_cannot_trace_and_read_only_beside_the_processes(tmp_path):
    """The grant of /proc writes hangs on private_proc.hardened: the mount /proc resolves to (the topmost, by its
    id) is a procfs with hidepid=ptraceable (invisible would spare a gid= group: root's, or the overflow group
    that every unmapped group of a process reads as), each global entry resolves to a read-only mount, and so
    does every mount beneath. Each missing piece is named."""
    from harness.ranks.confine import private_proc

    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "sys").mkdir()
    (proc / "sysrq-trigger").write_text("")
    (proc / "thread-self").symlink_to("42")
    p = str(proc)
    ids = {p: 20, f"{p}/sys": 21, f"{p}/sysrq-trigger": 22}

    def said(proc_line: str, *mounts: str, on=None) -> str:
        lines = [f"20 1 0:5 / {p} {proc_line}"] + list(mounts)
        return private_proc.hardened(p, "\n".join(lines) + "\n", mount_id=lambda path: (on or ids)[path])

    good = "rw,nosuid - proc proc rw,hidepid=ptraceable"
    sys_ro, sysrq_ro = f"21 20 0:5 /sys {p}/sys ro,nosuid - proc proc rw", f"22 20 0:5 /sysrq {p}/sysrq-trigger ro - proc proc rw"
    assert said(good, sys_ro, sysrq_ro) == ""
    assert "not a procfs" in said("rw - tmpfs tmpfs rw", sys_ro, sysrq_ro)
    assert "no hidepid=ptraceable" in said("rw - proc proc rw,hidepid=invisible,gid=65534", sys_ro, sysrq_ro)
    assert "sysrq-trigger" in said(good, sys_ro, sysrq_ro.replace(" ro ", " rw "))
    assert "sys" in said(good, sysrq_ro, on={**ids, f"{p}/sys": 20})  # /proc/sys on the procfs itself: writable
    # a writable mount stacked on the read-only one: the path resolves to it
    assert "sys" in said(good, sys_ro, sysrq_ro, f"23 21 0:6 / {p}/sys rw - tmpfs tmpfs rw", on={**ids, f"{p}/sys": 23})
    # a writable mount deeper beneath: reachable under /proc, so not hardened
    assert "binfmt_misc" in said(good, sys_ro, sysrq_ro, f"24 21 0:7 / {p}/sys/fs/binfmt_misc rw - binfmt_misc x rw")
    # a mount the procfs hides (the host's, beneath it): not reachable, not counted
    assert said(good, sys_ro, sysrq_ro, f"25 1 0:8 / {p}/sys/fs/binfmt_misc rw - binfmt_misc x rw") == ""


def test_a_namespace_holder_that_outlives_its_kill_does_not_hold_the_launcher(monkeypatch):
    """A holder stuck in the kernel (a file system) takes no SIGKILL yet: the launcher waits a bounded time, says so in
    `unended` (the record's notes), and never reads its pipe (that read would wait for it)."""
    from harness.launcher.control import job_namespace

    monkeypatch.setattr(job_namespace, "END_WITHIN_S", 0.5)
    holder = job_namespace.JobNamespace()
    proc, real_wait = holder.proc, holder.proc.wait
    assert holder.active, holder.why

    def stuck_wait(timeout=None):
        assert timeout is not None, "the launcher waited without a bound for a holder that may never end"
        raise subprocess.TimeoutExpired(proc.args, timeout)

    proc.poll, proc.kill, proc.wait = (lambda: None), (lambda: None), stuck_wait  # as one stuck in the kernel
    try:
        holder.end_job()
        assert f"the job's namespace holder (pid {proc.pid}) had not ended 0 s after SIGKILL" in holder.unended
    finally:
        os.kill(proc.pid, 9)
        real_wait(timeout=60)


def test_the_job_namespaces_proc_is_hardened_for_the_ranks_that_join_it():
    """The training job's PID 1 mounts the job's /proc as private_proc wants it (harness/launcher/control/
    namespace_holder.py): a process that joins the job as a rank does, its capabilities dropped, finds it hardened
    and sees only itself (not PID 1, which is not dumpable, nor the launcher outside)."""
    import json
    import subprocess

    from harness.launcher.control.job_namespace import JobNamespace

    holder = JobNamespace()
    try:
        assert holder.active and not holder.pid_why, holder.why
        code = f"""
import json, os
from harness.ranks.confine import namespaces, private_proc, rootfs
why, pids = namespaces.join_job({holder.socket_path!r}, None, lambda: rootfs.drop_capabilities(verify=False))
dropped = rootfs.drop_capabilities()
print("OUT " + json.dumps({{"why": why, "pids": pids, "dropped": dropped, "hardened": private_proc.hardened(),
                           "seen": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "own": os.getpid()}}))
"""
        ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = [line for line in ran.stdout.splitlines() if line.startswith("OUT ")]
        assert ran.returncode == 0 and lines, ran.stdout + ran.stderr
        got = json.loads(lines[-1][4:])
        assert got["why"] == "" and got["pids"] and got["dropped"] == "", got
        assert got["hardened"] == "" and got["seen"] == [got["own"]], got
    finally:
        holder.close()


COMPILE = """
import subprocess
def compile_():  # the first on PATH, by its path: execvp would go on to /usr/bin/gcc when it is refused
    ran = subprocess.run([os.environ["PATH"].split(":")[0] + "/gcc"], capture_output=True, text=True)
    out["compiler_said"] = ran.stdout.strip()
attempt("compiler", compile_)
"""


@pytest.mark.parametrize("kind", ["training", "check"])
def test_a_c_compiler_installed_outside_the_system_folders_runs_in_every_sandbox(tmp_path, kind):
    """Triton and Inductor run the C compiler found on PATH while a model compiles; an image's own GCC under
    /opt (the lent H200's /opt/gcc/bin/gcc) was denied, and every torch.compile failed with PermissionError.
    Its installation folder (the parent of its bin/, where cc1 and its headers live) is granted."""
    prefix = tmp_path / "opt" / "gcc"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "libexec").mkdir()
    (prefix / "libexec" / "cc1").write_text("the compiler proper\n")
    gcc = prefix / "bin" / "gcc"
    gcc.write_text(f"#!/bin/sh\nread -r line < {prefix}/libexec/cc1 && echo \"$line\"\n")
    gcc.chmod(0o755)
    got = sandboxed(tmp_path, kind, COMPILE, env={"PATH": f"{prefix / 'bin'}:{os.environ['PATH']}"})
    assert got["compiler"] == "done" and got["compiler_said"] == "the compiler proper", got


def test_compiler_folders_are_the_prefix_of_bin_never_the_root_nor_a_protected_folder(tmp_path):
    from harness.ranks.confine import sandbox

    prefix = tmp_path / "gcc-13"
    (prefix / "bin").mkdir(parents=True)
    for name in ("gcc", "g++"):
        (prefix / "bin" / name).write_text("#!/bin/sh\n")
        (prefix / "bin" / name).chmod(0o755)
    env = {"PATH": str(prefix / "bin"), "CC": f"{prefix / 'bin' / 'gcc'} -m64"}
    assert sandbox.compiler_dirs(env) == [str(prefix.resolve())]
    assert sandbox.compiler_dirs(env, protected=[str(prefix / "runs")]) == []  # it would expose the runs tree
    assert sandbox.compiler_dirs({"PATH": "/usr/bin", "CC": "/gcc"}) == []  # system folders, never /
    home = Path(os.path.expanduser("~"))  # a compiler in ~/bin: never the home folder, its .ssh with it
    if (home / "bin").is_dir() or not home.exists():
        return
    (home / "bin").mkdir(parents=True)
    try:
        (home / "bin" / "gcc").write_text("#!/bin/sh\n")
        (home / "bin" / "gcc").chmod(0o755)
        assert sandbox.compiler_dirs({"PATH": str(home / "bin")}) == []
    finally:
        shutil.rmtree(home / "bin")


NEEDS_A_SOCKET = {
    "forkserver": ("with multiprocessing.get_context('forkserver').Pool(1) as pool:\n        pool.map(abs, [-1])",
                   "needs the 'spawn' start method"),
    "manager": ("with multiprocessing.Manager() as manager:\n        manager.list([1])",
                "a multiprocessing Manager serves its objects over a socket"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(NEEDS_A_SOCKET))
def test_the_check_refuses_what_needs_a_socket_and_says_what_to_use(cli, tmp_path, kind):
    """The check makes no socket, as evaluation's model processes make none: a get_model that needs one (a
    forkserver pool, a Manager's server) would fail in evaluation, after its training, so it fails the check,
    through `harness check`, with the fix."""
    code, fix = NEEDS_A_SOCKET[kind]
    folder = tmp_path / kind
    shutil.copytree(FIXTURES / "ok_bigram", folder)
    text = (folder / "submission.py").read_text()
    (folder / "submission.py").write_text("import multiprocessing\n" + text.replace(
        "def get_model(config):\n", f"def get_model(config):\n    {code}\n"))
    result = cli("check", str(folder), "--track", str(TINY_TRACK), "--json")
    report = json.loads(result.out)
    assert result.code == 1 and not report["accepted"] and report["sandbox"]["active"], result.text
    assert any(fix in p["fix"] and p["file"].startswith("submission.py:") for p in report["problems"]), report["problems"]


SPOOF = """
import socket
os.makedirs(f"{P}/tmp")
def bind(path):
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
for i, path in enumerate(HARNESS_SOCKETS):
    attempt(f"unlink {i}", lambda: os.unlink(path))  # to bind its own in its place
    attempt(f"bind beside {i}", lambda: bind(path + ".2"))
    bind(f"{P}/tmp/fake{i}.sock")
    attempt(f"move in {i}", lambda: os.replace(f"{P}/tmp/fake{i}.sock", path))
"""


def test_a_training_rank_can_neither_replace_nor_imitate_the_harness_sockets(tmp_path):
    """The harness's own sockets (the control channel, the job's namespace holder) live in folders of their
    own, outside the private folder: a rank that may make sockets there still cannot remove one of the
    harness's, bind another beside it, or move its own into its place."""
    from harness.launcher.control.channel import ChannelServer
    from harness.launcher.control.job_namespace import JobNamespace

    channel, holder = ChannelServer(expected_ranks=[0]), JobNamespace()
    try:
        paths = [channel.path, holder.socket_path]
        got = sandboxed(tmp_path, "training", SPOOF.replace("HARNESS_SOCKETS", repr(paths)))
        for path in paths:
            assert not os.path.commonpath([path, str(tmp_path / "private")]) == str(tmp_path / "private")
            assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700
        attempts = {k: v for k, v in got.items() if k[:-2] in ("unlink", "bind beside", "move in")}
        assert len(attempts) == 6 and set(attempts.values()) <= {"EACCES", "EXDEV"}, got
        assert all(os.path.exists(p) for p in [channel.path] + ([holder.socket_path] if holder.active else []))
    finally:
        channel.close()
        holder.close()


# ----------------------------------------------------------------------------- libraries outside /usr (issue 23, item 2)


def test_libraries_outside_the_system_folders_are_readable_in_every_sandbox(tmp_path):
    """A cluster's driver and NCCL under /opt or /cm, named by LD_LIBRARY_PATH or CUDA_HOME: read (and mapped
    for execution) by training ranks, the check and model processes alike; their neighbours are not."""
    libs, cuda = tmp_path / "opt" / "driver" / "lib", tmp_path / "cm" / "cuda"
    libs.mkdir(parents=True)
    (cuda / "lib64").mkdir(parents=True)
    (libs / "libcuda.so.1").write_text("driver")
    (cuda / "lib64" / "libnccl.so.2").write_text("nccl")
    (tmp_path / "opt" / "secret").write_text("no")
    env = {"LD_LIBRARY_PATH": f"relative/lib:{libs}", "CUDA_HOME": str(cuda)}
    body = f"""
attempt("driver", lambda: open({str(libs / 'libcuda.so.1')!r}).read())
attempt("nccl", lambda: open({str(cuda / 'lib64' / 'libnccl.so.2')!r}).read())
attempt("neighbour", lambda: open({str(tmp_path / 'opt' / 'secret')!r}).read())
"""
    for kind in ("training", "check"):
        (tmp_path / kind).mkdir()
        out = sandboxed(tmp_path / kind, kind, body, env=env)
        # the neighbour: refused (Landlock), or not there at all (the check's own root binds only what it grants)
        assert (out["driver"], out["nccl"]) == ("done", "done") and out["neighbour"] in ("EACCES", "ENOENT"), (kind, out)


def test_library_folders_are_absolute_real_and_never_the_root(tmp_path):
    from harness.ranks.confine.sandbox import library_dirs

    real = tmp_path / "lib"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    got = library_dirs({"LD_LIBRARY_PATH": f"/:lib:{link}:/usr/lib:{real}", "CUDA_HOME": ""})
    assert str(real) in got and "/" not in got and "lib" not in got and "/usr/lib" not in got
    assert got.count(str(real)) == 1
    # A folder that holds the records or the validation data is never granted, whatever names it.
    (tmp_path / "runs").mkdir()
    assert library_dirs({"LD_LIBRARY_PATH": str(tmp_path)}, protected=[str(tmp_path / "runs")]) == []
    assert library_dirs({"LD_LIBRARY_PATH": str(real)}, protected=[str(tmp_path / "runs")]) == [str(real)]


def test_a_log_set_to_mode_000_through_its_descriptor_is_reset_by_a_harness_that_is_not_root(tmp_path):
    """Attack of 2026-12-03: a sandboxed process holds its log as stdout and may fchmod it to 000; reset_log opened
    it for reading first, which its owner may not do then (root may: the suite's own user hid it), so a harness run
    as a plain user left the log unreadable and with its mode. Run as a plain user (root's suite: as nobody)."""
    import tempfile

    from harness.ranks.confine import logs

    folder = Path(tempfile.mkdtemp(prefix="harness-log-"))  # pytest's own folders are root's alone (0700)
    try:
        _reset_as_a_plain_user(logs, folder)
    finally:
        shutil.rmtree(folder)


def _reset_as_a_plain_user(logs, folder: Path) -> None:
    import struct

    log = folder / "eval-model-rank0.log"
    log.write_text("what the model process printed\n")
    # an access ACL set through its descriptor, giving user 65534 the right to read it (tag, perm, id entries)
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, uid) for tag, perm, uid in (
        (0x01, 6, 0xFFFFFFFF), (0x02, 4, 65534), (0x04, 4, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF), (0x20, 0, 0xFFFFFFFF)))
    os.setxattr(log, "system.posix_acl_access", acl)
    os.chmod(log, 0o4000)  # setuid, and no right to read it, as fchmod on its descriptor can make it
    if os.geteuid() != 0:  # a plain user already: the harness as it runs here
        logs.reset_log(log)
        assert log.read_text() == "what the model process printed\n"
        assert oct(log.stat().st_mode & 0o7777) == oct(0o600) and os.listxattr(log) == []
        return
    nobody = 65534
    os.chown(log, nobody, nobody)
    os.chmod(log, 0o4000)  # chown cleared the setuid bit
    os.chmod(folder, 0o755)
    pid = os.fork()
    if pid == 0:  # the harness as a plain user: the file's owner, no capability
        code = 1
        try:
            os.setgid(nobody)
            os.setuid(nobody)
            logs.reset_log(log)
            code = 0 if log.read_text() == "what the model process printed\n" else 2
        except BaseException as exc:  # noqa: BLE001  (said, then the exit status says it failed)
            print(f"as a plain user: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert oct(log.stat().st_mode & 0o7777) == oct(0o600) and os.listxattr(log) == []  # no ACL left


def test_grant_around_reaches_everything_but_the_hidden_folder_through_links_too(tmp_path):
    """The rules that replace a folder holding a hidden one (Landlock cannot take rights away): every entry on
    the way is granted by itself, and a link is judged by where it leads, so neither a link to the hidden
    folder nor a folder reached through a link opens it. Pure: no sandbox is entered."""
    from harness.ranks.confine.sandbox import grant_around

    root = tmp_path / "lib"
    (root / "py" / "hidden").mkdir(parents=True)
    (root / "py" / "hidden" / "secret.txt").write_text("validation text")
    (root / "py" / "pkg").mkdir()
    (root / "py" / "hidden2").mkdir()  # beside the hidden folder, its name a prefix of this one's: not hidden
    (root / "py" / "mod.py").write_text("")
    (root / "other").mkdir()
    (root / "other" / "f.txt").write_text("")
    (root / "alias").symlink_to(root / "py")  # a folder holding the hidden one, under another name
    (root / "door").symlink_to(root / "py" / "hidden")  # the hidden folder under another name
    (root / "file_link").symlink_to(root / "other" / "f.txt")
    (root / "dangling").symlink_to(root / "nowhere")
    (root / "py" / "up1").symlink_to("..")  # two links back up the tree: each folder is walked once, not 2^40 times
    (root / "py" / "up2").symlink_to("..")
    r = str(root)
    # The hidden folder named with `..` is hidden all the same.
    folders, files, list_only = grant_around([r], [f"{r}/py/hidden/../hidden/"])
    # `alias` is `py` by another name: listed once (Landlock's rules hold inodes), its entries granted through `py`.
    assert folders == [f"{r}/other", f"{r}/py/hidden2", f"{r}/py/pkg"]
    assert files == [f"{r}/dangling", f"{r}/file_link", f"{r}/py/mod.py"]
    assert list_only == [r, f"{r}/py"]
    # A hidden folder named through a link of its own is hidden all the same; a folder given that lies inside it is not granted.
    assert grant_around([f"{r}/door", f"{r}/py/hidden"], [str(root / "py" / "hidden")]) == ([], [], [])


def test_the_template_preloads_landlock_without_restricting_itself_or_starting_a_thread():
    """sandbox.preload, in evaluation's model template before it forks its copies: Landlock's bindings are ready (their
    lookup of libc, which runs `ldconfig -p`, is not repeated in each model process), and the template itself is still
    unrestricted and on one thread (Landlock binds the calling thread only: each model process enters it after the fork)."""
    code = """
import json
from harness.ranks.confine import sandbox
sandbox.preload()
import py_landlock.libc
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
print(json.dumps({k: status[k].strip() for k in ("Threads", "Seccomp", "NoNewPrivs")} | {"ready": py_landlock.libc._initialized}))
"""
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1]) == {"Threads": "1", "Seccomp": "0", "NoNewPrivs": "0", "ready": True}
