"""Evaluation's model processes in their own namespaces: what the scoring process leaves behind is
not there for the check process that runs after it (harness/ranks/confine/namespaces.py)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

WRITER = """
import ctypes, json, os, sys
from harness.ranks.confine.namespaces import isolate
why = isolate()
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x5EC12E7, 4096, 0o1666)  # IPC_CREAT: a segment the next process could open
key = libc.syscall(248, b"user", b"answers", b"next=17", 7, -4)  # add_key to the user keyring
print(json.dumps({"why": why, "pid": os.getpid(), "shm": shm, "key": key}), flush=True)
"""
READER = """
import ctypes, json, socket
from harness.ranks.confine.namespaces import isolate
why = isolate()
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x5EC12E7, 4096, 0o666)
key = libc.syscall(250, 10, -4, b"user", b"answers", 0)  # KEYCTL_SEARCH in the user keyring
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9))
    udp = "sent"
except OSError as exc:
    udp = str(exc)
print(json.dumps({"why": why, "shm": shm, "key": key, "udp": udp}), flush=True)
"""
HOPPER = """
import os, time
from harness.ranks.confine.namespaces import isolate
assert isolate() == ""
print(os.getpid(), flush=True)  # 1: the namespace's init
if os.fork() == 0:  # a chain that forks its successor and lets its parent die, faster than any scan
    while True:
        if os.fork() == 0:
            os.setsid()
            time.sleep(0.002)
            continue
        os._exit(0)
time.sleep(60)
"""


def run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_what_one_model_process_leaves_in_kernel_ipc_the_next_cannot_see():
    wrote = run(WRITER)
    assert wrote["why"] == "" and wrote["pid"] == 1, wrote  # isolated: PID 1 of its own namespace
    assert wrote["shm"] >= 0 and wrote["key"] > 0  # it could make them, in its own namespaces
    read = run(READER)
    assert read["shm"] == -1 and read["key"] == -1, read  # gone with the namespaces they were made in
    assert "unreachable" in read["udp"].lower(), read  # no loopback to talk over either


def test_a_process_that_forks_faster_than_anyone_looks_dies_with_the_model_process():
    proc = subprocess.Popen([sys.executable, "-c", HOPPER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == "1"
    time.sleep(0.5)
    tree = psutil.Process(proc.pid).children(recursive=True)
    assert tree, "the model process forked nothing"
    proc.kill()  # what the scorer does to a model process: the waiting parent goes, then its child, PID 1
    proc.wait(timeout=10)
    time.sleep(0.5)
    alive = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and HOPPER.strip()[:20] in " ".join(p.info["cmdline"])]
    assert alive == [], f"{len(alive)} process(es) of the namespace survived"


ENDING = """
import ctypes, os, select, signal, sys, time
from harness.ranks.confine.namespaces import isolate
how = sys.argv[1]
if how.endswith("early"):  # the parent is slow to start waiting: a signal, or the child's end, comes before it
    fork = os.fork
    def slow_fork():
        pid = fork()
        if pid:
            time.sleep(2)
        return pid
    os.fork = slow_fork
assert isolate() == ""
if how.startswith("exit"):
    os._exit(3)
if how == "segfault":
    ctypes.string_at(0)
