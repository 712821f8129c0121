"""Every reason the harness can give (a record's `reason`, a rank's or a contract check's) is stated by a test."""

from __future__ import annotations

import ast
import bisect
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "harness"
TESTS = ROOT / "tests"

# Where a reason is given, as it can be read from the source (the harness's texts only: a generic exception's
# message reaches a reason as "rank N: RuntimeError: ..." and is not collected).
# Calls whose argument is a reason: name -> (position, keyword).
REASON_ARGS = {
    "set_outcome": (2, "reason"),  # harness/launcher/run/assemble.py: every final status but ok is set by it
    "Outcome": (1, "reason"),  # harness/launcher/run/outcome.py: how a job ended
    "_died": (2, "then"),  # outcome.py: a rank that died without a report
    "_kill": (3, "reason"),  # harness/launcher/control/watch.py: the watchdog ends a job
    "_violate": (0, "why"),  # harness/launcher/control/channel.py: a rank broke the channel's cap
    "finalize_run": (2, "reason"),  # harness/launcher/event/finalize.py: a lost run closed `aborted`
    "close_lost_record": (1, "reason"),  # harness/launcher/event/queue.py
    "WorkerFailed": (1, "message"),  # harness/scoring: a model process failed; "evaluation: rank N: ..."
    "_break": (0, "why"),  # harness/scoring/template.py: the model-process template's channel broke (WorkerFailed)
    "SubmissionError": (1, "problem"),  # the contract: "submission.py: <problem> Fix: ..." (invalid)
}
# Exceptions whose message is a rank's reason ("rank N: ...") or the run's own (str(exc)): their constructor's
# first argument and, inside the class, what it passes to super().__init__.
REASON_EXCEPTIONS = {"Diverged", "NodesDisagree", "SandboxMissing", "ScriptExit", "CheckpointError",
                     "JobNamespaceMissing", "ScratchTooSmall"}
# Attributes that hold a reason on its way to the record (`record.reason`, the watchdog's kill reason, a broken
# cap, an infrastructure failure seen by a tick) and the keys of the dicts that carry one (a rank's error report,
# a check's problem; a builder's dict says it under "error" too: the open division's checkpoint reader).
REASON_ATTRS = {"reason", "kill_reason", "violation", "infra"}
REASON_KEYS = {"reason", "problem"}
# Functions whose return value is a reason (the caller passes it on: `late = check_window(...)`).
BUILDERS = {
    "harness/launcher/control/watch.py": {"_expired", "_open_hint"},
    "harness/launcher/control/heartbeat.py": {"lost_why"},
    "harness/launcher/run/assemble.py": {"check_window"},
    "harness/launcher/run/evaluation.py": {"describe_noncausal", "describe_inconclusive"},
    "harness/launcher/run/takeback.py": {"cap_reason", "measure"},
    "harness/launcher/run/training.py": {"why", "scratch_full_reason"},  # EarlyEnd's; a crash for want of room
    "harness/launcher/run/open_run.py": {"explain_silence", "normalize_in_own_process"},
    "harness/ranks/confine/scratch.py": {"short_of_space"},
    "harness/ranks/models/causality.py": {"describe"},  # the check's causality probe: a contract problem
}
# Read with the rest, and no reason of a record: `harness check`'s own line, the views and the command line.
NOT_RECORD_REASONS = ("harness/launcher/run/check.py", "harness/results/", "harness/cli/")

# A reason is stated by a test when a string of a test module (docstrings and comments left out) holds a run of its
# text that starts at a word, MIN_FRAGMENT characters long at least, and long enough that no other reason holds
# it (where the reason's own text is in another's, a run they share states it). Its values are holes: a number, a
# tuple of numbers or a quoted name, in the reason's text and in the test's alike, reads as HOLE ("more than 8 MiB
# to their logs" states f"more than {cap >> 20} MiB to their logs"). A reason whose constant parts are all
# shorter than MIN_FRAGMENT is also stated by its longest, whole (MIN_SHORT characters at least: weaker, which is
# why each such reason's test was checked by hand); one with less text of its own only passes on another's
# (f"rank {rank}: {reason}") and is not checked.
MIN_FRAGMENT, MIN_SHORT = 20, 10
HOLE = "\x00"
_VALUE = re.compile(r"'[\w./\x00-]*'|[(\[]\d+(?:\.\d+)?(?:, \d+(?:\.\d+)?)*[)\]]|\d+(?:[.,]\d+)*(?:e[-+]?\d+)?")
_WORD_START = re.compile(r"(?<!\w)\w")
_TRIM = " :;,.()'\"`"

