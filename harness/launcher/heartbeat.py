"""Each node's launcher says it is alive every second through the job's rendezvous store; a node that
stops saying so is lost in seconds, not after the collective timeout (300 s at Paris).

Runs in every node's launcher (a thread), for the training phase of a job on several nodes. A node
that vanishes without a word (power, network, a kernel panic) leaves its peers' ranks waiting inside
a collective until its timeout, and the run would then read as the team's crash. Here node 0 sees
the node's counter stop, ends the job `aborted` (the infrastructure's failure, run again), and the
record says which node; a node R > 0 that stops hearing node 0 ends its own ranks the same way.

What a team could do with it: the store takes writes from anyone on the network, so a rank could add
to a counter (it only hides a loss, which then ends as the collective timeout: its own loss) or flood
the store to silence a healthy node. A node is therefore only charged to the infrastructure when it
also gives no account of its own afterwards (harness/launcher/nodes.py): a healthy launcher always
writes one, and a run whose heartbeat stopped on a node that answered is the team's, with the reason.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

PREFIX = "harness-heartbeat"
INTERVAL_S = 1.0


def lost_after_s(collective_timeout_s: float) -> float:
    """Silence that makes a node lost: well inside the collective timeout, so the heartbeat, not a
    collective's error, ends the job; 10 s at most (a launcher is never that late on a healthy node)."""
    return max(2.0 * INTERVAL_S, min(10.0, collective_timeout_s / 2.0))


class NodeHeartbeat:
    def __init__(self, host: str, port: int, node_rank: int, nnodes: int, lost_after: float,
                 interval_s: float = INTERVAL_S, clock=time.monotonic):
        self.host, self.port, self.node_rank, self.nnodes = host, port, node_rank, nnodes
        self.lost_after, self.interval_s, self.clock = lost_after, interval_s, clock
        self._counts: dict[int, int] = {}
        self._changed_s: dict[int, float] = {}  # when each node's counter last moved (nodes seen at least once)
        self._done: set[int] = set()  # nodes whose launchers ended their training phase and said so
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-heartbeat", daemon=True)
        self._store = None

    def start(self) -> "NodeHeartbeat":
        self._thread.start()
        return self

    def stop(self) -> None:
        """This node's training phase is over: said to the others first, so they do not take the silence
        that follows for a loss."""
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1.0)
        try:
            if self._store is not None:
                self._store.set(f"{PREFIX}/{self.node_rank}/done", "1")
        except Exception:  # noqa: BLE001  (the store gone: the others see the job end anyway)
            pass

    # ------------------------------------------------------------------ the thread

    def _connect(self):
        from torch.distributed import TCPStore

        return TCPStore(self.host, self.port, None, False, timedelta(seconds=max(1.0, 2 * self.interval_s)),
                        wait_for_workers=False)

    def _beat(self) -> None:
        if self._store is None:
            self._store = self._connect()
        self._store.add(f"{PREFIX}/{self.node_rank}", 1)
        now = self.clock()
        for r in range(self.nnodes):
            if r == self.node_rank:
                continue
            count = int(self._store.add(f"{PREFIX}/{r}", 0))
            if count and count != self._counts.get(r):
                self._counts[r], self._changed_s[r] = count, now
            if self._store.check([f"{PREFIX}/{r}/done"]):
                self._done.add(r)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._beat()
            except Exception:  # noqa: BLE001  (a store that does not answer: reconnect on the next beat)
                self._store = None
            self._stop.wait(self.interval_s)

    # ------------------------------------------------------------------ what the watchdog asks

    def lost_nodes(self) -> list[int]:
        """The nodes this one has stopped hearing for `lost_after` seconds. Node 0 watches every node it has
        heard at least once (one never heard is the rendezvous's to report); a node R > 0 watches node 0,
        whose counter stops as well when its store stops answering."""
        now = self.clock()
        if self.node_rank == 0:
            return sorted(r for r, t in self._changed_s.items()
                          if r not in self._done and now - t > self.lost_after)
        last_zero = self._changed_s.get(0)  # node 0's counter moves only while its store answers too
        if last_zero is None or 0 in self._done:
            return []
        return [0] if now - last_zero > self.lost_after else []

    def lost_why(self) -> str | None:
        lost = self.lost_nodes()
        if not lost:
            return None
        return (f"node(s) {', '.join(map(str, lost))} lost: no heartbeat for {self.lost_after:.0f} s "
                "(the infrastructure's failure, not the team's: run it again)")