# PID 1 of its namespace: a signal from outside reaches it only where it has a handler.
signal.signal(signal.SIGTERM, lambda *_: os._exit(7))
# Waited for through the wakeup fd, which the handler's C part writes: a time.sleep could miss a signal that lands
# just before its system call (Python runs a handler between bytecodes), and sleep on.
wake_r, wake_w = os.pipe()
os.set_blocking(wake_w, False)
signal.set_wakeup_fd(wake_w)
print("waiting", flush=True)
select.select([wake_r], [], [], 60)  # SIGTERM, sent to the parent, is forwarded here; its handler runs next
"""


@pytest.mark.parametrize("how, returncode", [("exit", 3), ("segfault", -signal.SIGSEGV), ("term", 7),
                                             ("term-early", 7), ("exit-sigchld-ignored-early", 3)])
def test_the_namespace_parent_ends_as_the_process_in_the_namespace_did(how, returncode):
    """Whoever waits for an isolated process (the scorer for a model process, the launcher for the check)
    waits for its parent in the old namespace: that parent must end as its child did, exit code or
    signal, or a crash in native code reads as a plain exit 1. A signal sent to the parent is forwarded
    (and reaches a handler the process in the namespace set)."""
    # Started as the scorer and the launcher start theirs, with no signal blocked: a process inherits its
    # parent's mask across exec, and a pytest worker's may hold SIGTERM blocked after other tests (the parent
    # then never sees it, and nothing is forwarded: seen once in a full suite, never alone).
    proc = subprocess.Popen([sys.executable, "-c", ENDING, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: _started_as(how))
    if how.startswith("term"):
        assert proc.stdout.readline().strip() == "waiting"
        # Once it waits (asleep), the parent holds the signals it forwards blocked and takes them synchronously: a
        # Python handler runs between bytecodes, so one that landed just before the parent's waitpid went unforwarded
        # until the child ended by itself (4 SIGTERMs of 1,500 with two busy loops beside them; none since).
        asleep = _wait_until(lambda: _status(proc.pid).get("State", "").startswith("S"), within_s=30.0)
        caught = _signals(_status(proc.pid).get("SigCgt", "0"))
        assert asleep and not caught & {signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}, caught
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pids = [proc.pid, *(child.pid for child in psutil.Process(proc.pid).children())]
        masks = {pid: [line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                       if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd", "Threads"))]
                      + [f"wchan {_read_or_why(f'/proc/{pid}/wchan')}", f"cgroup {_read_or_why(f'/proc/{pid}/cgroup')}",
                         f"stack {_read_or_why(f'/proc/{pid}/stack')}"]
                 for pid in pids if Path(f"/proc/{pid}").exists()}
        proc.kill()
        raise AssertionError(f"the parent did not end on SIGTERM; the test's own mask "
                             f"{signal.pthread_sigmask(signal.SIG_BLOCK, set())}, the processes': {masks}")
    assert code == returncode, proc.stderr.read()


def _started_as(how: str) -> None:
    """No signal blocked; SIGCHLD ignored where the case says so (inherited across exec: the parent must set it back
    before its child can end, or the kernel reaps the child and its exit status is lost)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    if "sigchld-ignored" in how:
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)


def _status(pid: int) -> dict[str, str]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


def _signals(mask_hex: str) -> set[int]:
    mask = int(mask_hex, 16)
    return {n + 1 for n in range(64) if mask >> n & 1}


