"""A seccomp filter for processes that run team code: their own limits and priorities, never another's.

Landlock scopes signals (a rank cannot kill its launcher), but not the calls that change another process
of the same user: prlimit(the launcher, RLIMIT_CPU, (1, 2)) has the kernel kill it with SIGXCPU, and a
lowered RLIMIT_FSIZE or CPU limit is inherited by every process the launcher starts next (the next
team's ranks); setpriority and ioprio_set starve it. A team could so end its own unlucky runs (a lost
run is run again by a queue) or fail the teams after it. This filter refuses, with EPERM:

- prlimit64 with a pid other than 0 and a new limit (reading another's limits stays allowed);
- setpriority other than (PRIO_PROCESS, 0): another process, a process group, every process of the user;
- ioprio_set other than (IOPRIO_WHO_PROCESS, 0);
- sched_setscheduler, sched_setparam, sched_setattr with a pid other than 0;
- perf_event_open and bpf, every call: the kernel memory they allocate (a perf ring buffer; a BPF map before
  Linux 5.11) is charged to no memory cgroup, so a job could hold gigabytes past its memory cap
  (harness/launcher/control/job_limits.py) unseen; container runtimes refuse both by default too, and no
  harness, torch, NCCL or Triton path calls them.
- fcntl(F_SETLEASE): a lease on a file makes the launcher's open of it fail (O_NONBLOCK) or wait until the
  kernel breaks it (45 s by default): a script held its checkpoint under a write lease so that the launcher
  could not read it while the job ran (harness/launcher/run/takeback.py StagedWatch). Samba takes leases;
  no harness, torch or training code does.
- clone with CLONE_PARENT: the new process's parent would be the caller's (a training rank's is a process outside
  the job's PID namespace, harness/ranks/confine/namespaces.py join_job), where its exit status would wait,
  unreaped, and hold the namespace's end (a chain of them held a job's end 10 s); fork, threads, vfork and
  posix_spawn never set it.

and clone3 fails with ENOSYS, as if the kernel had none (glibc then makes the same call through clone, which
this filter can read: clone3's flags are in memory it cannot): its CLONE_INTO_CGROUP starts a process in
another cgroup the user may write (a red team's left the job's cgroup so), and its CLONE_PARENT is the above.
Container runtimes' default profiles answer clone3 the same way.

and every call through another ABI than the native one: on x86_64 the i386 table (`int $0x80`, open to
64-bit processes wherever the kernel has IA32 emulation, as stock kernels do) and x32 numbers (the native
arch with bit 30 set), on aarch64 the 32-bit ARM table. Those tables number the same calls differently,
so a filter that judges native numbers alone would let prlimit through them; no harness, Python or
torch code makes such calls.

A process's own calls (pid or who 0: how glibc, Python and torch make them) are untouched. The filter is
classic BPF on seccomp_data, installed with prctl after no_new_privs (which Landlock has set), on one
thread: every thread and child started afterwards inherits it. Architectures: x86_64 and aarch64; on
another the filter is not installed and the report says so.
"""

from __future__ import annotations

import ctypes
import platform

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_EPERM, RET_ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
F_SETLEASE = 1024
CLONE_PARENT = 0x00008000
LD_W_ABS, JEQ_K, JSET_K, RET_K = 0x20, 0x15, 0x45, 0x06
X32_SYSCALL_BIT = 0x40000000  # x86_64: a call numbered with this bit goes to the x32 table
# seccomp_data: nr (u32) at 0, arch (u32) at 4, instruction pointer (u64) at 8, args (6 x u64) from 16.
NR, ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i  # the low 32 bits of argument i (little-endian): a pid_t, an int


def _arg_high(i: int) -> int:
    return 16 + 8 * i + 4


