"""The layout keeps its promises: which room may import which (README, "Architecture").

Every import statement of every module counts, including those inside functions (most of the
rank side imports lazily), and the rule applies to everything a room reaches through other
harness modules, not only to its own files.
"""

import ast
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
    only in harness/ranks/model_worker.py, a process of its own)."""
    forbidden = ("harness.launcher", "harness.results", "harness.cli", "click", "pandas", "matplotlib",
                 "harness.ranks.model_worker", "harness.ranks.model_template", "harness.ranks.loop",
                 "harness.ranks.preflight", "harness.ranks.open_checks",
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


def test_every_module_lives_in_a_room():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py", "cli.py"))
    assert loose == [], f"modules outside the rooms: {loose} (see README, Architecture)"
    rooms = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert rooms == ROOMS, f"a room without a rule: {rooms ^ ROOMS} (add it here and to the README)"


def test_the_graph_is_the_real_one():
    """The rules above must not pass on an empty or partial graph."""
    assert {"harness.ranks.train", "harness.ranks.loop", "harness.ranks.model_worker", "harness.scoring.scorer",
            "harness.results.views", "harness.launcher.runner", "harness.cli"} <= set(GRAPH)
    assert "torch" in reach("harness.ranks") and "pandas" in reach("harness.results")


def test_a_rank_process_really_imports_no_launcher_or_results_modules():
    """What no static reading sees (importlib.import_module with a string): import the rank entry
    points as a rank process does, and look at what is loaded."""
    import subprocess
    import sys

    code = ("import sys, harness.ranks.train, harness.ranks.loop, harness.ranks.model_worker, harness.ranks.preflight, "
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

    code = ("import sys, harness.cli, harness.launcher.runner, harness.launcher.rescore, harness.launcher.scale, "
            "harness.launcher.console, harness.launcher.assemble; "
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
