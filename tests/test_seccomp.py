"""The seccomp filter of every sandboxed process (harness/ranks/confine/seccomp.py): another process's limits,
priority and scheduling are refused; the process's own, and reading another's, are not; its children
inherit it; torch runs under it."""

from __future__ import annotations

import pytest
import subprocess
import sys

from conftest import ROOT

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)

PROBE = """
import os, resource, subprocess, sys
from harness.ranks.confine import seccomp
assert seccomp.install() == "", "not installed"
parent = os.getppid()
def outcome(call):
    try:
        call()
        return "ok"
    except OSError as exc:
        return f"errno {exc.errno}"
nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
results = {
    "another's limit": outcome(lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE, nofile)),
    "another's limit, read": outcome(lambda: resource.prlimit(parent, resource.RLIMIT_NOFILE)),
    "its own limit": outcome(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)),
    "its own limit by prlimit(0)": outcome(lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, nofile)),
    "another's priority": outcome(lambda: os.setpriority(os.PRIO_PROCESS, parent, 0)),
    "the user's priority": outcome(lambda: os.setpriority(os.PRIO_USER, 0, 0)),
    "its own priority": outcome(lambda: os.setpriority(os.PRIO_PROCESS, 0, 1)),
    "another's scheduler": outcome(lambda: os.sched_setscheduler(parent, os.SCHED_IDLE, os.sched_param(0))),
}
child = subprocess.run([sys.executable, "-c", "import os, resource; resource.prlimit(os.getppid(), "
                        "resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE))"], capture_output=True)
results["a child, another's limit"] = "errno 1" if b"PermissionError" in child.stderr else "ok"
import torch
torch.set_num_threads(2)
results["torch"] = "ok" if float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()) == 64 ** 3 else "wrong"
print(results)
"""


def test_other_processes_limits_and_priorities_are_refused_and_its_own_are_not():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == {
        "another's limit": "errno 1", "another's limit, read": "ok", "its own limit": "ok",
        "its own limit by prlimit(0)": "ok", "another's priority": "errno 1", "the user's priority": "errno 1",
        "its own priority": "ok", "another's scheduler": "errno 1", "a child, another's limit": "errno 1",
        "torch": "ok"}


FOREIGN = """
import ctypes, mmap, os, sys
from harness.ranks.confine import seccomp
if sys.argv[1] == "filtered":
    assert seccomp.install() == "", "not installed"
# i386 getpid (20) through int $0x80, as a 64-bit process may call it where the kernel has IA32 emulation
code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20; int $0x80; ret
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
i386 = ctypes.CFUNCTYPE(ctypes.c_int32)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()
libc = ctypes.CDLL(None, use_errno=True)
x32 = libc.syscall(0x40000000 | 39)  # getpid through the x32 table (__X32_SYSCALL_BIT)
print({"i386": "pid" if i386 == os.getpid() else i386, "x32": "pid" if x32 == os.getpid() else ctypes.get_errno()})
"""


