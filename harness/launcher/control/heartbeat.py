"""Each node's launcher says it is alive every second in the run's nodes/ folder; a node that stops saying so
is lost in seconds, not after the collective timeout (300 s at Paris).

Runs in every node's launcher (a thread), from the training phase until node 0 has the other nodes'
accounts. A node that vanishes without a word (power, network, a kernel panic) leaves its peers' ranks
waiting inside a collective until its timeout, and the run would then read as the team's crash. Here
node 0 sees the node's beat stop, ends the job, and the run is `aborted` (the infrastructure's failure,
run again) when the node also gives no account of its own (harness/launcher/run/nodes.py). A node R > 0
that stops hearing node 0 ends its own ranks the same way.

The beats are files on the shared file system that holds the run, written by the launchers alone: no
rank can reach the runs tree, so no team can freeze, fake or delete a node's beat (its own, for a free
re-run, or another team's, through a rendezvous store that takes writes from anyone on the network).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

INTERVAL_S = 1.0
# A node is lost only after this many successful reads of its beat, all since its last change: one read
# can be stale (an NFS client's attribute cache), and a read that fails says nothing.
FRESH_READS = 3


def lost_after_s(collective_timeout_s: float) -> float:
    """Silence that makes a node lost: well inside the collective timeout, so the heartbeat, not a
    collective's error, ends the job; 10 s at most (a launcher is never that late on a healthy node)."""
    return max(2.0 * INTERVAL_S, min(10.0, collective_timeout_s / 2.0))


def silent_after_s(track) -> float:
    """The longest node 0 waits for a node's account while that node's launcher still beats: the node's
    own verdict on node 0 (lost_after_s), its ranks' teardown (shutdown_timeout_s), and slack."""
    return lost_after_s(track.collective_timeout_s) + track.shutdown_timeout_s + 15.0


def _write_beat(path: Path, text: str) -> None:
    """A beat: a temporary file renamed over the last one. No fsync: the rename alone makes it visible to the
    other nodes, a beat need not survive a crash, and an fsync behind a busy disk would make a live node late."""
    from harness.results.records import atomic_path

    with atomic_path(path) as (fd, _):
        with os.fdopen(fd, "w") as fh:
            fh.write(text)


