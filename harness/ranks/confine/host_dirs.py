"""The folders outside the system ones that a sandbox must still let its processes read and run: the libraries
the dynamic loader and CUDA find there (a cluster's driver or NCCL under /opt or /cm) and the C compilers Triton
and Inductor run (an image's GCC under /opt). Read by the launcher, from its own environment (a team sets none of
it), when it builds a process's policy (harness/ranks/confine/sandbox.py build_policy)."""

from __future__ import annotations

import functools
import glob
import os
from pathlib import Path

SYSTEM_DIRS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/proc", "/sys")


def _ld_so_conf_dirs(path: str = "/etc/ld.so.conf", depth: int = 0) -> list[str]:
    """The folders /etc/ld.so.conf names, its `include` globs followed (two levels deep at most)."""
    found: list[str] = []
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return found
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include ") and depth < 2:
            pattern = line.split(None, 1)[1]
            pattern = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(path), pattern)
            for included in sorted(glob.glob(pattern)):
                found += _ld_so_conf_dirs(included, depth + 1)
        elif line.startswith("/"):
            found.append(line)
    return found


def library_dirs(environ=None, protected=()) -> list[str]:
    """Where the dynamic loader and CUDA find libraries outside the system folders: LD_LIBRARY_PATH's folders,
    CUDA_HOME's and CUDA_PATH's, and those /etc/ld.so.conf names (a cluster's driver or NCCL under /opt or
    /cm). Denied, torch cannot load the driver, or NCCL silently loses its network plugin. Read and execute
    only; never `/` itself, never a relative entry (the process's working folder), and never a folder that
    holds a protected path (the runs tree, the validation data) or the launcher's working folder."""
    environ = os.environ if environ is None else environ
    names = [*environ.get("LD_LIBRARY_PATH", "").split(":"), environ.get("CUDA_HOME", ""), environ.get("CUDA_PATH", ""),
             *_ld_so_conf_dirs()]
    return _outside_system_dirs(names, protected)


# The C and C++ compilers Triton (its launcher stubs: $CC, else clang, gcc, cc) and Inductor (g++, c++) run
# while a model compiles, in training and in the check and model processes alike.
COMPILERS = ("cc", "gcc", "c++", "g++", "clang", "clang++")


def compiler_dirs(environ=None, protected=()) -> list[str]:
    """The installation folders of the C compilers on PATH (and $CC, $CXX) outside the system folders: an
    image's own GCC under /opt (seen on the lent H200: /opt/gcc/bin/gcc; denied, torch.compile fails with
    "PermissionError: '/opt/gcc/bin/gcc'"). A compiler in <prefix>/bin needs <prefix> (its cc1 under
    libexec, its headers and libraries): the prefix is granted, read and execute, with library_dirs' limits."""
    environ = os.environ if environ is None else environ
    import shutil

    found = [environ.get("CC", ""), environ.get("CXX", "")]
    found += [shutil.which(name, path=environ.get("PATH", os.defpath)) or "" for name in COMPILERS]
    names = []
    for path in found:
        path = path.split()[0] if path.strip() else ""  # $CC may carry flags ("gcc -m64")
        if not path.startswith("/") or not os.path.isfile(path):
            continue
        for where in {os.path.dirname(os.path.abspath(path)), os.path.dirname(os.path.realpath(path))}:
            names.append(os.path.dirname(where) if os.path.basename(where) == "bin" else where)
    return _outside_system_dirs(names, protected)


@functools.lru_cache(maxsize=1)
def _homes() -> tuple[str, ...]:
    """Every user's home folder the system knows (/users/bob, a /home that links elsewhere), `/` excepted; read
    once per process (pwd.getpwall() may ask a directory service), each resolved through its parent only (resolving
    the home itself would mount every automounted home of the cluster)."""
    try:
        import pwd

        entries = pwd.getpwall()
    except (ImportError, OSError):
        return ()
    homes = {os.path.join(os.path.realpath(os.path.dirname(p.pw_dir)), os.path.basename(p.pw_dir))
             for p in entries if p.pw_dir.startswith("/") and os.path.normpath(p.pw_dir) != "/"}
    return tuple(sorted(homes))


def _outside_system_dirs(names: list[str], protected=()) -> list[str]:
    """The real folders of names outside the system folders, but never `/`, a home folder or one that holds
    one (a compiler in ~/bin would grant ~, its .ssh included), nor one that holds a protected path or the
    launcher's working folder."""
    candidates: list[str] = []
    for name in names:
        if not name.startswith("/") or not os.path.isdir(name):
            continue
        real = os.path.realpath(name)
        if real == "/" or any(real == d or real.startswith(d + "/") for d in SYSTEM_DIRS) or real in candidates:
            continue
        candidates.append(real)
    if not candidates:  # the usual case: nothing outside the system folders, and no user list to read
        return []
    guarded = [os.path.realpath(p) for p in (*protected, os.getcwd(), os.path.expanduser("~"), "/root")]
    guarded += _homes()
    return [real for real in candidates
            if real != "/home" and os.path.dirname(real) != "/home"  # every user's home, or one of them
            and not any(g == real or g.startswith(real + "/") for g in guarded)]
