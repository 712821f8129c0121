"""Starting ranks with torch.distributed's own elastic launcher, in the launcher process.

The agent is torchrun's: the arguments are parsed by torch.distributed.run itself, so
RANK/LOCAL_RANK/WORLD_SIZE and the static rendezvous with --node-rank (several nodes: node 0
hosts global rank 0) behave exactly as under torchrun.

The rendezvous keeps no pickled state. torchrun's own `--standalone` uses the c10d rendezvous,
whose state is a pickle in a TCPStore that the agent (a thread of this process) loads about once
a second; the ranks can reach that store (they have TCP and its address), so a rank could run
code in the launcher. One node therefore uses `harness-local` (registered here): torch's static
rendezvous on a TCPStore of a free loopback port, which holds only plain keys the agent reads as
numbers and JSON. Several nodes use torch's `static` backend, which is the same.
The agent runs in a background thread; the launcher's main thread keeps the signals, the
clock and the kill switch, so a hung or hostile job is ended on the launcher's terms.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from harness.launcher import process_tree
from harness.launcher.workarea import patched_environ


@dataclass(kw_only=True)
class LaunchSpec:
    module: str  # python -m <module> <args...> in each rank
    args: list[str]
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str = ""  # HOST:PORT of node 0; needed when nnodes > 1
    rdzv_id: str = ""
    rendezvous_timeout_s: float = 300.0
    shutdown_timeout_s: float = 5.0
    threads_per_rank: int = 1
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError("nproc_per_node and nnodes must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("several nodes need --rdzv-endpoint HOST:PORT (node 0's address)")

    def torchrun_argv(self) -> list[str]:
        argv = [f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}", "--max-restarts=0",
                "--monitor-interval=0.1"]
        if self.nnodes > 1:
            argv += ["--rdzv-backend=static", f"--rdzv-endpoint={self.rdzv_endpoint}",
                     f"--node-rank={self.node_rank}", f"--rdzv-id={self.rdzv_id or 'harness'}",
                     f"--rdzv-conf=timeout={int(self.rendezvous_timeout_s)}"]
        else:  # one node: a static store on a free loopback port, no pickled state (module docstring)
            register_local_rendezvous()
            argv += [f"--rdzv-backend={LOCAL_RENDEZVOUS}", "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={uuid.uuid4()}"]
        return argv + ["--module", self.module, *self.args]


LOCAL_RENDEZVOUS = "harness-local"


def register_local_rendezvous() -> None:
    """torch's static TCP rendezvous for one node, on a port the kernel picks (no race for a port chosen
    beforehand, as --standalone has none). Registered once per process, through torch's own registry."""
    from torch.distributed import PrefixStore, TCPStore
    from torch.distributed.elastic.rendezvous import (RendezvousInfo, RendezvousStoreInfo,
                                                      rendezvous_handler_registry)
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    if _registered:
        return

    class LocalStaticRendezvous(StaticTCPRendezvous):
        def get_backend(self) -> str:
            return LOCAL_RENDEZVOUS

        def next_rendezvous(self) -> RendezvousInfo:
            if not self._store:
                self._store = TCPStore("127.0.0.1", 0, 1, True, self.timeout, multi_tenant=False)
                self.master_port = self._store.port
            return RendezvousInfo(PrefixStore(self.run_id, self._store), 0, 1,
                                  RendezvousStoreInfo("127.0.0.1", self.master_port))

    def create(params) -> LocalStaticRendezvous:
        timeout = int(params.config.get("timeout", 300))
        return LocalStaticRendezvous("127.0.0.1", 0, 0, 1, params.run_id, timeout)

    rendezvous_handler_registry.register(LOCAL_RENDEZVOUS, create)
    _registered.append(True)


_registered: list = []


def _route_torch_logs(log_path: Path) -> logging.Handler:
    """torch elastic's own messages go to the launcher log, not over the progress line."""
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("torch.distributed", "torch.distributed.elastic"):
        lg = logging.getLogger(name)
        lg.addHandler(handler)
        lg.propagate = False
        lg.setLevel(logging.INFO)
    return handler


class ElasticJob:
    """One torch elastic agent run in a thread, with a hard stop the launcher controls."""

    def __init__(self, spec: LaunchSpec, log_path: Path):
        self.spec = spec
        self.log_path = log_path
        self.failures: dict[int, dict] = {}
        self.error: BaseException | None = None
        self.succeeded = False
        self._tmp = Path(tempfile.mkdtemp(prefix="harness-job-"))  # torchelastic_* folders land here
        self._scope = process_tree.ProcessScope(spec.shutdown_timeout_s)
        self._thread = threading.Thread(target=self._run, name="harness-agent", daemon=True)
        self._handler: logging.Handler | None = None
        self._env = None

    def _run(self) -> None:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch
        from torch.distributed.run import config_from_args, parse_args

        try:
            config, cmd, cmd_args = config_from_args(parse_args(self.spec.torchrun_argv()))
            config.shutdown_timeout = int(max(1, self.spec.shutdown_timeout_s))
            elastic_launch(config, cmd)(*cmd_args)
            self.succeeded = True
        except ChildFailedError as exc:
            for rank, failure in exc.failures.items():
                self.failures[rank] = {"exitcode": failure.exitcode, "pid": failure.pid,
                                       "signal": failure.signal_name() if failure.exitcode < 0 else None}
        except BaseException as exc:  # rendezvous errors and the like: reported by the launcher
            self.error = exc

    def start(self) -> None:
        from harness.ranks.sandbox import allowed_environment

        self._handler = _route_torch_logs(self.log_path)
        # torch elastic gives each rank a copy of this process's environment: for the job's life it holds
        # only what team code may see (sandbox.KEEP_ENV), then the job's own settings (a private TMPDIR).
        dropped = tuple(k for k in os.environ if k not in allowed_environment())
        self._env = patched_environ({"OMP_NUM_THREADS": str(self.spec.threads_per_rank), "TMPDIR": str(self._tmp),
                                     **self.spec.env}, unset=dropped)
        self._env.__enter__()  # undone in close()
        tempfile.tempdir = str(self._tmp)  # the agent's own temporary folders, cleaned up by us
        self._thread.start()

    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def kill(self) -> list[int]:
        """End every process the job started (ranks and anything they spawned)."""
        return self._scope.close()

    def close(self, wait_s: float = 10.0) -> list[int]:
        """After the job: nothing of it may stay alive; returns pids that had to be killed."""
        self.wait(wait_s)
        leftover = self._scope.close()
        process_tree.reap_zombies()
        tempfile.tempdir = None
        if self._env is not None:
            self._env.__exit__(None, None, None)
            self._env = None
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._handler is not None:
            for name in ("torch.distributed", "torch.distributed.elastic"):
                logging.getLogger(name).removeHandler(self._handler)
            self._handler.close()
        return leftover
