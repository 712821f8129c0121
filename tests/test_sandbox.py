"""What the sandbox lets a process do in its own folders (harness/ranks/sandbox.py, rootfs.py): what
compilers and data loaders need there, and nothing that reaches past them.

Each test runs a small script in a fresh process: the sandbox, once applied, is for life.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Landlock and namespaces are Linux's")

# The process's sandbox as the harness builds it: a training rank's (sandbox.apply; the job's namespace is
# not part of this), or the check's and evaluation's model processes' (sandbox.enter: namespaces, a root
# of its own, Landlock). Then `body`, which fills `out`; `attempt` records "done" or the errno's name.
SANDBOXED = """
import errno, json, os, sys
from harness.ranks import sandbox
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


def sandboxed(tmp_path, kind: str, body: str, env: dict | None = None, timeout_s: float = 120) -> dict:
    """Run SANDBOXED then `body` as a process of `kind` ("training", "check"); returns its `out`."""
    private, submission = tmp_path / "private", tmp_path / "submission"
    private.mkdir()
    submission.mkdir()
    (submission / "submission.py").write_text("# the team's code\n")
    args = {"private": str(private), "submission": str(submission), "kind": kind}
    code = SANDBOXED + body + "\nprint('OUT ' + json.dumps(out), flush=True)\n"
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