# Reasons no test on this machine (CPU only, Landlock and user namespaces granted) can give: {a fragment: why}.
NOT_TESTABLE_HERE = {
    "the track requires the sandbox and it is not available here": (
        "a training rank (harness/ranks/training/train.py, open_rank.py) that has no Landlock when the check process before "
        "it had it: on one host both have it or neither (without it the check process refuses first, at "
        "harness/ranks/models/preflight.py:63), and no test here can give a rank alone a kernel without it"),
}
# Reasons the harness's code can never give (dead code, reported with issue 31): {a fragment of the reason: why}.
NEVER_GIVEN = {
    "the launcher stopped before the run finished": (
        "harness/launcher/run/runner.py:225: run_submission's `finally` gives it to a record that is not final; none "
        "is there: every return of _execute sets a final status, and its `except` sets one for the only statuses "
        "that are not final (running, evaluating)"),
}


def skeleton(parts) -> str:
    """Text with its holes: the parts joined by HOLE, every value (a number, a tuple of them, a quoted name) a HOLE."""
    return re.sub(HOLE + "+", HOLE, _VALUE.sub(HOLE, HOLE.join(parts)))


@dataclass
class Reason:
    text: str  # its skeleton
    sites: list[str] = field(default_factory=list)  # file:line

    @property
    def shown(self) -> str:
        return self.text.replace(HOLE, "{}")

    def starts(self) -> list[int]:
        """Where its runs may start: at a word, MIN_FRAGMENT characters from its end at least."""
        return [m.start() for m in _WORD_START.finditer(self.text) if m.start() + MIN_FRAGMENT <= len(self.text)]

    def whole(self) -> str:
        """Where no constant part of it is MIN_FRAGMENT long: its longest, when it says something, else ""."""
        longest = max((p.strip(_TRIM) for p in self.text.split(HOLE)), key=len, default="")
        return longest if MIN_SHORT <= len(longest) < MIN_FRAGMENT else ""


