"""The ranks' private folder: what the launcher takes back from it into the record."""

import os

import pytest

from harness.launcher.control.workarea import WorkArea


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
        area.collect_logs(dest, names=["rank0.log", "notes.txt", "more", "pipe.log"])  # named, and still refused
        assert (dest / "rank0.log").read_text() == "step 1\n"
        copied = b"".join(p.read_bytes() for p in dest.rglob("*") if p.is_file() and not p.is_symlink())
        assert b"validation tokens" not in copied
    finally:
        area.cleanup()


def test_a_logs_folder_swapped_for_a_link_gives_nothing(tmp_path):
    secrets = tmp_path / "val"
    secrets.mkdir()
    (secrets / "val_000000.bin").write_bytes(b"validation tokens")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    area = WorkArea(snapshot)
    try:
        area.logs.rename(area.dir / "old_logs")  # what a rank may do inside its private folder
        area.logs.symlink_to(secrets, target_is_directory=True)
        dest = tmp_path / "record_logs"
        area.collect_logs(dest, names=["val_000000.bin"])
        assert not any(p.is_file() for p in dest.rglob("*"))
    finally:
        area.cleanup()


def test_the_checkpoint_is_taken_only_as_a_regular_file_never_through_a_link(tmp_path):
    """Rank 0 could leave staging/checkpoint.pt -> another run's checkpoint, or staging -> that run's
    folder: the record would score (and the fixed loop once moved) someone else's file."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "checkpoint.pt").write_bytes(b"VICTIM-CHECKPOINT")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    area = WorkArea(snapshot)
    try:
        assert area.take_staged("checkpoint.pt", tmp_path / "a.pt") is None  # nothing saved yet
        (area.staging / "checkpoint.pt").symlink_to(victim / "checkpoint.pt")
        assert area.take_checkpoint(tmp_path / "b.pt") is False and not (tmp_path / "b.pt").exists()
        (area.staging / "checkpoint.pt").unlink()
        area.staging.rmdir()
        area.staging.symlink_to(victim, target_is_directory=True)
        assert area.take_checkpoint(tmp_path / "c.pt") is False and not (tmp_path / "c.pt").exists()
        assert (victim / "checkpoint.pt").read_bytes() == b"VICTIM-CHECKPOINT"  # never moved out of its run
        area.staging.unlink()
        area.staging.mkdir()
        (area.staging / "checkpoint.pt").write_bytes(b"MINE")
        assert area.take_checkpoint(tmp_path / "d.pt") is True and (tmp_path / "d.pt").read_bytes() == b"MINE"
    finally:
        area.cleanup()


def test_a_link_another_node_replaces_meanwhile_is_left_alone(tmp_path, monkeypatch):
    """Nodes of a run on one machine share its logs folder: node 1's launcher replaces its link
    rank1.log by a copy while node 0 sweeps its own dead links. A link seen a moment ago that is a
    file now must be skipped, not end node 0's run with EINVAL from readlink."""
    from pathlib import Path

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    area = WorkArea(snapshot)
    try:
        (area.logs / "rank0.log").write_text("node 0\n")
        dest = tmp_path / "record_logs"
        dest.mkdir()
        (dest / "rank1.log").write_text("node 1\n")  # node 1's copy, where its link was
        real = Path.is_symlink
        monkeypatch.setattr(Path, "is_symlink", lambda self: self.name == "rank1.log" or real(self))
        area.collect_logs(dest, names=["rank0.log"])
        assert (dest / "rank0.log").read_text() == "node 0\n" and (dest / "rank1.log").read_text() == "node 1\n"
    finally:
        area.cleanup()


