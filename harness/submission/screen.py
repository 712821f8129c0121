"""A static screen of a submission's source: what a reviewer should look at. It never blocks.

Lists file writes and opens, processes, sockets and network libraries, native code (ctypes,
cffi), threads, introspection (frames, `inspect`, `gc`'s object lists, tracing hooks), changes to
attributes of modules the submission imports but did not define (`torch`, `json`, `time`,
`harness`, ...), reads of environment variables, weights loaded from files, dynamic code, and
string literals that look like data or record paths. Each finding names the file and the line.

What it finds is reported as warnings (`harness check`, the record's `warnings`), never as a
verdict: honest code does some of these things, and a determined submission can hide them. The
defences that hold are elsewhere (the sandbox, scoring outside the model's process, the
causality check on the scoring itself); the screen tells a reviewer where to read.
"""

from __future__ import annotations

import ast
import re
from dataclasses import asdict
from pathlib import Path

from harness.submission.findings import Finding, dotted_name  # noqa: F401  (read from here too)

PATCHABLE = {"torch", "time", "harness", "os", "sys", "builtins", "numpy", "np"}
MODULE_CATEGORIES = {
    "subprocess": "process", "multiprocessing": "process", "socket": "network", "urllib": "network",
    "http": "network", "requests": "network", "httpx": "network", "aiohttp": "network", "ftplib": "network",
    "ctypes": "native code", "cffi": "native code", "threading": "threads", "_thread": "threads",
    "concurrent": "threads", "harness": "harness internals", "importlib": "dynamic code", "pickle": "file",
    "shutil": "file", "tempfile": "file", "inspect": "introspection", "gc": "introspection",
    "traceback": "introspection",
}
CALLS = {
    "open": "file", "io.open": "file", "os.open": "file", "os.remove": "file", "os.unlink": "file",
    "os.rename": "file", "os.replace": "file", "os.makedirs": "file", "os.mkdir": "file", "os.rmdir": "file",
    "os.system": "process", "os.popen": "process", "os.fork": "process", "os.kill": "process",
    "os.getenv": "environment", "os.putenv": "environment", "torch.load": "loads weights",
    "torch.save": "file", "np.load": "file", "numpy.load": "file", "np.fromfile": "file", "np.memmap": "file",
    "eval": "dynamic code", "exec": "dynamic code", "compile": "dynamic code", "__import__": "dynamic code",
    "setattr": "patching", "delattr": "patching",
    "sys._getframe": "introspection", "sys._current_frames": "introspection", "sys.settrace": "introspection",
    "sys.setprofile": "introspection", "threading.settrace": "introspection", "gc.get_objects": "introspection",
    "gc.get_referrers": "introspection", "gc.get_referents": "introspection", "sys.addaudithook": "introspection",
    "globals": "introspection", "vars": "introspection",
}
FRAME_ATTRIBUTES = {"f_back", "f_locals", "f_globals", "f_builtins", "tb_frame", "gi_frame", "cr_frame",
                    "__globals__", "__closure__", "__code__", "__subclasses__"}
PATH_METHODS = {"write_text", "write_bytes", "open", "unlink", "rename", "replace", "mkdir", "rmdir", "touch",
                "read_bytes", "read_text"}
PUBLIC_HELPERS = {"harness.ranks.open_api"}  # what a team is meant to import from the harness
# An open-division script must read its shards, its rank from the environment and save a checkpoint:
# those findings in it tell a reviewer nothing.
SCRIPT_DUTIES = {"file", "environment", "data paths", "loads weights"}
LARGE_LITERAL = 64 * 1024  # a string or bytes literal this long in code is data (weights as base64?)
DATA_LIKE = re.compile(r"(\.bin$|\.pt$|\.npy$|\.npz$|/data\b|chunk_\d|\bruns/|leaderboard|\bval(idation)?[_/.])", re.I)