def _parts(node: ast.AST, consts: dict[str, str]) -> list[str]:
    """The constant text of a reason expression: a string, an f-string's literal parts, both sides of `+`, both
    branches of `a if c else b`, a tuple's first item (a reason and its time), a module's string constant, the
    reason-carrying values of a dict literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        out, run = [], ""
        for value in node.values:
            if isinstance(value, ast.Constant):
                run += str(value.value)
            else:
                out.append(run)
                run = ""
        return [*out, run]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _parts(node.left, consts) + _parts(node.right, consts)
    if isinstance(node, ast.IfExp):
        return _parts(node.body, consts) + _parts(node.orelse, consts)
    if isinstance(node, ast.Tuple) and node.elts:
        return _parts(node.elts[0], consts)
    if isinstance(node, ast.Name):
        return [consts[node.id]] if node.id in consts else []
    if isinstance(node, ast.Dict):
        return [p for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
                and k.value in (*REASON_KEYS, "error") for p in _parts(v, consts)]
    return []


def _name(func: ast.AST) -> str | None:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _argument(call: ast.Call, position: int, keyword: str | None) -> ast.AST | None:
    if len(call.args) > position and not any(isinstance(a, ast.Starred) for a in call.args[:position + 1]):
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _sites(tree: ast.Module, builders: set[str]) -> list[tuple[ast.AST, int]]:
    """(reason expression, line) for every place the module gives a reason."""
    found: list[tuple[ast.AST, int]] = []

    def visit(node: ast.AST, cls: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            cls = node.name
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in REASON_ARGS:
                arg = _argument(node, *REASON_ARGS[name])
            elif name in REASON_EXCEPTIONS or (name == "__init__" and cls in REASON_EXCEPTIONS
                                               and isinstance(node.func, ast.Attribute)
                                               and isinstance(node.func.value, ast.Call)
                                               and _name(node.func.value.func) == "super"):
                arg = _argument(node, 0, None)
            else:
                arg = None
            if arg is not None:
                found.append((arg, node.lineno))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            pairs = []
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += zip(target.elts, node.value.elts)
                else:
                    pairs.append((target, node.value))
            found.extend((value, node.lineno) for target, value in pairs
                         if isinstance(target, ast.Attribute) and target.attr in REASON_ATTRS)
        elif isinstance(node, ast.Dict):
            found.extend((value, node.lineno) for key, value in zip(node.keys, node.values)
                         if isinstance(key, ast.Constant) and key.value in REASON_KEYS)
        elif isinstance(node, ast.FunctionDef) and node.name in builders:
            found.extend((r.value, r.lineno) for r in ast.walk(node)
                         if isinstance(r, ast.Return) and r.value is not None)
        for child in ast.iter_child_nodes(node):
            visit(child, cls)

    visit(tree, None)
    return found


# A module is read only when it can give a reason: the same names, in its text.
_MAY_GIVE = re.compile(r"\b(%s)\(|\.(%s)\s*\+?=|[\"'](%s)[\"']\s*:" % (
    "|".join(sorted({*REASON_ARGS, *REASON_EXCEPTIONS})), "|".join(sorted(REASON_ATTRS)),
    "|".join(sorted(REASON_KEYS))))


def collect(sources: dict[str, str]) -> list[Reason]:
    """The reasons the modules {path relative to the root: source} give, one per distinct text, with their sites;
    a reason made of another's text alone (f"rank {rank}: {reason}") has no text to state and is left out."""
    reasons: dict[str, Reason] = {}
    for path, source in sorted(sources.items()):
        builders = BUILDERS.get(path, set())
        if path.startswith(NOT_RECORD_REASONS) or not (builders or _MAY_GIVE.search(source)):
            continue
        tree = ast.parse(source, path)
        consts = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
                  and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                  for t in n.targets if isinstance(t, ast.Name)}
        for expr, line in _sites(tree, builders):
            text = skeleton(_parts(expr, consts)).strip(HOLE)
            reason = reasons.setdefault(text, Reason(text))
            reason.sites.append(f"{path}:{line}")
    return [r for r in reasons.values() if r.starts() or r.whole()]


def harness_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(HARNESS.rglob("*.py"))}


def stated_text(sources: dict[str, str]) -> str:
    """The strings of test modules as skeletons, one a line (docstrings and comments left out: a test states a
    reason in what it asserts or builds; an f-string's values are holes), regex escapes undone ("submission\\.py"
    states "submission.py")."""
    texts = []
    for path, source in sources.items():
        for node in ast.walk(ast.parse(source, path)):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    first.value.value = None  # a docstring
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
            elif isinstance(node, ast.JoinedStr):
                texts.append(HOLE.join(_parts(node, {})))
    return skeleton([re.sub(r"\\([^\w\s])", r"\1", "\n".join(texts))])


def sources_of_tests() -> dict[str, str]:
    """The test modules but this one (its own strings state nothing)."""
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(TESTS.glob("test_*.py"))
            if p.name != Path(__file__).name}


@functools.lru_cache(maxsize=None)
def harness_reasons() -> tuple[list[Reason], str]:
    """The harness's reasons and the tests' text, read once for this module's tests."""
    return collect(harness_sources()), stated_text(sources_of_tests())


