"""The layout keeps its promises: which room may import which (README, "Architecture").

Every import statement of every module counts, including those inside functions (most of the
rank side imports lazily), and the rule applies to everything a room reaches through other
harness modules, not only to its own files.
"""

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = ROOT / "harness"


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """Every module named by an import statement anywhere in the file (absolute names)."""
    found: set[str] = set()
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from harness.x import module`
    return found


ROOMS = {"cli", "launcher", "ranks", "scoring", "results", "submission", "data", "tracks"}
GRAPH = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _parents(module: str) -> list[str]:
    """Python runs every parent package's __init__ before a module: harness, harness.ranks, ..."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def reach(start: str, graph: dict[str, set[str]] = GRAPH) -> dict[str, str]:
    """Every module imported, directly or through harness modules (their parent packages included),
    by the modules under `start`, mapped to the harness module that imports it."""
    seen: dict[str, str] = {}
    todo = [m for m in graph if m == start or m.startswith(start + ".")]
    visited = set()
    while todo:
        mod = todo.pop()
        if mod in visited:
            continue
        visited.add(mod)
        for target in [*graph.get(mod, ()), *_parents(mod)]:
            seen.setdefault(target, mod)
            for candidate in (target, *_parents(target)):
                if candidate in graph and candidate not in visited:
                    todo.append(candidate)
    return seen


def _violations(start: str, forbidden: tuple[str, ...], graph: dict[str, set[str]] = GRAPH) -> list[str]:
    return sorted(f"{importer} imports {target}" for target, importer in reach(start, graph).items()
                  if any(target == f or target.startswith(f + ".") for f in forbidden))


def test_the_rank_side_imports_nothing_from_the_launcher_or_the_results():
    """What shares a process with a team's code stays small: no launcher, no results, no scorer, no CLI stack."""
    forbidden = ("harness.launcher", "harness.results", "harness.scoring", "harness.cli", "click", "pandas",
                 "matplotlib")
    assert _violations("harness.ranks", forbidden) == []


def test_the_results_side_touches_no_process():
    """Derived from records alone: no torch at all (importing torch loads torch.distributed), no launcher."""
    forbidden = ("torch", "harness.launcher", "harness.ranks", "harness.cli", "subprocess")
    assert _violations("harness.results", forbidden) == []


def test_the_scorer_never_reaches_the_code_that_imports_a_submission():
    """Evaluation's scorer holds the targets: nothing it imports may load a team's code (that happens
    only in harness/ranks/models/model_worker.py, a process of its own)."""
    forbidden = ("harness.launcher", "harness.results", "harness.cli", "click", "pandas", "matplotlib",
                 "harness.ranks.models.model_worker", "harness.ranks.models.model_template", "harness.ranks.training.loop",
                 "harness.ranks.models.preflight", "harness.ranks.models.open_checks",
                 "harness.ranks.checkpoint.load_model", "harness.submission.contract.import_submission_module")
    assert _violations("harness.scoring", forbidden) == []


@pytest.mark.parametrize("room, forbidden", [
    ("harness.submission", ("harness.launcher", "harness.results", "harness.ranks", "harness.cli")),
    ("harness.data", ("harness.launcher", "harness.results", "harness.ranks", "harness.cli")),
    ("harness.tracks", ("harness.launcher", "harness.results", "harness.ranks", "harness.data", "harness.cli")),
    ("harness.launcher", ("harness.cli", "click")),
])
def test_shared_rooms_do_not_reach_back_up(room, forbidden):
    assert _violations(room, forbidden) == []


# The rooms inside the big ones, each with what it may not import: a room imports only rooms below it.
# launcher: control < run < scaling < doctor < event; ranks: confine < the training ranks (the room's own
# modules) and models; results: its records and tables < charts < the views that draw them.
LAUNCHER = ("harness.launcher.control", "harness.launcher.run", "harness.launcher.scaling", "harness.launcher.doctor",
            "harness.launcher.event")
SUBROOMS = {
    **{room: LAUNCHER[i + 1:] for i, room in enumerate(LAUNCHER)},
    "harness.ranks.confine": ("harness.ranks.models", "harness.ranks.training", "harness.ranks.checkpoint",
                              "harness.ranks.process", "harness.ranks.open_rank"),
    # the check's and evaluation's model processes, and the fixed loop's ranks: two rooms that never meet
    "harness.ranks.models": ("harness.ranks.training", "harness.ranks.open_rank", "harness.ranks.doctor_rank"),
    "harness.ranks.training": ("harness.ranks.models", "harness.ranks.open_rank", "harness.ranks.doctor_rank"),
    "harness.results.charts": ("harness.results.views", "harness.results.page", "harness.results.tables"),
}
# A room's modules, for the rule of a room that is a package's own files (harness.ranks: what its processes share).
OWN = {"harness.ranks": ("harness.ranks.confine", "harness.ranks.models", "harness.ranks.training")}


@pytest.mark.parametrize("room", sorted(SUBROOMS))
def test_each_room_imports_only_the_rooms_below_it(room):
    """What each room may import, as the README's rooms table says it; the rule follows every import through
    other modules (a room that reaches an upper one through a third breaks it too)."""
    assert _violations(room, SUBROOMS[room]) == []


def test_the_training_ranks_never_load_the_check_or_the_model_processes_code():
    """A training rank runs the fixed loop beside the team's code: the check's and evaluation's model processes'
    code (harness/ranks/models/) is theirs, never loaded there, neither by the training room nor by the floor
    below it that every rank process loads."""
    own = [m for m in GRAPH if m.startswith("harness.ranks.") and not m.startswith(OWN["harness.ranks"])]
    training = [m for m in GRAPH if m.startswith("harness.ranks.training.")]
    assert own and training
    found = sorted({v for m in [*own, *training] for v in _violations(m, ("harness.ranks.models",))})
    assert found == []


def test_what_the_rank_processes_share_never_reaches_up_into_the_training_ranks():
    """harness/ranks/'s own modules (start-up and exit, the channel, the checkpoint, the open division's and the
    doctor's ranks) are the floor below the fixed loop's room: the check, evaluation and an open-division script
    load them without loading the fixed loop."""
    own = [m for m in GRAPH if m.startswith("harness.ranks.") and not m.startswith(OWN["harness.ranks"])]
    assert own and sorted({v for m in own for v in _violations(m, ("harness.ranks.training",))}) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    edges = {m: sorted(t for t in targets if t in graph and t != m) for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_itself_through_others():
    """No import circles: a module that needs another's piece, and is needed by it, means the piece belongs
    below both (every import counts, those inside functions and under TYPE_CHECKING too)."""
    assert _cycles(GRAPH) == []


def test_the_circle_finder_finds_circles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_lives_in_a_room_and_every_room_says_its_job():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "cli.py"))
    assert loose == [], f"modules outside the rooms: {loose} (see README, Architecture)"
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == ROOMS, f"a room without a rule: {rooms ^ ROOMS} (add it here and to the README)"
    inner = {_module_name(p.parent / "__init__.py") for p in PACKAGE.glob("*/*/__init__.py")}
    assert inner == set(SUBROOMS), f"a room without a rule: {inner ^ set(SUBROOMS)} (SUBROOMS, and the README)"
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()[0]) <= 120, f"{init}: its first line must say the room's job"
    for folder in [PACKAGE, *PACKAGE.rglob("*/")]:
        if (folder / "__init__.py").is_file():
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            assert len(modules) <= 16, f"{folder} holds {len(modules)} modules: it wants rooms"


def test_the_graph_is_the_real_one():
    """The rules above must not pass on an empty or partial graph."""
    assert {"harness.ranks.training.train", "harness.ranks.training.loop", "harness.ranks.models.model_worker", "harness.scoring.scorer",
            "harness.results.views", "harness.launcher.run.runner", "harness.cli"} <= set(GRAPH)
    assert "torch" in reach("harness.ranks") and "pandas" in reach("harness.results")


def test_a_rank_process_really_imports_no_launcher_or_results_modules():
    """What no static reading sees (importlib.import_module with a string): import the rank entry
    points as a rank process does, and look at what is loaded."""
    import subprocess
    import sys

    code = ("import sys, harness.ranks.training.train, harness.ranks.training.loop, harness.ranks.models.model_worker, harness.ranks.models.preflight, "
            "harness.scoring.scorer, harness.scoring.workers; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('click', 'pandas', 'matplotlib') "
            "or m.startswith(('harness.launcher', 'harness.results', 'harness.cli'))); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_run_loads_no_pandas_or_matplotlib_until_it_refreshes_the_leaderboard():
    """`harness run --no-leaderboard` pays for torch only: the views' libraries (0.5 s of imports on a
    small CPU) load when a leaderboard is rebuilt, never to find where it lives."""
    import subprocess
    import sys

    code = ("import sys, harness.cli, harness.launcher.run.runner, harness.launcher.run.rescore, harness.launcher.scaling.scale, "
            "harness.launcher.run.console, harness.launcher.run.assemble; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'matplotlib')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_checker_sees_lazy_imports_and_relative_ones(tmp_path):
    """The rules above must be able to fail: an import inside a function, and a relative one, are found."""
    src = tmp_path / "harness" / "ranks" / "x.py"
    src.parent.mkdir(parents=True)
    src.write_text("def f():\n    from harness.results import plots\n    from ..launcher import watch\n")
    found = _imports(src, root=tmp_path)
    assert {"harness.results.plots", "harness.launcher", "harness.launcher.watch"} <= found


def test_the_checker_follows_parent_packages_and_other_modules():
    """A forbidden import two hops away, or in a parent package's __init__, is still a violation."""
    graph = {"harness": {"harness.results.views"}, "harness.ranks": set(), "harness.ranks.a": {"harness.data.b"},
             "harness.data": set(), "harness.data.b": {"matplotlib.pyplot"}, "harness.results.views": set()}
    found = _violations("harness.ranks", ("harness.results", "matplotlib"), graph)
    assert {"harness imports harness.results.views", "harness.data.b imports matplotlib.pyplot"} <= set(found)


def test_every_slow_fixture_named_in_conftest_exists():
    """A renamed run fixture would silently move its tests into the fast tier (and past 2 minutes)."""
    from conftest import SLOW_FIXTURES

    defined = set()
    for path in ROOT.glob("tests/*.py"):
        defined |= set(re.findall(r"@pytest\.fixture[^\n]*\n(?:@[^\n]*\n)*def (\w+)", path.read_text()))
    assert SLOW_FIXTURES <= defined, sorted(SLOW_FIXTURES - defined)