class _Visitor(ast.NodeVisitor):
    def __init__(self, rel: str, lines: list[str], imported: set[str]):
        self.rel, self.lines, self.found = rel, lines, []
        self.imported = imported  # names bound by import statements: modules the file did not define

    def add(self, node: ast.AST, category: str, what: str) -> None:
        line = getattr(node, "lineno", 0)
        code = self.lines[line - 1].strip()[:200] if 0 < line <= len(self.lines) else ""  # a line may be megabytes
        self.found.append(Finding(self.rel, line, category, what, code[:160]))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if top in MODULE_CATEGORIES and alias.name not in PUBLIC_HELPERS:
                self.add(node, MODULE_CATEGORIES[top], f"imports {alias.name}")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        top = (node.module or "").split(".")[0]
        helper = node.module in PUBLIC_HELPERS or all(f"{node.module}.{a.name}" in PUBLIC_HELPERS for a in node.names)
        if node.level == 0 and top in MODULE_CATEGORIES and not helper:
            self.add(node, MODULE_CATEGORIES[top], f"imports from {node.module}")
        if node.level == 0 and top == "os" and any(a.name == "environ" for a in node.names):
            self.add(node, "environment", "imports os.environ")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted_name(node.func)
        if name in CALLS:
            self.add(node, CALLS[name], f"calls {name}()")
        elif name.startswith(("os.exec", "os.spawn", "subprocess.")):
            self.add(node, "process", f"calls {name}()")
        elif isinstance(node.func, ast.Attribute) and node.func.attr in PATH_METHODS and name.split(".")[0] not in (
                "self", "torch", "nn", "F"):
            self.add(node, "file", f"calls .{node.func.attr}() (a file operation if on a path)")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if dotted_name(node) == "os.environ":
            self.add(node, "environment", "reads os.environ")
        if node.attr in FRAME_ATTRIBUTES:
            self.add(node, "introspection", f"reads .{node.attr}")
        self.generic_visit(node)

    def _assigned(self, target: ast.AST, node: ast.AST) -> None:
        if isinstance(target, ast.Attribute):
            root = dotted_name(target).split(".")[0]
            if root in PATCHABLE or root in self.imported:
                self.add(node, "patching", f"assigns {dotted_name(target)} (an attribute of a module it imports)")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._assigned(target, node)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assigned(node.target, node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and len(node.value) < 300 and DATA_LIKE.search(node.value):
            self.add(node, "data paths", f"string {node.value!r} looks like a data or record path")
        if isinstance(node.value, (str, bytes)) and len(node.value) >= LARGE_LITERAL:  # weights can ride as text
            self.add(node, "data in code", f"a literal of {len(node.value):,} characters")


def screen_source(text: str, rel: str) -> list[Finding]:
    try:
        tree = ast.parse(text, filename=rel)
    except SyntaxError as exc:
        return [Finding(rel, exc.lineno or 0, "syntax", f"cannot be parsed: {exc.msg}", "")]
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.update(a.asname or a.name for a in node.names)  # `from torch import nn`: nn is torch's
    visitor = _Visitor(rel, text.splitlines(), imported)
    visitor.visit(tree)
    return sorted(visitor.found, key=lambda f: (f.file, f.line, f.category))


def screen_folder(folder: Path, script: str | None = None, target: dict | None = None) -> list[dict]:
    """Every .py file of the submission; `script` is an open-division training script, whose file,
    environment and data-path findings are its job and are left out. With `target` (an open-division
    run's track: portability.portability_target), the lines that will not run on its device too."""
    from harness.submission.contract import submission_files
    from harness.submission.portability import screen_portability

    findings: list[Finding] = []
    for path in submission_files(Path(folder)):
        if path.suffix == ".py":
            rel = str(path.relative_to(folder))
            text = path.read_text(errors="replace")
            try:  # file by file: one file nested past the parser's depth must not hide the others' findings
                found = screen_source(text, rel)
                if rel == script:
                    found = [f for f in found if f.category not in SCRIPT_DUTIES]
                found += screen_portability(text, rel, target) if target else []
            except (RecursionError, MemoryError, ValueError) as exc:
                found = [Finding(rel, 0, "unscreened", f"could not be screened ({type(exc).__name__}: nested too "
                                 "deep or too large): a reviewer must read this file", "")]
            findings += found
    return [asdict(f) for f in findings]


def summarize(findings: list[dict]) -> list[str]:
    """One warning per category, naming where: what `harness check` and the record show first. A
    portability finding is one warning each: its line and its fix are the point."""
    from harness.submission.portability import CATEGORY as PORTABILITY, warning_lines

    by_category: dict[str, list[str]] = {}
    for f in findings:
        if f["category"] != PORTABILITY:
            by_category.setdefault(f["category"], []).append(f"{f['file']}:{f['line']}")
    return [f"screen: {category} at {', '.join(places[:6])}" + (f" and {len(places) - 6} more" if len(places) > 6 else "")
            for category, places in sorted(by_category.items())] + warning_lines(findings)


# Any mention, case aside: `torch.compile(`, `COMPILE = True`, `from torch import compile`. Reading too much
# into a `re.compile` costs the harness an import; reading too little costs only a team that hides its compile.
COMPILE_MENTION = re.compile(rb"compile", re.IGNORECASE)


def mentions_compile(folder: Path) -> bool:
    """Whether a submission's Python files mention compiling: the training ranks then import the compiler
    before the team's start-up allowance begins (harness/ranks/training/loop.py). Harness code reading the files as
    bytes, never running them: the decision cannot come from a report team code could have written."""
    from harness.submission import files
    from harness.submission.contract import SubmissionError, submission_files

    try:
        paths = submission_files(Path(folder))
    except SubmissionError:  # refused elsewhere, with its reason
        return False
    for path in paths:
        if path.suffix == ".py":
            try:  # the project's bounded reader: a regular file, no link followed, the submission's cap at most
                if COMPILE_MENTION.search(files.read_regular(path, files.MAX_SUBMISSION_BYTES)):
                    return True
            except (OSError, files.UnsafeEntry, files.TooLarge):
                continue
    return False