def test_the_record_takes_the_named_logs_within_one_budget_and_nothing_else(tmp_path):
    """One budget for all the named logs, shared so that a flooded log never crowds out a small one; files the
    ranks added (any number of them, any tree) are listed, never copied or walked."""
    from harness.launcher.control.team_files import fair_shares

    assert fair_shares({"a": 10, "b": 1000, "c": 1000}, 100) == {"a": 10, "b": 45, "c": 45}
    assert fair_shares({"a": 10}, None) == {"a": None}
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    area = WorkArea(snapshot)
    try:
        (area.logs / "rank0.log").write_text("x" * 100)
        (area.logs / "launcher.log").write_text("launcher\n")
        for i in range(50):
            with open(area.logs / f"team{i}.log", "wb") as fh:
                fh.truncate(1 << 20)
        (area.logs / "tree" / "deeper").mkdir(parents=True)
        dest = tmp_path / "record_logs"
        area.link_logs(dest, ["rank0.log", "rank1.log", "launcher.log"])  # rank1 never started: its link goes
        others = area.collect_logs(dest, budget_bytes=64)
        assert sorted(p.name for p in dest.iterdir()) == ["launcher.log", "rank0.log"]
        assert (dest / "launcher.log").read_text() == "launcher\n"  # 9 bytes whole; the rest goes to rank0
        assert (dest / "rank0.log").read_text().startswith("x" * 55) and "cut here" in (dest / "rank0.log").read_text()
        assert len(others) == 20 and "rank0.log" not in others
    finally:
        area.cleanup()


def test_every_log_of_a_record_is_held_to_one_budget_without_following_a_link(tmp_path):
    """Evaluation's model processes and the check write their own logs into the record, each bounded alone (64 MiB):
    together they are cut to the run's one budget, fairly; a link is never followed or cut through."""
    from harness.launcher.control.team_files import trim_logs

    logs = tmp_path / "logs"
    (logs / "eval-node1").mkdir(parents=True)
    (logs / "rank0.log").write_text("r" * 50)
    (logs / "eval-model-rank0.log").write_text("m" * 5000)
    (logs / "eval-node1" / "eval-rank1.log").write_text("n" * 5000)
    outside = tmp_path / "outside.txt"
    outside.write_text("o" * 5000)
    (logs / "linked.log").symlink_to(outside)
    cut = trim_logs(logs, 1050)
    assert sorted(cut) == ["eval-model-rank0.log", "eval-node1/eval-rank1.log"]
    assert (logs / "rank0.log").read_text() == "r" * 50
    assert (logs / "eval-model-rank0.log").read_text().startswith("m" * 500) and "cut here" in (logs / "eval-model-rank0.log").read_text()
    assert outside.read_text() == "o" * 5000


def test_a_private_folder_that_cannot_be_a_tmpfs_stays_on_disk_and_the_record_says_so(tmp_path, monkeypatch):
    """The training ranks' folder is a tmpfs of the job's own (harness/launcher/control/job_namespace.py): it holds a
    copy of what the launcher put there, what the ranks write there is on no disk, the launcher reaches it by its
    descriptor and, while the job lives, by name, and its size is the cap. Where the tmpfs cannot be had (here its
    holder's root cannot be reached), the job still gets its namespaces, the folder stays the launcher's own, and the
    record warns that files without a name there are not under the cap."""
    from types import SimpleNamespace

    from harness.launcher.control.job_namespace import JobNamespace
    from harness.launcher.run.training import job_namespace

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    (snapshot / "submission.py").write_text("CONFIG = {}\n")
    track = SimpleNamespace(sandbox="auto")
    record = SimpleNamespace(warnings=[])
    area = WorkArea(snapshot)
    try:
        holder = job_namespace(track, area, 1 << 24, record)
        try:
            assert holder.active and holder.report()["scratch"] == "tmpfs" and record.warnings == []
            assert (area.live(area.submission) / "submission.py").read_text() == "CONFIG = {}\n"
            (area.live(area.logs) / "rank0.log").write_text("step 1\n")  # as a rank writes it, in the job's folder
            assert not (area.logs / "rank0.log").exists()  # on no disk
            free = area.free_bytes()
            assert free is not None and free <= 1 << 24
            dest = tmp_path / "record_logs"
            area.link_logs(dest, ["rank0.log"], ["launcher.log"])
            (area.own / "launcher.log").write_text("agent\n")  # the launcher's own, beside the ranks' folder
            assert (dest / "rank0.log").read_text() == "step 1\n" and (dest / "launcher.log").read_text() == "agent\n"
            (area.live(area.staging)).rmdir()  # the ranks took their staging folder away: nothing was saved
            assert area.take_staged("checkpoint.pt", tmp_path / "taken.pt") is None
        finally:
            holder.close()
        # after the holder is gone, through the area's descriptor
        assert area.log_tail("rank0.log") == "step 1\n"
        area.collect_logs(dest)
        assert not (dest / "rank0.log").is_symlink() and (dest / "rank0.log").read_text() == "step 1\n"
        assert not (dest / "launcher.log").is_symlink() and (dest / "launcher.log").read_text() == "agent\n"
        area.release_job_folder()  # before evaluation: the job's memory back; later takes find the empty folder
        assert area.live_dir == area.dir and area.free_bytes() > 1 << 24 and area.log_tail("rank0.log") == ""
    finally:
        assert area.cleanup()
    assert not area.own.exists()

    monkeypatch.setattr(JobNamespace, "_open_folder", lambda self, writable: "not reachable (the test's)")
    area = WorkArea(snapshot)
    try:
        holder = job_namespace(track, area, 1 << 24, record)
        try:
            assert holder.active and holder.report()["scratch"] == "disk"
            assert area.live_dir == area.dir
            assert len(record.warnings) == 1 and "the ranks' private folder is on the launcher's disk" in record.warnings[0]
            assert "not reachable (the test's)" in record.warnings[0]
        finally:
            holder.close()
    finally:
        assert area.cleanup()

    from harness.launcher.run.training import JobNamespaceMissing

    area = WorkArea(snapshot)  # a track that requires the sandbox: the machine's, and no team code runs
    try:
        with pytest.raises(JobNamespaceMissing, match=r"the ranks' private folder cannot be a file system of the "
                                                      r"job's own \(not reachable \(the test's\)\)"):
            job_namespace(SimpleNamespace(sandbox="required"), area, 1 << 24, record)
    finally:
        assert area.cleanup()


