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


GRAPH = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def reach(start: str) -> dict[str, str]:
    """Every module imported, directly or through harness modules, by the modules under `start`,
    mapped to the harness module that imports it."""
    seen: dict[str, str] = {}
    todo = [m for m in GRAPH if m == start or m.startswith(start + ".")]
    visited = set()
    while todo:
        mod = todo.pop()
        if mod in visited:
            continue
        visited.add(mod)
        for target in GRAPH.get(mod, ()):
            seen.setdefault(target, mod)
            if target in GRAPH and target not in visited:
                todo.append(target)
    return seen


def _violations(start: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{importer} imports {target}" for target, importer in reach(start).items()
                  if any(target == f or target.startswith(f + ".") for f in forbidden))


def test_the_rank_side_imports_nothing_from_the_launcher_or_the_results():
    """What shares a process with a team's code stays small: no launcher, no results, no CLI stack."""
    forbidden = ("harness.launcher", "harness.results", "harness.cli", "click", "pandas", "matplotlib")
    assert _violations("harness.ranks", forbidden) == []


def test_the_results_side_touches_no_process():
    forbidden = ("torch.distributed", "harness.launcher", "harness.ranks", "harness.cli", "subprocess")
    assert _violations("harness.results", forbidden) == []


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


def test_the_checker_sees_lazy_imports_and_relative_ones(tmp_path):
    """The rules above must be able to fail: an import inside a function, and a relative one, are found."""
    src = tmp_path / "harness" / "ranks" / "x.py"
    src.parent.mkdir(parents=True)
    src.write_text("def f():\n    from harness.results import plots\n    from ..launcher import watch\n")
    found = _imports(src, root=tmp_path)
    assert {"harness.results.plots", "harness.launcher", "harness.launcher.watch"} <= found