def _wait_until(predicate, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _read_or_why(path: str) -> str:
    try:
        return Path(path).read_text().strip().replace("\n", " | ")
    except OSError as exc:
        return f"({exc.strerror})"


CONFINED = """
import errno, json, os, socket, sys
from harness.ranks.confine import namespaces, rootfs, sandbox
args = json.loads(sys.argv[1])
policy = sandbox.build_policy(submission_dir=args["submission"], private_dir=args["private"],
                              read_files=[args["checkpoint"]])
assert namespaces.isolate() == ""
why, proc_note = rootfs.confine(policy)
assert rootfs.drop_capabilities() == ""  # as the model process does, after confine
out = {"why": why, "proc": proc_note, "root": sorted(os.listdir("/")),  # what the root holds (Landlock hides it)
       "other": sorted(os.listdir(os.path.dirname(args["victim"]))),
       "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
out["landlock"] = sandbox.apply(policy).active  # as the model process does

def attempt(name, fn):
    try:
        fn()
        out[name] = "done"
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))

team_file = os.path.join(args["submission"], "submission.py")
attempt("chmod_victim", lambda: os.chmod(args["victim"], 0))
attempt("utime_victim", lambda: os.utime(args["victim"], (0, 0)))
attempt("chmod_team_file", lambda: os.chmod(team_file, 0))
attempt("utime_checkpoint", lambda: os.utime(args["checkpoint"], (0, 0)))
attempt("xattr_team_file", lambda: os.setxattr(team_file, "user.note", b"x"))
attempt("chmod_python", lambda: os.chmod(os.__file__, 0o777))
attempt("new_file_at_root", lambda: open("/planted", "w").close())
attempt("socket", lambda: socket.socket(socket.AF_UNIX).connect(args["socket"]))
attempt("private_write", lambda: open(os.path.join(args["private"], "scratch"), "w").write("ok"))
attempt("root_through_private", lambda: open(os.path.join(args["private"], ".root", "planted"), "w").close())
out["planted"] = os.path.exists("/planted")
out["reads_team_file"] = open(team_file).read()
out["reads_checkpoint"] = open(args["checkpoint"]).read()
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # mount_attr: clear MOUNT_ATTR_RDONLY

def syscall_ok(result):
    if result != 0:
        raise OSError(ctypes.get_errno(), "refused")

# With every capability of its user namespace, it could undo the read-only flags it was given.
attempt("clear_read_only", lambda: syscall_ok(libc.syscall(442, -100, args["submission"].encode(), 0x8000, attr, 32)))
attempt("unmount", lambda: syscall_ok(libc.umount2(args["submission"].encode(), 2)))
attempt("new_namespaces", lambda: syscall_ok(libc.unshare(0x10000000 | 0x00020000)))
attempt("clear_read_only_again", lambda: syscall_ok(libc.syscall(442, -100, args["submission"].encode(), 0x8000, attr, 32)))
print(json.dumps(out), flush=True)
"""


def test_a_model_process_can_change_no_file_it_did_not_make_and_reach_no_socket(tmp_path):
    """Landlock governs opening files, not chmod/utime/setxattr by path nor connect() to a Unix socket: the
    model process's own root holds only the policy's paths, read-only but its private folder."""
    import os
    import socket

    team, private, other = tmp_path / "team", tmp_path / "private", tmp_path / "other"
    for d in (team, private, other):
        d.mkdir()
    (team / "submission.py").write_text("# the team's code\n")
    checkpoint = other / "checkpoint.pt"
    checkpoint.write_text("weights")
    victim = other / "run.json"  # another team's record: same owner, so chmod would be allowed
    victim.write_text("{}")
    before = [os.stat(p) for p in (victim, checkpoint, team / "submission.py")]
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(other / "daemon.sock"))  # a daemon that would run what it is sent
    server.listen(1)
    args = {"submission": str(team), "private": str(private), "checkpoint": str(checkpoint),
            "victim": str(victim), "socket": str(other / "daemon.sock")}
    try:
        got = run(CONFINED.replace("sys.argv[1]", repr(json.dumps(args))))
    finally:
        server.close()
    assert got["why"] == "" and got["landlock"] is True and got["proc"].startswith("a /proc of its own"), got
    assert got["clear_read_only"] == "EPERM" and got["unmount"] == "EPERM", got  # no capability left
    assert got["clear_read_only_again"] in ("EPERM", "EINVAL"), got  # a new namespace's copies are locked
    assert got["chmod_victim"] == got["utime_victim"] == "ENOENT", got  # not in its root at all
    assert got["socket"] == "ENOENT", got
    for name in ("chmod_team_file", "utime_checkpoint", "xattr_team_file", "chmod_python", "new_file_at_root"):
        assert got[name] == "EROFS", (name, got)
    assert got["private_write"] == "done" and (private / "scratch").read_text() == "ok"
    assert got["planted"] is False, got  # the root is not reachable, writable, through the private folder
    assert got["reads_team_file"] == "# the team's code\n" and got["reads_checkpoint"] == "weights"
    assert not {"run", "var", "home", "srv", "mnt"} & set(got["root"]), got["root"]
    assert got["other"] == ["checkpoint.pt"], got["other"]  # of that folder, only the file it may read
    assert got["pids"] == [1], got["pids"]  # a /proc of its own PID namespace
    after = [os.stat(p) for p in (victim, checkpoint, team / "submission.py")]
    assert [(s.st_mode, s.st_mtime_ns) for s in after] == [(s.st_mode, s.st_mtime_ns) for s in before]


HALF_BUILT = """
import json, os, sys
from harness.ranks.confine import namespaces, rootfs, sandbox
args = json.loads(sys.argv[1])
policy = sandbox.build_policy(submission_dir=args["submission"], private_dir=args["private"])
real = rootfs.Libc.read_only
def refuse_team_folder(self, target, recursive):
    if target.endswith(args["submission"]):
        raise rootfs.Refused("read-only refused (simulated)")
    return real(self, target, recursive)
rootfs.Libc.read_only = refuse_team_folder
assert namespaces.isolate() == ""
why, _ = rootfs.confine(policy)
rootfs.drop_capabilities()
through = os.path.join(args["private"], ".root", args["submission"].lstrip("/"), "submission.py")
try:
    open(through, "a").write("# changed")
    wrote = "yes"
except OSError as exc:
    wrote = type(exc).__name__
print(json.dumps({"why": why, "wrote": wrote}), flush=True)
"""


