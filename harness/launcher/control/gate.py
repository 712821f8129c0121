"""The gate between a training job's start-up and the check of its submission, which run side by side.

The check (a sandboxed process that imports the submission and runs its model once) and the ranks' own start-up
(torch elastic's rendezvous, importing torch and the harness) each take seconds, most of them one core's: side by
side they take about as long as the longer. The ranks go as far as harness code goes, then wait for the word
(harness/ranks/training/loop.py `await_check`) before they touch a device or the submission; the launcher says `go` once
the check passed, `stop` otherwise, and the job ends with no team code run in it.

The check process starts before the ranks and runs team code only once every rank of this node has said hello on
the control channel (harness/launcher/run/check_process.py holds it until then): a connection claiming a rank
already bound is refused, so nothing the check's code starts can take a rank's place and hear its word.
While the gate is shut, the job's start-up deadline does not run (the check has its own); it runs from the word.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class StartGate:
    """Shared by the thread that runs the job (run_training attaches its channel) and the one that runs the check."""

    def __init__(self) -> None:
        self._channel = None
        self._attached = threading.Event()
        self.opened_s: float | None = None  # time.monotonic() of `go`: the job's start-up deadline runs from it
        self.verdict: str | None = None  # "go", "stop"
        self.checking = False  # every rank bound, the check started (check_phase.py)
        self.ended = threading.Event()  # the job ended (by itself, or killed on an abort) before or after the word
        self._said = threading.Event()
        self._body: dict = {}
        self._lock = threading.Lock()
        self._release: Callable[[], None] | None = None  # undoes the job's changes to this process's environment

    def attach(self, channel) -> None:
        with self._lock:
            self._channel = channel
            self._attached.set()
            if self.verdict is not None:  # decided before the job's channel was up: said now
                channel.tell(self.verdict, **self._body)

    def spawned(self, release: Callable[[], None]) -> None:
        """The job's agent started (elastic.py): `release` gives this process its environment back once the ranks
        exist (they took theirs at their start), before the check reads it."""
        self._release = release

    def wait_bound(self, ranks: set[int], timeout_s: float, job_alive: Callable[[], bool]) -> bool:
        """Until every rank in `ranks` is bound to its connection (True), or the job ended or the time passed. On
        True, this process's environment is its own again (the ranks have theirs): the check reads it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and job_alive() and not self.ended.is_set():
            if self._attached.is_set() and ranks <= self._channel.bound_ranks():
                if self._release is not None:
                    self._release()
                self.checking = True  # from here the check runs: no kill but a stop may end the job before the word
                return True
            time.sleep(0.01)
        return False

    def wait_verdict(self) -> None:
        """Until the word is said: the job's teardown, which ends every process that appeared since it began, comes
        after the check's end (the check's tree is its own scope's, never the job's: process_tree.ProcessScope.own)."""
        self._said.wait()

    def go(self) -> None:
        self._say("go")

    def stop(self, why: str) -> None:
        self._say("stop", why=why)

    @property
    def why(self) -> str:
        """Why the job was told stop ("" before a word, or after `go`): the reason of the kill that ends it."""
        return str(self._body.get("why") or "") if self.verdict == "stop" else ""

    def _say(self, verdict: str, **body) -> None:
        with self._lock:
            if self.verdict is not None:
                return
            self.verdict, self._body = verdict, body
            try:
                if verdict == "go":
                    self.opened_s = time.monotonic()
                if self._attached.is_set():
                    self._channel.tell(verdict, **body)
            finally:
                self._said.set()  # the job's teardown waits for this, whatever happens above

    @property
    def shut(self) -> bool:
        """No go yet: the job's start-up deadline waits (a stop ends the job, which the launcher waits for)."""
        return self.opened_s is None
