"""How a harness process starts another harness process: the same interpreter, the same harness.

Runs in whichever process starts a child (the launcher, the scorer); the child runs a harness module.

`python -m harness.x` puts its working folder first on sys.path. A folder named `harness` there (the
repository root after a plain `pip install .`, or an organiser's `harness/tracks/` beside a run) then
shadows the harness the launcher imported: a different version, a namespace package with nothing in
it, or files the sandbox will not let the process read. So every child is started with `-P` (Python
3.11: no working folder on sys.path) and, where the harness the launcher imported is not in the
interpreter's own site folders (an editable install, a checkout on PYTHONPATH), with that folder first
on PYTHONPATH. torch elastic's `PYTHON_EXEC` is not consulted: the ranks run this interpreter.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Mapping
from pathlib import Path


def harness_root() -> str:
    """The folder holding the `harness` package this process imported."""
    import harness

    return str(Path(harness.__file__).resolve().parent.parent)


def _site_dirs() -> set[str]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return {os.path.realpath(d) for d in dirs}


def python_argv(module: str, *args: str) -> list[str]:
    """The command that runs `module` as __main__ in a child of this interpreter, unbuffered."""
    return [sys.executable, "-u", "-P", "-m", module, *map(str, args)]


def harness_path(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The PYTHONPATH a child needs to import this harness ({} when the interpreter finds it anyway).

    Not for site folders: putting site-packages ahead of the standard library could let a package
    shadow a standard module."""
    environ = os.environ if environ is None else environ
    root = harness_root()
    current = environ.get("PYTHONPATH", "")
    parts = [p for p in current.split(os.pathsep) if p]
    if root in _site_dirs() or (parts and os.path.realpath(parts[0]) == root):
        return {}
    return {"PYTHONPATH": os.pathsep.join([root, *parts])}


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's), with the PYTHONPATH of harness_path()."""
    env = dict(os.environ if environ is None else environ)
    env.update(harness_path(env))
    return env
