"""Torch's eager paths without importing its compiler, in the check process (harness/ranks/models/preflight.py),
beside team code.

torch wraps a few hundred of its functions in `torch._disable_dynamo` (every optimizer's constructor through
`add_param_group`, `zero_grad`, DDP's forward, the meta device's reference operations, the dispatch modes, the FLOP
counter's included), and the wrapper imports `torch._dynamo` on its first call: 0.9 CPU-seconds, as much as torch
itself, in a process that never compiles. Where dynamo is not loaded, no frame is being compiled, so
`torch._dynamo.disable(fn)` would change nothing about a call of `fn`: until dynamo is imported, each wrapper is told
(through the attribute it caches its disabled function in) that its disabled function is `fn` itself. The first
import of `torch._dynamo`, whoever asks for it (a team's `torch.compile`, a wrapper made after this ran), takes every
mark away before dynamo's own code runs: from then on torch is exactly as it ships.

Where torch's wrapper is not the shape this reads, nothing is marked, and dynamo is imported on first use as before.
A training process gains nothing from it: DDP's constructor and every optimizer's `step` import dynamo themselves.
"""

from __future__ import annotations

import gc
import sys
import types
from importlib.abc import MetaPathFinder

# The attribute torch's `_disable_dynamo` wrapper caches its disabled function in (torch/_compile.py), and the name
# of the free variable that holds the wrapped function.
CACHE_ATTR = "__dynamo_disable"
WRAPPED = "fn"
DYNAMO = "torch._dynamo"


class _Unmark(MetaPathFinder):
    """First on sys.meta_path: at the first import of torch._dynamo, before any of its code runs, every mark goes; the
    import then goes on as if there had been none. It stays on the list, finding nothing: the import system is
    iterating over that list when it asks, and a finder removed then would make it skip the next one."""

    def __init__(self, marked: list) -> None:
        self.marked = marked

    def find_spec(self, fullname, path, target=None):
        if fullname == DYNAMO and self.marked:
            _unmark(self)
        return None


_finder: _Unmark | None = None


def defer_dynamo() -> int:
    """Marks every function torch has wrapped in `_disable_dynamo` so far to run as itself until dynamo is imported.
    Returns how many were marked (0 where dynamo is already loaded or torch's wrapper is not the shape read here)."""
    global _finder
    import torch

    if DYNAMO in sys.modules or _finder is not None:  # loaded (nothing to spare), or marked once already
        return 0
    code = _wrapper_code(torch)
    if code is None:
        return 0
    slot = code.co_freevars.index(WRAPPED)
    marked = []
    for obj in gc.get_objects():  # functions are tracked by the collector: 290 wrappers among ~300k objects, 25 ms
        if type(obj) is types.FunctionType and obj.__code__ is code:
            fn = obj.__closure__[slot].cell_contents
            # a plain function only (its __dict__ can be written and cleared); anything else imports dynamo when called
            if type(fn) is types.FunctionType and CACHE_ATTR not in fn.__dict__:
                fn.__dict__[CACHE_ATTR] = fn
                marked.append(fn)
    _finder = _Unmark(marked)
    sys.meta_path.insert(0, _finder)
    return len(marked)


def marked() -> int:
    """How many functions run as themselves now (0 once dynamo was imported)."""
    return len(_finder.marked) if _finder is not None else 0


def _unmark(finder: _Unmark) -> None:
    marked, finder.marked = finder.marked, []
    for fn in marked:
        if fn.__dict__.get(CACHE_ATTR) is fn:  # ours: a disabled function dynamo cached since is its own
            fn.__dict__.pop(CACHE_ATTR, None)


def _wrapper_code(torch) -> types.CodeType | None:
    """The code object of torch's `_disable_dynamo` wrapper, where it reads and caches CACHE_ATTR on the free
    variable WRAPPED as read here; else None."""
    probe = getattr(torch, "_disable_dynamo", None)
    if probe is None:
        return None
    try:
        wrapper = probe(_probe)
    except Exception:  # noqa: BLE001  (another torch: its wrapper is left alone)
        return None
    code = getattr(wrapper, "__code__", None)
    if (type(wrapper) is not types.FunctionType or code is None or WRAPPED not in code.co_freevars
            or CACHE_ATTR not in code.co_names or DYNAMO not in code.co_names):
        return None
    return code


def _probe() -> None:
    """Wrapped once to find the wrapper's code; never called."""