def test_the_open_divisions_checkpoint_is_hashed_once_still_and_bytes_changed_unrecorded_or_refused_are_seen(
        tmp_path, monkeypatch):
    """takeback.StagedWatch, on the job's tmpfs: a version of staging/checkpoint.pt is hashed only once it stood
    still for STILL_S (two honest saves of one size within a coarse ctime's second share a version); a write through
    a shared mapping after that (no ctime moved) is seen after the job, and so is a file the launcher was refused
    while the job ran. A version that changed honestly (write(): ctime and size move) is never taken for one."""
    import errno
    import mmap
    from types import SimpleNamespace

    from harness.launcher.run.takeback import StagedWatch
    from harness.launcher.run.training import job_namespace

    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    area = WorkArea(snapshot)
    try:
        holder = job_namespace(SimpleNamespace(sandbox="auto"), area, 1 << 24, SimpleNamespace(warnings=[]))
        try:
            saved = area.live(area.staging) / "checkpoint.pt"
            saved.write_bytes(b"A" * 8192)
            watch = StagedWatch(area, 1 << 20)
            watch.poll(), watch.poll()
            assert watch._thread is None  # not still for STILL_S yet
            watch.seen_since -= StagedWatch.STILL_S
            watch.poll()
            watch.wait()
            assert watch.hashed is not None and watch.hashed[0] == area.staged_key("checkpoint.pt")
            saved.write_bytes(b"C" * 4096)  # an honest save: a new version, whatever its bytes
            assert not watch.changed_unseen()
            with open(saved, "r+b") as fh:
                mapped = mmap.mmap(fh.fileno(), 0)
            mapped[0:1] = b"B"  # the first write through the mapping may move the ctime; the next ones do not
            watch.seen, watch.hashed = None, None
            watch.poll()
            watch.seen_since -= StagedWatch.STILL_S
            watch.poll()
            watch.wait()
            assert watch.hashed is not None and not watch.changed_unseen()
            mapped[1:2] = b"B"  # training on after the save, unrecorded
            mapped.close()
            assert area.staged_key("checkpoint.pt") == watch.hashed[0] and watch.changed_unseen()

            refused = StagedWatch(area, 1 << 20)  # the file kept from the launcher's reads while the job ran

            def kept(*_args):
                raise PermissionError(errno.EACCES, "Permission denied")

            monkeypatch.setattr(area, "staged_digest", kept)
            refused.poll()
            refused.seen_since -= StagedWatch.STILL_S
            refused.poll()
            refused.wait()
            monkeypatch.undo()
            assert refused.refused == "checkpoint.pt: Permission denied" and refused.changed_unseen()
        finally:
            holder.close()
    finally:
        assert area.cleanup()
