"""The ranks' private folder: what the launcher takes back from it into the record."""

import os

from harness.launcher.workarea import WorkArea


def test_collecting_logs_never_follows_a_link_the_ranks_left(tmp_path):
    """A rank could leave logs/x -> the validation shard (or any file the launcher can read); the
    record gets regular files only."""
    secret = tmp_path / "val.bin"
    secret.write_bytes(b"validation tokens")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    area = WorkArea(snapshot)
    try:
        (area.logs / "rank0.log").write_text("step 1\n")
        (area.logs / "notes.txt").symlink_to(secret)
        (area.logs / "more").symlink_to(tmp_path, target_is_directory=True)
        os.mkfifo(area.logs / "pipe.log")  # reading a FIFO would block the launcher
        dest = tmp_path / "record_logs"
        area.collect_logs(dest)
        assert (dest / "rank0.log").read_text() == "step 1\n"
        copied = b"".join(p.read_bytes() for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
        assert b"validation tokens" not in copied
    finally:
        area.cleanup()
