"""A newcomer's first hour: the scripts of the README's quickstart, and a clean checkout after them.

The install scripts run here against a fake machine: a `python3` whose venv's `pip`, `python` and
`harness` only record how they were called, and a `uname` that names the system. What is tested is
what the scripts ask for (which torch, from which index, which command after), not pip itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _git(*args: str) -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    assert proc.returncode == 0, f"git {' '.join(args)} failed (these tests read the checkout's index): {proc.stderr}"
    return proc.stdout


def _fake_machine(tmp_path: Path, system: str, torch_installed: bool = False, harness_exit: int = 0):
    """A copy of the scripts in an empty repository, and a PATH whose python3 makes a venv of recorders.
    Returns (repository, env, calls): `calls()` is the recorded command lines, one per call."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("setup-venv", "quickstart"):
        shutil.copy2(ROOT / "scripts" / name, repo / "scripts" / name)
    log = tmp_path / "calls.log"
    template = tmp_path / "venv-template" / "bin"
    template.mkdir(parents=True)
    tools = {"pip": 0, "harness": harness_exit, "python": 0 if torch_installed else 1}  # python: `import torch`
    for tool, code in tools.items():
        (template / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\nexit {code}\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\n[ "$1 $2" = "-m venv" ] || exit 99\ncp -r "{template.parent}" "$3"\n')
    (bin_dir / "uname").write_text(f'#!/bin/sh\n[ "$1" = "-s" ] || exit 99\necho {system}\n')
    for path in [*template.iterdir(), *bin_dir.iterdir()]:
        path.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_TORCH_VERSION"}
    env["PATH"] = f"{bin_dir}:{env['PATH']}"

    def calls() -> list[list[str]]:
        return [line.split() for line in log.read_text().splitlines()] if log.exists() else []

    return repo, env, calls


def _torch_install(calls: list[list[str]]) -> list[str] | None:
    found = [c for c in calls if c[:2] == ["pip", "install"] and any(a.startswith("torch") for a in c)]
    assert len(found) <= 1, found
    return found[0] if found else None


@pytest.mark.parametrize("system, version, wanted, index", [
    ("Linux", None, "torch==2.13.0+cpu", CPU_INDEX),  # PyPI's Linux torch is the CUDA build: GBs
    ("Linux", "2.12.1", "torch==2.12.1+cpu", CPU_INDEX),
    ("Darwin", None, "torch==2.13.0", None),  # PyPI's macOS wheels are the CPU build
    ("Linux", "2.12.1+cpu", "torch==2.12.1+cpu", CPU_INDEX),  # the CPU build asked for by name: `+cpu` once
    ("Darwin", "2.12.1+cpu", "torch==2.12.1", None),  # PyPI has no `+cpu` wheels: its macOS build is the CPU one
])
def test_setup_venv_installs_the_cpu_build_of_torch_first(tmp_path, system, version, wanted, index):
    torch, pips = _setup_venv_torch_install(tmp_path, system, version)
    assert torch is not None and wanted in torch and pips.index(torch) == 0, pips
    assert (torch[torch.index("--extra-index-url") + 1] if "--extra-index-url" in torch else None) == index, torch
    if index:  # an unreachable index (an offline machine with the wheel in pip's find-links) costs seconds
        assert torch[torch.index("--retries") + 1] == "1" and torch[torch.index("--timeout") + 1] == "10", torch
    assert pips[-1][:2] == ["pip", "install"] and pips[-1][-2:] == ["-e", ".[test]"], pips


@pytest.mark.parametrize("system", ["Linux", "Darwin"])
def test_setup_venv_takes_another_local_build_as_given_from_its_own_index(tmp_path, system):
    """`HARNESS_TORCH_VERSION=2.5.1+cu121` names a CUDA build: installed as named (never `+cu121+cpu`), from
    PyTorch's index for that build (PyPI serves no local versions), not from the CPU index."""
    torch, pips = _setup_venv_torch_install(tmp_path, system, "2.5.1+cu121")
    assert torch is not None and "torch==2.5.1+cu121" in torch and pips.index(torch) == 0, pips
    assert torch[torch.index("--extra-index-url") + 1] == "https://download.pytorch.org/whl/cu121", torch
    assert CPU_INDEX not in torch and not any("+cpu" in a for a in torch), torch


def _setup_venv_torch_install(tmp_path, system: str, version: str | None):
    """setup-venv on a fake machine without torch: its torch install command line and every pip call."""
    repo, env, calls = _fake_machine(tmp_path, system)
    if version:
        env["HARNESS_TORCH_VERSION"] = version
    proc = subprocess.run([str(repo / "scripts" / "setup-venv"), "[test]"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    pips = [c for c in calls() if c[0] == "pip"]
    return _torch_install(pips), pips


def test_setup_venv_keeps_the_torch_already_installed(tmp_path):
    """On a GPU machine the team installs its CUDA build into .venv first: the script must not replace it."""
    repo, env, calls = _fake_machine(tmp_path, "Linux", torch_installed=True)
    (repo / ".venv").mkdir()
    shutil.copytree(tmp_path / "venv-template" / "bin", repo / ".venv" / "bin")
    proc = subprocess.run([str(repo / "scripts" / "setup-venv")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert _torch_install(calls()) is None and calls()[-1] == ["pip", "install", "--quiet", "-e", "."], calls()


@pytest.mark.parametrize("harness_exit", [0, 1])
def test_quickstart_runs_the_baseline_and_ends_by_saying_how_to_type_harness(tmp_path, harness_exit):
    """`harness` lives in .venv/bin, which no script can put on its caller's PATH: the quickstart's last line
    says how, whatever the run's outcome, and its exit code is the run's."""
    repo, env, calls = _fake_machine(tmp_path, "Linux", harness_exit=harness_exit)
    proc = subprocess.run([str(repo / "scripts" / "quickstart"), "--seed", "2"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == harness_exit, proc.stderr
    assert calls()[-1] == ["harness", "run", "submissions/baseline", "--seed", "2"], calls()
    output = (proc.stdout + proc.stderr).strip().splitlines()
    assert output and "source .venv/bin/activate" in output[-1], output


def test_the_readme_activates_the_venv_before_its_first_harness_command():
    """Every `harness ...` the README asks for is typed in a shell where .venv is active: the quickstart block
    says to activate it, before any later part of the README uses `harness` (the opening paragraph above the
    quickstart describes the command; it asks nothing)."""
    text = (ROOT / "README.md").read_text()
    text = text[text.index("## Quickstart\n"):]
    quickstart = re.search(r"```\n(.*?)```", text, re.S).group(1)
    lines = [line.split("#")[0].strip() for line in quickstart.splitlines()]
    assert lines[:2] == ["scripts/quickstart", "source .venv/bin/activate"], lines
    first_harness = re.search(r"(?m)(^|`)harness [a-z]", text)
    assert text.index("source .venv/bin/activate") < first_harness.start(), first_harness.group(0)


def test_no_tracked_file_lies_where_a_run_writes_by_default(monkeypatch):
    """The quickstart's run refreshes leaderboard/ and plots/ (the defaults, relative to the checkout where the
    README's commands are typed): no file of the repository may be there, and what a run writes there is
    ignored, so that a newcomer's `git status` stays clean after it."""
    from harness.results.records import leaderboard_root, plots_root

    for var in ("HARNESS_LEADERBOARD_DIR", "HARNESS_PLOTS_DIR", "HARNESS_RUNS_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(ROOT)  # where the README's commands are typed: the board goes beside ./runs
    assert (leaderboard_root(), plots_root()) == (ROOT / "leaderboard", ROOT / "plots")
    board, plots = Path("leaderboard"), Path("plots")
    assert _git("ls-files", "--", str(board), str(plots)).split() == []
    written = [str(board / "local.csv"), str(board / "local.html"), str(board / ".lock"),
               str(plots / "local" / "val_loss.png"), str(plots / "compare" / "a_vs_b.png")]
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", *written], capture_output=True,
                             text=True)
    assert sorted(ignored.stdout.split()) == sorted(written), ignored.stderr


def test_the_example_standings_are_regenerated_where_they_are_committed(tmp_path, monkeypatch):
    """scripts/example-standings writes the folders that hold the committed example files, never the
    defaults a user's own runs write to."""
    from harness.results.records import leaderboard_root, plots_root

    log = tmp_path / "calls.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$HARNESS_LEADERBOARD_DIR $HARNESS_PLOTS_DIR" >> "{log}"\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    proc = subprocess.run([str(ROOT / "scripts" / "example-standings")], env={**env, "PYTHON": str(fake), "SEEDS": "1"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (dirs,) = set(log.read_text().splitlines())
    board, plots = dirs.split()
    for var in ("HARNESS_LEADERBOARD_DIR", "HARNESS_PLOTS_DIR"):
        monkeypatch.delenv(var, raising=False)
    assert Path(board) != leaderboard_root() and Path(plots) != plots_root()
    tracked = set(_git("ls-files", "--", board, plots).split())
    assert {f"{board}/local.{ext}" for ext in ("csv", "md", "html")} <= tracked, tracked
    charts = ("loss_vs_time", "loss_vs_tokens", "val_loss", "throughput", "scaling")
    assert {f"{plots}/local/{name}.png" for name in charts} <= tracked, tracked
