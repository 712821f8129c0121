"""The rendezvous store of a job on several nodes, in a process of its own on node 0.

    python -m harness.launcher.control.store_server PORT WORLD_SIZE TIMEOUT_S LAUNCHER_PID

torch's static rendezvous needs one TCPStore that every node's agent and every rank can reach; it
would live in node 0's launcher, where whatever a rank (or any host of the network: the store has no
authentication) writes into it would fill the launcher's memory. Here it is the only thing this
process does: it holds plain keys and nothing in it is ever unpickled, it is the first process the
kernel kills when memory runs out (oom_score_adj 1000), and it dies with its launcher. Started by
harness/launcher/control/elastic.py (ElasticJob) before the agent, ended with the job.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from datetime import timedelta


def main(argv: list[str]) -> None:
    port, world, timeout_s, launcher = int(argv[1]), int(argv[2]), float(argv[3]), int(argv[4])
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != launcher:
        sys.exit(1)
    try:
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write("1000")
    except OSError:
        pass
    from torch.distributed import TCPStore

    store = TCPStore("0.0.0.0", port, world, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    print(f"ready {store.port}", flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    main(sys.argv)
