"""Docs that match the code: the example runs, every option and track key is documented."""

import dataclasses
import re

import click
import pytest

from conftest import ROOT
from harness.cli import main
from harness.ranks.models.preflight import run_checks
from harness.tracks.ddp import DdpSpec
from harness.tracks.spec import DataSpec, EvalSpec, InterconnectSpec, SyntheticSpec, TextSpec, Track


@pytest.mark.slow
def test_the_minimal_submission_in_the_docs_passes_the_contract_checks(tmp_path):
    text = (ROOT / "docs" / "submission.md").read_text()
    section = text.split("## A complete minimal submission", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    (tmp_path / "submission.py").write_text(code)
    report = run_checks({"submission_dir": str(tmp_path), "vocab_size": 256, "device": "cpu", "seed": 0})
    assert report["ok"], report["problems"]
    shipped = (ROOT / "submissions" / "minimal" / "submission.py").read_text()
    assert shipped.endswith(code), "submissions/minimal/submission.py differs from the docs' example"


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command, a group's subcommands included (`data prepare`)."""
    found = {}
    for name, cmd in group.commands.items():
        found[prefix + name] = cmd
        if isinstance(cmd, click.Group):
            found.update(_commands(cmd, prefix + name + " "))
    return found


COMMANDS = _commands(main)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_cli_option_is_in_the_readme_or_docs(command):
    docs = (ROOT / "README.md").read_text() + "".join(p.read_text() for p in (ROOT / "docs").glob("*.md"))
    assert f"harness {command}" in docs, f"`harness {command}` is not documented"
    for param in COMMANDS[command].params:
        if isinstance(param, click.Option):
            # The long name as a whole word: a short alias (-t) or a prefix (--out of --output) proves nothing.
            longs = [opt for opt in param.opts + param.secondary_opts if opt.startswith("--")]
            assert longs and any(re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", docs) for opt in longs), \
                f"`harness {command} {param.opts[0]}` is not documented"


@pytest.mark.parametrize("cls, heading", [(Track, "## Top-level keys"), (DataSpec, "## `[data]`"),
                                          (SyntheticSpec, "## `[data.synthetic]`"), (TextSpec, "## `[data.text]`"),
                                          (EvalSpec, "## `[eval]`"), (InterconnectSpec, "## `[interconnect]`"),
                                          (DdpSpec, "## `[ddp]`")])
def test_every_track_key_is_in_the_track_reference(cls, heading):
    text = (ROOT / "docs" / "tracks.md").read_text().split(heading, 1)[1].split("\n## ", 1)[0]
    for f in dataclasses.fields(cls):
        if f.name in ("source", "data", "eval", "synthetic", "interconnect", "ddp") and cls is not DataSpec:
            continue
        if cls is DataSpec and f.name in ("synthetic", "text"):
            continue
        assert f"`{f.name}`" in text, f"track key {f.name} is not in docs/tracks.md under {heading}"


@pytest.mark.slow
def test_every_test_named_in_the_testing_table_exists():
    """docs/testing.md says where each promise is tested: each name there must be a test of that file."""
    import ast

    text = (ROOT / "docs" / "testing.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith(("| promise", "|---"))]
    assert len(rows) >= 20, "the table of docs/testing.md is gone"
    for row in rows:
        named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", row)
        assert named, f"a promise without a test in docs/testing.md: {row[:80]}"
        for path, name in named:
            assert (ROOT / path).is_file(), f"docs/testing.md names {path}, which does not exist"
            tree = ast.parse((ROOT / path).read_text())
            tests = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
            assert name in tests, f"docs/testing.md names {path}::{name}, which is not a test of that file"


def test_every_door_in_the_rules_names_tests_that_exist():
    """docs/rules.md's table of doors from team code to the harness: each row names its defence's tests
    (`test_x.py::test_name`, then `::test_other` of the same file), and each is a test of that file."""
    import ast

    text = (ROOT / "docs" / "rules.md").read_text()
    start = text.index("### Every door from team code to the harness")
    rows = [line for line in text[start:].split("**Defended:**")[0].splitlines()
            if line.startswith("| ") and not line.startswith(("| door", "|---"))]
    assert len(rows) >= 14, "the table of doors in docs/rules.md is gone"
    tested = 0
    for row in rows:
        current = None
        for path, name in re.findall(r"`(?:(test_\w+\.py))?::(test_\w+)(?:\[[^\]]*\])?`", row):
            current = path or current
            assert current, f"docs/rules.md names ::{name} without its file: {row[:80]}"
            tree = ast.parse((ROOT / "tests" / current).read_text())
            assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, \
                f"docs/rules.md names {current}::{name}, which is not a test of that file"
            tested += 1
    assert tested >= 20


def test_the_leaderboard_docs_list_the_columns_the_csv_and_the_markdown_have():
    """docs/leaderboard.md said "The CSV and the Markdown table have the same columns in the same order" after the
    Markdown had become unreadable with 23 of them. Each table's columns are listed between markers, in order, and
    must be the code's."""
    from harness.results.leaderboard import COLUMNS
    from harness.results.tables import MARKDOWN_COLUMNS

    text = (ROOT / "docs" / "leaderboard.md").read_text()

    def listed(marker: str) -> list[str]:
        block = text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]
        return re.findall(r"`(\w+)`", block)

    assert listed("csv-columns") == COLUMNS
    assert listed("markdown-columns") == MARKDOWN_COLUMNS
    assert "same columns in the same order" not in text
