"""Each node's launcher says it is alive every second in the run's nodes/ folder; a node that stops saying so
is lost in seconds, not after the collective timeout (300 s at Paris).

Runs in every node's launcher (a thread), from the training phase until node 0 has the other nodes'
accounts. A node that vanishes without a word (power, network, a kernel panic) leaves its peers' ranks
waiting inside a collective until its timeout, and the run would then read as the team's crash. Here
node 0 sees the node's beat stop, ends the job, and the run is `aborted` (the infrastructure's failure,
run again) when the node also gives no account of its own (harness/launcher/nodes.py). A node R > 0
that stops hearing node 0 ends its own ranks the same way.

The beats are files on the shared file system that holds the run, written by the launchers alone: no
rank can reach the runs tree, so no team can freeze, fake or delete a node's beat (its own, for a free
re-run, or another team's, through a rendezvous store that takes writes from anyone on the network).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

INTERVAL_S = 1.0


def lost_after_s(collective_timeout_s: float) -> float:
    """Silence that makes a node lost: well inside the collective timeout, so the heartbeat, not a
    collective's error, ends the job; 10 s at most (a launcher is never that late on a healthy node)."""
    return max(2.0 * INTERVAL_S, min(10.0, collective_timeout_s / 2.0))


def silent_after_s(track) -> float:
    """The longest node 0 waits for a node's account while that node's launcher still beats: the node's
    own verdict on node 0 (lost_after_s), its ranks' teardown (shutdown_timeout_s), and slack."""
    return lost_after_s(track.collective_timeout_s) + track.shutdown_timeout_s + 15.0


class NodeHeartbeat:
    def __init__(self, run_dir: Path, node_rank: int, nnodes: int, lost_after: float,
                 interval_s: float = INTERVAL_S, clock=time.monotonic):
        self.folder = Path(run_dir) / "nodes"
        self.node_rank, self.nnodes, self.lost_after, self.interval_s, self.clock = \
            node_rank, nnodes, lost_after, interval_s, clock
        self._beats = 0
        self._done_flag = False
        self._seen: dict[int, int] = {}
        self._changed_s: dict[int, float] = {}  # when each node's beat last moved (nodes heard at least once)
        self._done: set[int] = set()  # nodes whose launchers ended their training phase and said so
        self._started_s = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-heartbeat", daemon=True)

    def start(self) -> "NodeHeartbeat":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.mark_done()
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=2 * self.interval_s + 1.0)

    def mark_done(self) -> None:
        """Say this node's training phase is over: its silence from now on is not a loss."""
        self._done_flag = True
        self._write()

    # ------------------------------------------------------------------ the thread

    def _path(self, rank: int) -> Path:
        return self.folder / f"alive-node{rank}.json"

    def _write(self) -> None:
        from harness.results.records import write_atomic

        with self._lock:
            self._beats += 1
            beat = {"beat": self._beats, "done": self._done_flag}
        try:
            write_atomic(self._path(self.node_rank), json.dumps(beat))
        except OSError:
            pass  # the shared file system did not take it: the next beat tries again

    def _read(self) -> None:
        now = self.clock()
        for r in range(self.nnodes):
            if r == self.node_rank:
                continue
            try:
                beat = json.loads(self._path(r).read_text())
                count, done = int(beat["beat"]), bool(beat.get("done"))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            with self._lock:
                if count != self._seen.get(r):
                    self._seen[r], self._changed_s[r] = count, now
                if done:
                    self._done.add(r)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._write()
            self._read()
            self._stop.wait(self.interval_s)

    # ------------------------------------------------------------------ what the watchdog asks

    def silent(self, ranks) -> list[int]:
        """Of `ranks`, the nodes not heard for `lost_after` seconds (never heard: since this heartbeat started)."""
        self._read()
        now = self.clock()
        with self._lock:
            changed = dict(self._changed_s)
        return sorted(r for r in ranks if now - changed.get(r, self._started_s) > self.lost_after)

    def lost_nodes(self) -> list[int]:
        """The nodes this one has stopped hearing while they trained. Node 0 watches every node it has heard
        at least once (one never heard is the rendezvous's to report); a node R > 0 watches node 0."""
        now = self.clock()
        with self._lock:
            changed, done = dict(self._changed_s), set(self._done)
        watched = [r for r in changed if r != self.node_rank] if self.node_rank == 0 else [0]
        return sorted(r for r in watched if r in changed and r not in done and now - changed[r] > self.lost_after)

    def lost_why(self) -> str | None:
        lost = self.lost_nodes()
        if not lost:
            return None
        return (f"node(s) {', '.join(map(str, lost))} lost: no heartbeat for {self.lost_after:.0f} s "
                "(the infrastructure's failure, not the team's: run it again)")