ARCHES = {  # AUDIT_ARCH_*, and the syscall numbers of each
    "x86_64": (0xC000003E, {"prlimit64": 302, "setpriority": 141, "ioprio_set": 251, "sched_setscheduler": 144,
                            "sched_setparam": 142, "sched_setattr": 314, "perf_event_open": 298, "bpf": 321,
                            "fcntl": 72, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, {"prlimit64": 261, "setpriority": 140, "ioprio_set": 30, "sched_setscheduler": 119,
                             "sched_setparam": 118, "sched_setattr": 274, "perf_event_open": 241, "bpf": 280,
                             "fcntl": 25, "clone": 220, "clone3": 435}),
}


class _Program:
    """Classic BPF with labels: each jump names where it goes, offsets are computed at the end."""

    def __init__(self):
        self.ops: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ops)

    def load(self, offset: int) -> None:
        self.ops.append((LD_W_ABS, 0, 0, offset))

    def jeq(self, value: int, if_true: str | int = 0, if_false: str | int = 0) -> None:
        self.ops.append((JEQ_K, if_true, if_false, value))

    def jset(self, mask: int, if_true: str | int = 0, if_false: str | int = 0) -> None:
        self.ops.append((JSET_K, if_true, if_false, mask))

    def ret(self, value: int) -> None:
        self.ops.append((RET_K, 0, 0, value))

    def assemble(self) -> bytes:
        out = bytearray()
        for at, (code, jt, jf, k) in enumerate(self.ops):
            def offset(target):
                return target if isinstance(target, int) else self.labels[target] - at - 1
            out += int(code).to_bytes(2, "little") + bytes([offset(jt), offset(jf)]) + int(k).to_bytes(4, "little")
        return bytes(out)


def build_filter(arch: str) -> bytes | None:
    """The filter for one architecture, as the kernel reads it (struct sock_filter[]); None if unknown."""
    if arch not in ARCHES:
        return None
    audit, nr = ARCHES[arch]
    p = _Program()
    p.load(ARCH)
    p.jeq(audit, 0, "deny")  # another ABI's table (i386 through int $0x80, 32-bit ARM): refused
    p.load(NR)
    if arch == "x86_64":
        p.jset(X32_SYSCALL_BIT, "deny")  # the x32 table, through the native arch
    p.jeq(nr["prlimit64"], "prlimit")
    p.jeq(nr["setpriority"], "setpriority")
    p.jeq(nr["ioprio_set"], "ioprio")
    for name in ("sched_setscheduler", "sched_setparam", "sched_setattr"):
        p.jeq(nr[name], "own_pid")
    for name in ("perf_event_open", "bpf"):  # kernel memory no cgroup is charged for: refused outright
        p.jeq(nr[name], "deny")
    p.jeq(nr["fcntl"], "fcntl")
    p.jeq(nr["clone"], "clone")
    p.jeq(nr["clone3"], "clone3")
    p.ret(RET_ALLOW)
    p.label("clone3")  # no such call, as far as the caller can tell: glibc makes it again through clone
    p.ret(RET_ENOSYS)
    p.label("clone")  # its flags are the first argument on both architectures
    p.load(_arg_low(0))
    p.jset(CLONE_PARENT, "deny", "allow")
    p.label("fcntl")  # a lease: the launcher's reads of the file would fail (EWOULDBLOCK) or wait for it
    p.load(_arg_low(1))
    p.jeq(F_SETLEASE, "deny", "allow")
    p.label("prlimit")  # pid 0, or no new limit (a read): allowed
    p.load(_arg_low(0))
    p.jeq(0, "allow")
    p.load(_arg_low(2))
    p.jeq(0, 0, "deny")
    p.load(_arg_high(2))
    p.jeq(0, "allow", "deny")
    p.label("setpriority")  # (PRIO_PROCESS = 0, who = 0) only
    p.load(_arg_low(0))
    p.jeq(0, "own_who", "deny")
    p.label("ioprio")  # (IOPRIO_WHO_PROCESS = 1, who = 0) only
    p.load(_arg_low(0))
    p.jeq(1, "own_who", "deny")
    p.label("own_who")
    p.load(_arg_low(1))
    p.jeq(0, "allow", "deny")
    p.label("own_pid")
    p.load(_arg_low(0))
    p.jeq(0, "allow", "deny")
    p.label("deny")
    p.ret(RET_EPERM)
    p.label("allow")
    p.ret(RET_ALLOW)
    return p.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> str:
    """Install the filter on this thread (and all it starts); "" when done, else why not."""
    program = build_filter(platform.machine())
    if program is None:
        return f"no seccomp filter for {platform.machine()}"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}"
    buffer = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        return f"prctl(PR_SET_SECCOMP) failed: errno {ctypes.get_errno()}"
    return ""