def test_calls_through_a_foreign_abi_are_refused():
    """Issue 30: prlimit64 through the i386 table (int $0x80) changed another process's limit past a filter that
    judged native numbers only. Every call of a foreign ABI is refused: a real int $0x80, and an x32 number."""
    import platform

    assert platform.machine() == "x86_64", "this test makes x86-64 calls"
    bare = subprocess.run([sys.executable, "-c", FOREIGN, "bare"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    filtered = subprocess.run([sys.executable, "-c", FOREIGN, "filtered"], capture_output=True, text=True, timeout=60,
                              cwd=ROOT)
    assert filtered.returncode == 0, filtered.stderr
    assert eval(filtered.stdout) == {"i386": -1, "x32": 1}  # -EPERM from int $0x80; EPERM from the x32 call
    # Without the filter the i386 call reaches the kernel (where it has IA32 emulation, as here): the door is real.
    assert bare.returncode != 0 or eval(bare.stdout)["i386"] == "pid", bare.stdout + bare.stderr


UNCHARGED = """
import ctypes, os, sys
from harness.ranks.confine import seccomp
if sys.argv[1] == "filtered":
    assert seccomp.install() == "", "not installed"
libc = ctypes.CDLL(None, use_errno=True)
# perf_event_open of a software dummy event on this process (struct perf_event_attr: type 1, size 128, config 9)
attr = (ctypes.c_uint8 * 128)()
ctypes.c_uint32.from_buffer(attr, 0).value = 1
ctypes.c_uint32.from_buffer(attr, 4).value = 128
ctypes.c_uint64.from_buffer(attr, 8).value = 9
fd = libc.syscall(298, ctypes.byref(attr), 0, -1, -1, 0)
perf = "fd" if fd >= 0 else ctypes.get_errno()
# bpf(BPF_MAP_CREATE) of an array map of one 4-byte value
battr = (ctypes.c_uint32 * 8)(2, 4, 4, 1, 0, 0, 0, 0)
bfd = libc.syscall(321, 0, ctypes.byref(battr), ctypes.sizeof(battr))
import fcntl, tempfile
with tempfile.TemporaryFile() as fh:
    try:
        fcntl.fcntl(fh.fileno(), 1024, fcntl.F_WRLCK)  # F_SETLEASE
        lease = "taken"
    except OSError as exc:
        lease = exc.errno
print({"perf_event_open": perf, "bpf": "fd" if bfd >= 0 else ctypes.get_errno(), "lease": lease})
"""


def test_calls_that_allocate_kernel_memory_no_cgroup_is_charged_for_are_refused():
    """The red team held 1.2 GiB of perf ring buffers past a 0.5 GiB job memory cap, unseen: the kernel charges
    them to no memory cgroup. perf_event_open and bpf are refused in every sandboxed process (EPERM); without the
    filter the same perf call reaches the kernel and gives a descriptor (perf_event_paranoid 2 allows one's own).
    A lease on a file (fcntl F_SETLEASE) is refused too: the second red team kept its checkpoint from the
    launcher's reads under one; without the filter the same lease is taken."""
    import platform

    assert platform.machine() == "x86_64", "this test makes x86-64 calls"
    filtered = subprocess.run([sys.executable, "-c", UNCHARGED, "filtered"], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
    assert filtered.returncode == 0, filtered.stderr
    assert eval(filtered.stdout) == {"perf_event_open": 1, "bpf": 1, "lease": 1}
    bare = subprocess.run([sys.executable, "-c", UNCHARGED, "bare"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert bare.returncode == 0, bare.stderr
    assert eval(bare.stdout)["lease"] == "taken", bare.stdout  # leases-enable: the door is real without the filter
    import os
    from pathlib import Path

    paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    if os.geteuid() == 0 or paranoid <= 2:  # the host lets a process watch itself: the door is real without the filter
        assert eval(bare.stdout)["perf_event_open"] == "fd", bare.stdout


CLONES = """
import ctypes, os, sys, threading
from harness.ranks.confine import seccomp
if sys.argv[1] == "filtered":
    assert seccomp.install() == "", "not installed"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
ret = libc.syscall(435, None, 0)  # clone3 with no arguments: EINVAL from a kernel that has it, ENOSYS from the filter
out["clone3"] = ctypes.get_errno() if ret < 0 else "made"
SIGCHLD, CLONE_PARENT = 17, 0x8000
ret = libc.syscall(56, CLONE_PARENT | SIGCHLD, None, None, None, None)  # the raw call: a fork whose parent is ours
if ret == 0:
    os._exit(0)
out["clone_parent"] = ctypes.get_errno() if ret < 0 else "made"
done = []
t = threading.Thread(target=lambda: done.append(1))  # glibc's pthread_create: clone3 first, then clone
t.start(); t.join()
out["thread"] = "ok" if done else "none"
pid = os.fork()
if pid == 0:
    os._exit(7)
out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
import subprocess
out["spawn"] = subprocess.run(["true"]).returncode  # Python's own vfork and exec
pid = os.posix_spawn("/bin/true", ["true"], os.environ)  # glibc's posix_spawn: clone3 first, then clone
out["posix_spawn"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
import torch
torch.set_num_threads(2)
out["torch"] = "ok" if float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()) == 64 ** 3 else "wrong"
print(out)
"""


def test_a_process_can_neither_leave_its_cgroup_through_clone3_nor_give_its_children_to_its_parent():
    """The red team started a process in another cgroup with clone3(CLONE_INTO_CGROUP), and made a chain of
    CLONE_PARENT children whose exit statuses waited on a rank's parent, outside the job's PID namespace, and held
    the job's end. Under the filter clone3 answers ENOSYS (glibc falls back to clone, whose flags the filter reads)
    and clone with CLONE_PARENT is refused; threads, fork, posix_spawn and torch's threads work as before. Without
    the filter the same clone3 reaches the kernel (EINVAL for its empty arguments) and CLONE_PARENT makes a child."""
    import errno
    import platform

    assert platform.machine() == "x86_64", "this test makes x86-64 calls"
    # through a shell that waits for it: a CLONE_PARENT child's status goes to the shell, never to pytest
    via_shell = ["sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-c", CLONES]
    filtered = subprocess.run([*via_shell, "filtered"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert filtered.returncode == 0, filtered.stderr
    assert eval(filtered.stdout) == {"clone3": errno.ENOSYS, "clone_parent": errno.EPERM, "thread": "ok", "fork": 7,
                                     "spawn": 0, "posix_spawn": 0, "torch": "ok"}, filtered.stdout
    bare = subprocess.run([*via_shell, "bare"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bare.returncode == 0, bare.stderr
    assert eval(bare.stdout)["clone3"] != errno.ENOSYS and eval(bare.stdout)["clone_parent"] == "made", bare.stdout