def test_a_root_that_fails_half_built_leaves_nothing_writable_behind(tmp_path):
    """If a step fails after some paths were bound (a kernel or seccomp profile that refuses
    mount_setattr), the half-built root is detached: no bind stays writable through the private folder."""
    team, private = tmp_path / "team", tmp_path / "private"
    team.mkdir(), private.mkdir()
    (team / "submission.py").write_text("# the team's code\n")
    got = run(HALF_BUILT.replace("sys.argv[1]", repr(json.dumps({"submission": str(team), "private": str(private)}))))
    assert got["why"].startswith("no root of its own") and "simulated" in got["why"], got
    assert got["wrote"] != "yes" and (team / "submission.py").read_text() == "# the team's code\n", got


# --------------------------------------------------------------------------- a host that refuses them (issue 23, item 11)


def _proc_sys(tmp_path, **values):
    """A /proc/sys of the test's own: `kernel__apparmor_restrict_unprivileged_userns="1"` is that file."""
    for name, value in values.items():
        path = tmp_path / "proc_sys" / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return str(tmp_path / "proc_sys")


def test_ubuntus_apparmor_restriction_is_named_with_its_fix(tmp_path):
    """Ubuntu 24.04's default (kernel.apparmor_restrict_unprivileged_userns = 1) lets unshare succeed and then
    refuses the namespace every right: only the setting says why, and the words carry the fix."""
    from harness.ranks.confine.namespaces import refused, userns_restriction

    restricted = _proc_sys(tmp_path, kernel__apparmor_restrict_unprivileged_userns="1")
    text = userns_restriction(restricted)
    assert "kernel.apparmor_restrict_unprivileged_userns = 1" in text
    assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in text and "/etc/sysctl.d/" in text
    assert "`userns,`" in text  # the other fix: an AppArmor profile for the harness's Python
    why = refused("could not map the user into its namespace: [Errno 1] Operation not permitted", restricted)
    assert why.startswith("could not map the user") and "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in why
    assert userns_restriction(_proc_sys(tmp_path, kernel__apparmor_restrict_unprivileged_userns="0")) == ""
    assert "sysctl -w user.max_user_namespaces=" in userns_restriction(_proc_sys(tmp_path, user__max_user_namespaces="0"))


def _weakened_record(sandbox="auto"):
    from harness.results.records import RunRecord

    refused_why = ("no namespace of the job's own: could not map the user into its namespace: Operation not "
                   "permitted (unprivileged user namespaces restricted here?)")
    model = {"active": True, "why": "Landlock ABI 6", "namespaces": {"active": False, "why": "unshare failed"},
             "filesystem": {"active": False, "why": "no namespaces, so no root of its own"}}
    return RunRecord(run_id="r1", team="t", track_name="tiny", status="ok", track={"name": "tiny", "sandbox": sandbox},
                     extra={"job_namespace": {"active": False, "why": refused_why}},
                     sandbox={"training": {"active": True, "why": "Landlock ABI 6",
                                           "namespaces": {"active": False, "why": "the launcher made no namespace"}},
                              "evaluation": {"score": model, "check": model}})


def test_a_run_on_a_host_that_refuses_user_namespaces_says_so_loudly_with_the_fix(tmp_path):
    """The sandbox silently weakened to Landlock alone: the record's first warning, and the summary, say so
    and name the host's setting and its fix."""
    from harness.launcher.run.assemble import sandbox_warnings
    from harness.launcher.run.console import summary_lines

    record = _weakened_record()
    sandbox_warnings(record, proc_sys=_proc_sys(tmp_path, kernel__apparmor_restrict_unprivileged_userns="1"))
    loud = record.warnings[0]
    assert loud.startswith("SANDBOX WEAKENED: ") and "Landlock alone" in loud
    assert "training ranks" in loud and "evaluation's model processes (score)" in loud
    assert "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in loud
    assert f"WARNING    {loud}" in summary_lines(record, tmp_path)
    other = _weakened_record()  # no known setting: the refusal's own words, and where else to look
    sandbox_warnings(other, proc_sys=_proc_sys(tmp_path / "none"))
    assert other.warnings[0].startswith("SANDBOX WEAKENED: ") and "seccomp" in other.warnings[0]
    off = _weakened_record(sandbox="off")  # the track turned the sandbox off: nothing was weakened
    sandbox_warnings(off, proc_sys=_proc_sys(tmp_path, kernel__apparmor_restrict_unprivileged_userns="1"))
    assert not any(w.startswith("SANDBOX WEAKENED") for w in off.warnings)
