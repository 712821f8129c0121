"""Lines of an open-division script that will not run on the track's device: a static screen.

The event's starter kit hard-codes `init_process_group(backend="nccl")`, `cuda:LOCAL_RANK` devices
and `DDP(..., device_ids=[...])`. On a CPU track (device cpu, backend gloo) each of those lines
raises, after the launch and before any step; `harness check` runs the team's files on no device
and so cannot see it. This screen reads the source (it parses it and runs none of it) and names each
such line with the edit that makes it run on both kinds of track. On a GPU track a hard-coded
`gloo` runs, slowly (GPU gradients all-reduced through host memory): a warning too.

Reported, on a track whose device is not cuda, where no guard (below) surrounds them:
- a literal "nccl" backend: `init_process_group("nccl")`, `backend="nccl"`, `backend = "nccl"`
  (or a config dataclass's `backend: str = "nccl"`);
- a CUDA device literal ("cuda", "cuda:0", f"cuda:{rank}", "cuda:%d" % rank, "cuda:{}".format(rank))
  used as a device: in `torch.device(...)`, as `device=`, in `.to(...)`, or assigned, plainly or as a
  dataclass default (to any name but a `..._type`: nanoGPT's `device_type` names autocast's device
  type, which only warns on a CPU);
- an argparse `--device` default of "cuda" and `--backend` default of "nccl" (the harness passes
  neither flag: the default is what runs);
- a GPU's index used as a device: `.to(local_rank)`, `.to(0)`, `device=local_rank` (an int device is
  cuda:N), and `torch.set_default_device("cuda")`;
- `.cuda()`, `device_ids=[...]` (a list or tuple written there), pinned memory (`.pin_memory()`,
  `pin_memory=True` in a torch factory; a DataLoader's only warns), and the torch.cuda calls that
  raise without a GPU (CUDA_ONLY_CALLS: `set_device`, `synchronize`, `get_device_name`, ...).

A guard, kept simple on purpose: the expression is inside a conditional expression
(`"nccl" if cuda else "gloo"`), or inside either branch of an `if` whose test mentions `is_available`,
a name assigned from an expression that mentions it (`cuda = torch.cuda.is_available()` then
`if cuda:`), or the string "cuda" or "cpu" (`if device.type == "cuda":`). A guard it does not
recognise (`if args.gpu:`) gives a false warning: these are warnings, never a reason to reject.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from harness.submission.findings import Finding, dotted_name

CATEGORY = "portability"
CUDA_DEVICE = re.compile(r"cuda(:\d+)?$")
CUDA_TEMPLATE = re.compile(r"cuda:(%[dis]|\{\w*\})?$")
# torch.cuda functions that raise on a CPU build of torch, each seen to raise there by
# tests/test_screen_portability.py; manual_seed, empty_cache, device_count and the memory counters
# (memory_allocated, max_memory_allocated) return quietly and are not listed.
CUDA_ONLY_CALLS = {"set_device", "synchronize", "current_device", "Event", "Stream", "current_stream",
                   "reset_peak_memory_stats", "reset_max_memory_allocated", "get_device_name",
                   "get_device_properties", "get_device_capability", "mem_get_info", "memory_summary",
                   "get_rng_state", "set_per_process_memory_fraction"}
GUARD_STRINGS = {"cuda", "cpu"}
CHOSEN_BACKEND = '"nccl" if torch.cuda.is_available() else "gloo"'
# The string form: starter-kit scripts test `"cuda" in device`, which a torch.device breaks (TypeError).
DEVICE_FIX = ("write device = f\"cuda:{int(os.environ['LOCAL_RANK'])}\" if torch.cuda.is_available() else \"cpu\", "
              "and use that device here")
CUDA_CALL_FIX = 'write .to(device), with device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"'
DEVICE_IDS_FIX = "write device_ids=[local_rank] if torch.cuda.is_available() else None"
INDEX_FIX = "an int device is a GPU's index: " + DEVICE_FIX
ARGUMENT_DEVICE_FIX = 'write default="cuda" if torch.cuda.is_available() else "cpu"'
DEFAULT_DEVICE_FIX = 'write torch.set_default_device("cuda" if torch.cuda.is_available() else "cpu")'
RANK_NAME = re.compile(r"(^|_)rank$", re.IGNORECASE)  # local_rank, ddp_local_rank, RANK: an int


def portability_target(track: Any) -> dict:
    """What the screen needs of a track (a Track, or anything with its name, device and backend)."""
    return {"name": track.name, "device": track.device, "backend": track.backend}


def _is_cuda_device(node: ast.AST) -> bool:
    """"cuda", "cuda:0", f"cuda:{rank}", "cuda:%d" % rank, "cuda:{}".format(rank), "cuda:" + str(rank):
    a literal naming a CUDA device, or built from one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(CUDA_DEVICE.match(node.value))
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        return isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith("cuda:")
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        return _is_cuda_template(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _is_cuda_template(node.func.value)
    return False


def _is_cuda_template(node: ast.AST) -> bool:
    """"cuda:%d", "cuda:{}", "cuda:": the whole string is a device waiting for its index (not a message)."""
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and bool(CUDA_TEMPLATE.match(node.value))


def _is_str(node: ast.AST, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def _is_true(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _assignment(node: ast.AST) -> tuple[list[str], ast.AST | None]:
    """(the names assigned, the value) of `device = "cuda"` or of a config dataclass's annotated
    `device: str = "cuda"` (the same default, written the starter kits' way); ([], None) otherwise,
    and for an annotation without a value (`device: str`), which assigns nothing."""
    if isinstance(node, ast.Assign):
        return [dotted_name(t) for t in node.targets], node.value
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [dotted_name(node.target)], node.value
    return [], None


def _argument_default(node: ast.Call) -> tuple[str, ast.AST | None]:
    """(the flag, its default) of `parser.add_argument("--device", default="cuda")`: the harness passes
    no --device or --backend, so a starter kit's default is what runs; ("", None) otherwise."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
        return "", None
    flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    default = next((k.value for k in node.keywords if k.arg == "default"), None)
    return (flags[-1], default) if flags and default is not None else ("", None)


def _backend_literal(node: ast.AST, backend: str) -> str:
    """What the line does, when `node` sets a literal `backend` ("nccl", "gloo"); "" otherwise."""
    if isinstance(node, ast.Call):
        if dotted_name(node.func).endswith("init_process_group") and node.args and _is_str(node.args[0], backend):
            return f'{dotted_name(node.func)}("{backend}")'
        if any(k.arg == "backend" and _is_str(k.value, backend) for k in node.keywords):
            return f'backend="{backend}"'
        flag, default = _argument_default(node)
        if "backend" in flag.lower() and default is not None and _is_str(default, backend):
            return f'add_argument("{flag}", default="{backend}")'
    targets, value = _assignment(node)
    if value is not None and _is_str(value, backend) and any("backend" in t.lower() for t in targets):
        return f'{targets[0]} = "{backend}"'
    return ""


def _backend_fix(what: str, backend: str) -> str:
    """The same line with the backend chosen by the device: `write dist.init_process_group("nccl" if ...)`."""
    return "write " + what.replace(f'"{backend}"', CHOSEN_BACKEND)


def _is_cuda_index(node: ast.AST) -> bool:
    """`0`, `local_rank`, `args.rank`, `int(os.environ["LOCAL_RANK"])` written as a device: torch reads an
    int device as cuda:N, so `model.to(local_rank)` (the DDP tutorial's form) needs a GPU."""
    if isinstance(node, ast.Constant):
        return type(node.value) is int  # not a bool: `.to(True)` is no device
    if isinstance(node, ast.Call):
        return dotted_name(node.func) == "int"
    return bool(RANK_NAME.search(dotted_name(node).split(".")[-1]))


def _device_argument(node: ast.Call) -> tuple[str, str]:
    """(what, the fix) when a call is given a CUDA device: a literal, or a GPU's index; ("", "") otherwise."""
    name = dotted_name(node.func)
    method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
    first = node.args[0] if node.args else None
    device = next((k.value for k in node.keywords if k.arg == "device"), None)
    if name in ("torch.device", "device") and first is not None and _is_cuda_device(first):
        return 'torch.device("cuda...")', DEVICE_FIX
    if name == "torch.set_default_device" and first is not None and _is_cuda_device(first):
        return 'torch.set_default_device("cuda...")', DEFAULT_DEVICE_FIX  # every tensor made after it needs a GPU
    if device is not None and _is_cuda_device(device):
        return 'device="cuda..."', DEVICE_FIX
    if device is not None and _is_cuda_index(device):
        return f"device={ast.unparse(device)}", INDEX_FIX
    if method == "to" and first is not None and _is_cuda_device(first):
        return '.to("cuda...")', DEVICE_FIX
    if method == "to" and first is not None and _is_cuda_index(first):
        return f".to({ast.unparse(first)})", INDEX_FIX
    return "", ""


def _device_default(node: ast.Call) -> tuple[str, str]:
    """(what, the fix) for `parser.add_argument("--device", default="cuda")`; ("", "") otherwise."""
    flag, default = _argument_default(node)
    if "device" not in flag.lower() or flag.replace("-", "_").endswith("_type"):
        return "", ""  # `--device_type` is autocast's device type: it only warns on a CPU
    if default is None or not _is_cuda_device(default):
        return "", ""
    return f'add_argument("{flag}", default="cuda...")', ARGUMENT_DEVICE_FIX


def _gpu_only_call(node: ast.Call) -> tuple[str, str]:
    """(what, the fix) when a call itself needs a GPU (on a CPU build of torch it raises); ("", "") otherwise."""
    name = dotted_name(node.func)
    method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
    if method == "cuda":
        return ".cuda()", CUDA_CALL_FIX
    if name.split(".")[-2:-1] == ["cuda"] and name.split(".")[-1] in CUDA_ONLY_CALLS:
        call = f"torch.cuda.{name.split('.')[-1]}(...)"
        return call, f"guard it: if torch.cuda.is_available(): {call}"
    if any(k.arg == "device_ids" and isinstance(k.value, (ast.List, ast.Tuple)) for k in node.keywords):
        return "device_ids=[...]", DEVICE_IDS_FIX
    if method == "pin_memory" and not node.args:
        return ".pin_memory()", "pin only on a GPU: x.pin_memory() if torch.cuda.is_available() else x"
    # torch's factories raise on pin_memory=True without a GPU; a DataLoader warns and does not pin
    if name.startswith("torch.") and not name.endswith("DataLoader") and any(
            k.arg == "pin_memory" and _is_true(k.value) for k in node.keywords):
        return "pin_memory=True", "write pin_memory=torch.cuda.is_available()"
    return "", ""


def _cuda_use(node: ast.AST) -> tuple[str, str]:
    """(what the line does, the fix) when `node` needs a GPU; ("", "") otherwise."""
    if isinstance(node, ast.Call):
        for check in (_device_argument, _device_default, _gpu_only_call):
            what, fix = check(node)
            if what:
                return what, fix
    targets, value = _assignment(node)
    if value is not None and _is_cuda_device(value):
        if not all(t.endswith("_type") for t in targets):  # a device *type* (autocast's) is not a device
            return f'{targets[0]} = "cuda..."', DEVICE_FIX
    return "", ""


def _mentions(node: ast.AST, names: set[str], strings: set[str] = GUARD_STRINGS) -> bool:
    """Whether an expression mentions `is_available`, one of `names` (as written: `cuda`,
    `self.use_gpu`; `torch.cuda` is not `cuda`), or one of `strings`."""
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Name, ast.Attribute)) and (dotted_name(sub).split(".")[-1] == "is_available"
                                                           or dotted_name(sub) in names):
            return True
        if isinstance(sub, ast.Constant) and sub.value in strings:
            return True
    return False


def _guard_names(tree: ast.AST) -> set[str]:
    """Names assigned from an expression that mentions `is_available` (or another such name), in any
    scope of the file: `cuda = torch.cuda.is_available()` makes `if cuda:` a guard."""
    # One pass over each value, then a worklist along "mentions" (`use_gpu = cuda and not args.cpu` is a
    # guard name too): linear in the file, where a fixed point recomputed per round was quadratic in a
    # chain of assignments (a 2,000-line chain took 9 s of the check's time).
    seeds: set[str] = set()
    users: dict[str, set[str]] = {}  # a name -> the names assigned from a value that mentions it
    for targets, value in (_assignment(n) for n in ast.walk(tree)):
        if value is None:
            continue
        targets = [t for t in targets if t]
        mentioned = {dotted_name(sub) for sub in ast.walk(value) if isinstance(sub, (ast.Name, ast.Attribute))}
        if any(name.split(".")[-1] == "is_available" for name in mentioned):
            seeds.update(targets)
        for name in mentioned:
            users.setdefault(name, set()).update(targets)
    names, todo = set(seeds), list(seeds)
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in names:
                names.add(user)
                todo.append(user)
    return names


def _unguarded(tree: ast.AST, names: set[str]):
    """Every node outside a guard, walked without recursion (a team's file may nest deeply)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.IfExp):
            continue  # a conditional expression chooses; whatever it holds is guarded
        if isinstance(node, ast.If) and _mentions(node.test, names):
            continue  # both branches: the script distinguishes the devices here
        yield node
        stack.extend(ast.iter_child_nodes(node))


def screen_portability(text: str, rel: str, target: dict) -> list[Finding]:
    """The lines of one file that will not run (or, for gloo on a GPU, run slowly) on `target`'s track."""
    try:
        tree = ast.parse(text, filename=rel)
    except SyntaxError:
        return []  # the main screen and the checks report it, with its line
    on = f"track {target['name']} ({target['device']}, {target['backend']})"
    lines = text.splitlines()
    found: dict[int, Finding] = {}  # one warning per line: the outermost construct on it
    for node in _unguarded(tree, _guard_names(tree)):
        line = getattr(node, "lineno", 0)
        if line in found:
            continue
        if target["device"] == "cuda":
            what = _backend_literal(node, "gloo")
            message = (f"{what} runs on {on} but slowly (gloo all-reduces GPU gradients through host memory): "
                       f"{_backend_fix(what, 'gloo')}") if what else ""
        else:
            what = _backend_literal(node, "nccl")
            fix = _backend_fix(what, "nccl")
            if not what:
                what, fix = _cuda_use(node)
            message = f"{what} will not run on {on}: {fix}" if what else ""
        if message:
            code = lines[line - 1].strip()[:160] if 0 < line <= len(lines) else ""
            found[line] = Finding(rel, line, CATEGORY, message, code)
    return sorted(found.values(), key=lambda f: f.line)


def split_screen(findings: list[dict]) -> tuple[list[dict], list[dict]]:
    """(what a reviewer should read, the lines that will not run on the track's device): the second are
    the team's to fix, each a warning of its own. `harness check` and the run record split them alike."""
    return ([f for f in findings if f["category"] != CATEGORY], [f for f in findings if f["category"] == CATEGORY])


def warning_lines(findings: list[dict]) -> list[str]:
    """`train.py:34: init_process_group("nccl") will not run on track local (cpu, gloo): write ...`"""
    return [f"{f['file']}:{f['line']}: {f['what']}" for f in findings if f["category"] == CATEGORY]