def unstated(reasons: list[Reason], stated: str) -> list[Reason]:
    """The reasons no test states (MIN_FRAGMENT: what states one)."""
    joined, begins = "", []
    for reason in reasons:
        begins.append(len(joined))
        joined += reason.text + "\n"
    # the tests' runs of MIN_FRAGMENT characters that start at a word: a first sieve, by set lookup
    words = {stated[m.start():m.start() + MIN_FRAGMENT] for m in _WORD_START.finditer(stated)}

    def holders(run: str) -> int:
        seen, at = set(), joined.find(run)
        while at >= 0:
            seen.add(bisect.bisect_right(begins, at))
            at = joined.find(run, at + 1)
        return len(seen)

    def states(reason: Reason) -> bool:
        if reason.whole() and reason.whole() in stated:
            return True
        # its own text (values and punctuation at its ends left out) in another's: a run they share states it
        alone = holders(reason.text.strip(HOLE + " :;,.(")) == 1
        text = reason.text
        for i in reason.starts():
            end = i + MIN_FRAGMENT
            if text[i:end] not in words:
                continue
            while alone and end <= len(text) and holders(text[i:end]) > 1:
                end += 1  # longer, until no other reason holds it
            if end <= len(text) and text[i:end] in stated:
                return True
        return False

    return [reason for reason in reasons if not states(reason)]


def _excused(reason: Reason) -> bool:
    return any(skeleton([fragment]) in reason.text for fragment in (*NOT_TESTABLE_HERE, *NEVER_GIVEN))


def test_every_reason_the_harness_gives_is_stated_by_a_test():
    reasons, stated = harness_reasons()
    missing = [r for r in unstated(reasons, stated) if not _excused(r)]
    assert not missing, ("reasons no test states (trigger each in a test that asserts its text, or say in "
                         "NOT_TESTABLE_HERE why no test here can, or in NEVER_GIVEN why no run can):\n"
                         + "\n".join(f"  {', '.join(r.sites)}: {r.shown[:160]!r}" for r in missing))


FAKE = ("def give_up(record):\n"
        "    set_outcome(record, 'invalid', f'the flux capacitor of rank {record.rank} overheated at {record.mph}"
        " mph')\n")


def test_a_new_reason_without_a_test_is_reported_and_a_reason_of_each_kind_is_found():
    reasons, stated = harness_reasons()
    fake = collect({"harness/launcher/run/fake.py": FAKE})
    assert [(r.shown, r.sites) for r in unstated([*reasons, *fake], stated) if r in fake] == [
        ("the flux capacitor of rank {} overheated at {} mph", ["harness/launcher/run/fake.py:2"])]
    # ...and once a test states it, it is not
    told = stated + "\n" + skeleton(["the flux capacitor of rank 1 overheated"])
    assert unstated([*reasons, *fake], told) == unstated(reasons, told)
    # a reason of each kind of site is found: a renamed builder or call would drop its reasons silently
    shown = [r.shown for r in reasons]
    for text in ("the launcher stopped before the run finished",  # set_outcome
                 "exited without reporting a result",  # Outcome
                 "harness error: the control channel stopped listening",  # _kill
                 "MiB of reports (the cap per rank)",  # _violate
                 "start-up took longer than the track's allowance of",  # a builder's return
                 "the weights hold NaN or inf values after the last step",  # a rank's exception
                 "the model has no trainable parameters.",  # the contract
                 "still beat but gave no account within",  # record.reason =
                 "out of memory",  # a rank's error report
                 "the file unpacks to"):  # the open division's checkpoint reader
        assert any(text in s for s in shown), text
    sources = harness_sources()
    for path, names in BUILDERS.items():
        defined = {n.name for n in ast.walk(ast.parse(sources[path])) if isinstance(n, ast.FunctionDef)}
        assert names <= defined, f"{path}: no {names - defined}"


def test_every_reason_excused_from_a_test_is_still_given_and_still_unstated():
    reasons, stated = harness_reasons()
    left = unstated(reasons, stated)
    for fragment in (*NOT_TESTABLE_HERE, *NEVER_GIVEN):
        excused = [r for r in reasons if skeleton([fragment]) in r.text]
        assert excused, f"no reason of the harness says {fragment!r} any more: take it off the excuses"
        assert all(r in left for r in excused), f"a test states {fragment!r} now: take it off the excuses"
