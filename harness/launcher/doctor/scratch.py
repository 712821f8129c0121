"""`harness doctor`'s checks of the scratch root: where every private folder of a process that runs team code
is made (harness/ranks/confine/scratch.py: HARNESS_SCRATCH_DIR, else tempfile's folder), measured as the runs will
use it, not as /tmp happens to be.

- disk-scratch: free space there against what one run on this node may leave in it: the training ranks'
  folder at the track's scratch_cap_gib (one folder per node, capped as a whole: harness/launcher/run/takeback.py
  `ScratchCaps`), plus an allowance per check and model process (their folders are capped per file only);
- scratch-root: the folder exists and is mounted exec, by scratch.py's own test (`unusable`: the one every
  `harness run` refuses a root by, so the two cannot disagree), and the Unix socket a training rank makes
  there fits a socket path's 107 bytes. That socket is Python's multiprocessing listener (a DataLoader
  worker's batches come through one): <root>/harness-train-XXXXXXXX/tmp/pymp-XXXXXXXX/listener-XXXXXXXX,
  measured by making the training ranks' private folder as a run does (harness/launcher/control/workarea.py) and
  binding that listener in it with the interpreter the ranks run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.launcher.doctor.table import Check
from harness.ranks.confine import scratch
from harness.tracks.spec import Track

GIB = 2**30
SOCKET_PATH_MAX_BYTES = 107  # sockaddr_un's sun_path holds 108 bytes, the last one the terminating NUL
# A check or model process's folder is capped per file (64 MiB, harness/ranks/confine/logs.py), not as a whole:
# this is an allowance for what one leaves there (compiler caches), not a bound.
PROCESS_FOLDER_GIB = 1.0
LISTENER_TIMEOUT_S = 30.0
# What a rank's multiprocessing does when a DataLoader worker hands a batch back (resource_sharer's
# Listener): the address under TMPDIR, printed before the bind, then the bind itself.
BIND_LISTENER = """
import json
from multiprocessing.connection import Listener, arbitrary_address
address = arbitrary_address("AF_UNIX")
try:
    Listener(address, "AF_UNIX").close()
    print(json.dumps({"address": address, "error": ""}))
except OSError as exc:
    print(json.dumps({"address": address, "error": f"{type(exc).__name__}: {exc}"}))
"""


def _chosen_by() -> str:
    return scratch.SCRATCH_ENV if os.environ.get(scratch.SCRATCH_ENV) else \
        f"tempfile's folder: {scratch.SCRATCH_ENV} is not set"


def disk_scratch_check(track: Track) -> Check:
    from harness.launcher.doctor.table import disk
    from harness.launcher.run.runner import resolve_nproc

    try:
        nproc = resolve_nproc(track)
    except RuntimeError:  # a GPU track without GPUs here (the gpus check says it): count one scorer
        nproc = track.nproc_per_node if isinstance(track.nproc_per_node, int) else 1
    processes = 1 + (track.eval.nproc_per_node or nproc)  # the check process; one model process per scorer at a time
    need = track.scratch_cap_gib * GIB + processes * PROCESS_FOLDER_GIB * GIB
    root = scratch.scratch_root()
    return disk("disk-scratch", root, need,
                f"the training ranks' folder at the track's scratch_cap_gib ({track.scratch_cap_gib:g} GiB) and "
                f"{processes} check or model process(es) at {PROCESS_FOLDER_GIB:g} GiB each",
                f"free space at {root} ({_chosen_by()}), or set {scratch.SCRATCH_ENV} to a folder on a larger local "
                "disk (mounted exec, with a short path)", warn_below=1)


def scratch_root_check() -> Check:
    root = scratch.scratch_root()
    problem = scratch.unusable(root)  # `harness run`'s own refusal (scratch.refuse_unusable), word for word
    if problem:
        measured, _, fix = problem.partition(" Fix: ")
        return Check(name="scratch-root", status="fail", measured=measured, fix=fix)
    return _socket_path_check(root)


def _socket_path_check(root: Path) -> Check:
    """The training ranks' private folder made as a run makes it, and a multiprocessing listener bound in it."""
    from harness.launcher.control.workarea import WorkArea

    fix_short = (f"set {scratch.SCRATCH_ENV} to a folder with a shorter path ({{room}} bytes at most: /tmp/hs, "
                 "/scratch/harness), on a local disk mounted exec")
    empty = Path(tempfile.mkdtemp(prefix="harness-doctor-"))
    try:
        try:
            area = WorkArea(empty)  # under the scratch root, named as the training ranks' folder is
        except OSError as exc:
            return Check(name="scratch-root", status="fail",
                         measured=f"no private folder can be made under {root} ({_chosen_by()}): {exc}",
                         fix=f"make room at {root} and let the harness's user write there, or set "
                             f"{scratch.SCRATCH_ENV} to a folder on a local disk mounted exec")
        try:
            env = {"TMPDIR": area.rank_environment()["TMPDIR"], "PATH": os.environ.get("PATH", "")}
            folder = str(area.dir)
            try:
                ran = subprocess.run([sys.executable, "-I", "-c", BIND_LISTENER], capture_output=True, text=True,
                                     env=env, cwd=area.dir, timeout=LISTENER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return Check(name="scratch-root", status="fail",
                             measured=f"binding a multiprocessing listener in {folder} took more than "
                                      f"{LISTENER_TIMEOUT_S:.0f} s", fix=f"read why {root} is so slow, or set "
                                      f"{scratch.SCRATCH_ENV} to a folder on a local disk")
        finally:
            area.cleanup()
    finally:
        empty.rmdir()
    try:
        said = json.loads(ran.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Check(name="scratch-root", status="fail",
                     measured=f"no multiprocessing listener could be made in {folder}: "
                              f"{(ran.stderr or ran.stdout).strip()[-400:]}",
                     fix="read the error: a DataLoader worker in a training rank would fail the same way")
    address = said["address"]
    length = len(os.fsencode(address))
    room = SOCKET_PATH_MAX_BYTES - (length - len(os.fsencode(str(root))))  # the longest root that fits
    shape = f"{root}/harness-train-XXXXXXXX/tmp/pymp-XXXXXXXX/listener-XXXXXXXX"
    measured = (f"{root} ({_chosen_by()}) mounted exec; a training rank's multiprocessing socket there "
                f"({shape}) takes {length} bytes of {SOCKET_PATH_MAX_BYTES}")
    if length > SOCKET_PATH_MAX_BYTES or said["error"]:
        fix = fix_short.format(room=room) if length > SOCKET_PATH_MAX_BYTES else \
            f"set {scratch.SCRATCH_ENV} to a folder on a local disk whose file system allows Unix sockets"
        return Check(name="scratch-root", status="fail", value=length, unit="bytes",
                     measured=f"{measured}: {said['error'] or 'too long'} (a DataLoader with workers would hang or "
                              "fail in every training rank)", fix=fix)
    return Check(name="scratch-root", status="ok", measured=measured, value=length, unit="bytes")