class NodeHeartbeat:
    """Two threads: one writes this node's beat, one reads the others'. Each can stall on the shared file
    system without stopping the other. A peer's silence counts only over time in which this node's own
    writes and reads went through: a write or a read pass that took more than half of lost_after is a stall
    of the file system, and silence is counted again from its end (right after a stall every beat is old
    until read again); a write under way for that long withholds every verdict."""

    def __init__(self, run_dir: Path, node_rank: int, nnodes: int, lost_after: float,
                 interval_s: float = INTERVAL_S, clock=time.monotonic, fresh_reads: int = FRESH_READS):
        self.folder = Path(run_dir) / "nodes"
        self.node_rank, self.nnodes, self.lost_after, self.interval_s, self.clock = \
            node_rank, nnodes, lost_after, interval_s, clock
        self.fresh_reads = fresh_reads
        self.stall_s = lost_after / 2.0  # a write or read pass longer than this is a stall of the file system
        self._beats = 0
        self._done_flag = False
        self._seen: dict[int, int] = {}
        self._changed_s: dict[int, float] = {}  # when each node's beat last moved (nodes heard at least once)
        self._reads_since: dict[int, int] = {}  # successful reads of each node since its beat last moved
        self._passes = 0  # read passes completed since this heartbeat started
        self._last_pass_s: float | None = None  # when the reader last completed a pass over every node
        self._writing_since: float | None = None  # a write of this node's beat under way since then
        self._healthy_since_s = clock()  # the end of this node's last stall (its start, before any)
        self.longest_write_s = 0.0  # this node's slowest beat write: in its account, for node 0's verdict
        self._done: set[int] = set()  # nodes whose launchers ended their training phase and said so
        self._started_s = clock()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="harness-heartbeat-write", daemon=True)
        self._reader = threading.Thread(target=self._read_loop, name="harness-heartbeat-read", daemon=True)

    def start(self) -> "NodeHeartbeat":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._writer.start()
        self._reader.start()
        return self

    def stop(self) -> None:
        """Say this node is done and stop; never waits long on a stalled file system (the writer says it,
        within its join; a writer stalled in a write is left behind: a daemon thread)."""
        self._done_flag = True
        self._stop.set()
        if self._writer.ident is None:
            self._write()
        for thread in (self._writer, self._reader):
            if thread.ident is not None:
                thread.join(timeout=2 * self.interval_s + 1.0)

    def mark_done(self) -> None:
        """Say this node's training phase is over: its silence from now on is not a loss (the writer thread
        says it within an interval: the launcher's thread never waits on a write)."""
        self._done_flag = True
        if self._writer.ident is None:
            self._write()

    def summary(self) -> dict:
        """What a node's account carries of its heartbeat (harness/launcher/run/nodes.py reads it)."""
        return {"longest_write_s": round(self.longest_write_s, 3), "stall_s": self.stall_s}

    # ------------------------------------------------------------------ the threads

    def _path(self, rank: int) -> Path:
        return self.folder / f"alive-node{rank}.json"

    def _write(self) -> None:
        with self._write_lock:
            with self._lock:
                self._beats += 1
                beat = {"beat": self._beats, "done": self._done_flag}
                self._writing_since = began = self.clock()
            try:
                _write_beat(self._path(self.node_rank), json.dumps(beat))
            except OSError:
                pass  # the shared file system did not take it: the next beat tries again
            with self._lock:
                now = self.clock()
                self._writing_since = None
                self.longest_write_s = max(self.longest_write_s, now - began)
                if now - began > self.stall_s:
                    self._healthy_since_s = now  # what was read meanwhile proves nothing

    def _read(self) -> None:
        began = self.clock()
        seen = {}
        for r in range(self.nnodes):
            if r == self.node_rank:
                continue
            try:
                beat = json.loads(self._path(r).read_text())
                seen[r] = (int(beat["beat"]), bool(beat.get("done")))
            except (OSError, ValueError, KeyError, TypeError):
                seen[r] = None  # not there yet, caught mid-replace, or the file system refused: says nothing
        now = self.clock()  # after the reads: a pass that stalled is dated by its end
        with self._lock:
            for r, got in seen.items():
                if got is None:
                    continue
                if got[0] != self._seen.get(r):
                    self._seen[r], self._changed_s[r], self._reads_since[r] = got[0], now, 0
                else:
                    self._reads_since[r] = self._reads_since.get(r, 0) + 1
                if got[1]:
                    self._done.add(r)
            self._passes += 1
            self._last_pass_s = now
            if now - began > self.stall_s:
                self._healthy_since_s = now

    def _write_loop(self) -> None:
        while True:
            self._write()  # once more after stop(): the last beat says done
            if self._stop.wait(self.interval_s):
                self._write()
                return

    def _read_loop(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._stop.wait(self.interval_s)

    # ------------------------------------------------------------------ what the watchdog asks

    def _can_judge(self, now: float) -> bool:
        """This node's own reads are current and none of its writes is stalled now."""
        if self._last_pass_s is None or now - self._last_pass_s > self.interval_s + self.stall_s:
            return False
        return self._writing_since is None or now - self._writing_since <= self.stall_s

    def _quiet(self, r: int, now: float) -> bool:
        """Node r's beat has not moved for `lost_after` seconds of this node's own healthy reads and writes, as
        several successful reads since its last change say (a node never heard: every pass since the start)."""
        since = max(self._changed_s.get(r, self._started_s), self._healthy_since_s)
        reads = self._reads_since.get(r, 0) if r in self._changed_s else self._passes
        return now - since > self.lost_after and reads >= self.fresh_reads and self._can_judge(now)

    def silent(self, ranks) -> list[int]:
        """Of `ranks`, the nodes not heard for `lost_after` seconds (never heard: since this heartbeat started),
        by the reader thread's reads (never a read of this thread's own: it must not stall here)."""
        if self._reader.ident is None:  # not started (a test, a one-shot question): read once, here
            self._read()
        now = self.clock()
        with self._lock:
            return sorted(r for r in ranks if self._quiet(r, now))

    def lost_nodes(self) -> list[int]:
        """The nodes this one has stopped hearing while they trained. Node 0 watches every node it has heard
        at least once (one never heard is the rendezvous's to report); a node R > 0 watches node 0."""
        now = self.clock()
        with self._lock:
            watched = [r for r in self._changed_s if r != self.node_rank] if self.node_rank == 0 else [0]
            return sorted(r for r in watched if r in self._changed_s and r not in self._done and self._quiet(r, now))

    def lost_why(self) -> str | None:
        lost = self.lost_nodes()
        if not lost:
            return None
        return (f"node(s) {', '.join(map(str, lost))} lost: no heartbeat for {self.lost_after:.0f} s "
                f"over {self.fresh_reads} or more reads of it (the infrastructure's failure, not the team's: run it "
                "again)")
