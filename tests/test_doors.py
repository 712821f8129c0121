"""Around the sandbox: every channel from team code to the harness that is not the scoring path
(docs/rules.md, "Every door from team code to the harness"). Each test runs a hostile submission of
tests/fixtures/ through the real CLI and asserts that it is caught or gains nothing."""

import json
import os
import re
from pathlib import Path

import pytest

from conftest import FIXTURES, one_rank, quick_track, run_dirs
from records_factory import make_run


def _record(runs: Path, team: str) -> tuple[Path, dict]:
    (path,) = (runs / "tiny" / team).glob("*/run.json")
    return path.parent, json.loads(path.read_text())


def _copy_fixture(name: str, dest: Path) -> Path:
    import shutil

    shutil.copytree(FIXTURES / name, dest / name)
    return dest / name


# ----------------------------------------------------------------------------- the submission folder


@pytest.mark.parametrize("entry", ["link to a file", "link to a folder", "fifo"])
def test_a_submission_folder_that_holds_anything_but_regular_files_is_invalid(cli, tmp_path, entry):
    """A link to where validation data lies would make it the team's own file once copied; a FIFO would
    block the launcher that opens it. Nothing of either is read: the run is invalid, naming the entry."""
    sub = _copy_fixture("linked_data", tmp_path)
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "val.bin").write_bytes(b"SECRET-TOKENS" * 100)
    if entry == "link to a file":
        os.symlink(secret / "val.bin", sub / "corpus.bin")
        name = "corpus.bin"
    elif entry == "link to a folder":
        (sub / "data").mkdir()
        os.symlink(secret, sub / "data" / "shards")
        name = "data/shards"
    else:
        os.mkfifo(sub / "corpus.bin")
        name = "corpus.bin"
    result = cli("run", str(sub), "--track", str(quick_track(tmp_path)), timeout=120)
    assert result.code == 1
    run_dir, record = _record(tmp_path / "runs", "linked_data")
    assert record["status"] == "invalid", record["reason"]
    assert record["reason"].startswith(f"{name}: is a ") and "regular files only" in record["reason"]
    copied = [p for p in (run_dir / "submission").rglob("*") if p.is_file()] if (run_dir / "submission").exists() else []
    assert not any(b"SECRET-TOKENS" in p.read_bytes() for p in copied)


# ----------------------------------------------------------------------------- stores and reports


def test_a_rank_that_writes_pickles_into_the_rendezvous_store_runs_nothing_in_the_launcher(cli, tmp_path):
    """A rank has TCP and the store's address: it writes, under the keys torch elastic's c10d backend
    keeps its pickled state in, a pickle that leaves a file when loaded. The launcher's rendezvous keeps
    no pickled state: no process ever loads it, and the run is scored as the bigram it is."""
    result = cli("run", str(FIXTURES / "store_writer"), "--track", str(one_rank(tmp_path)), timeout=120)
    run_dir, record = _record(tmp_path / "runs", "store_writer")
    mark = Path(f"/tmp/harness-door-store-{record['run_id']}")
    try:
        assert not mark.exists(), f"a process loaded the rank's pickle: {mark.read_text()}"
        assert re.search(r"STORE-WRITER wrote [1-9]\d* keys", (run_dir / "logs" / "rank0.log").read_text())  # it reached a store
        assert result.code == 0 and record["status"] == "ok", record["reason"]
    finally:
        mark.unlink(missing_ok=True)
