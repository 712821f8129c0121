"""Starting ranks with torch.distributed's own elastic launcher, in the launcher process.

The agent is torchrun's: the arguments are parsed by torch.distributed.run itself, so
RANK/LOCAL_RANK/WORLD_SIZE behave exactly as under torchrun. Several nodes: node R's rank travels in
--rdzv-conf to our static rendezvous (node 0 hosts global rank 0); torchrun's own --node-rank is read
by its static backend alone.

The rendezvous keeps no pickled state, and nothing of the launcher listens for the ranks.
torchrun's own `--standalone` uses the c10d rendezvous, whose state is a pickle in a TCPStore that
the agent (a thread of this process) loads about once a second; the ranks can reach that store
(they have TCP and its address), so a rank could run code in the launcher, or fill its memory.
So (both registered here, through torch's own registry):
- one node: `harness-local`, torch's static rendezvous on an in-memory store of the agent's (no
  socket at all); the ranks' process group gets a store of its own, hosted by rank 0 on a free port
  (`use_agent_store` False: TORCHELASTIC_USE_AGENT_STORE=False, as torch documents);
- several nodes: `harness-static`, torch's static rendezvous, whose TCPStore (which the other
  nodes' agents and every rank must reach) runs in a process of its own on node 0
  (harness/launcher/control/store_server.py), not in the launcher: whatever a rank or a host writes into it
  costs that process's memory, never the launcher's, and nothing in it is unpickled.
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

from harness.launcher.control import process_tree
from harness.launcher.control.job_limits import Caps
from harness.launcher.control.team_files import read_tail
from harness.launcher.control.workarea import patched_environ
from harness.ranks import interpreter
from harness.ranks.process import reap_children


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
    caps: Caps | None = None  # the memory and tasks the job's processes may hold together (job_limits.py)

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError("nproc_per_node and nnodes must be >= 1")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ValueError("several nodes need --rdzv-endpoint HOST:PORT (node 0's address)")

    def torchrun_argv(self) -> list[str]:
        # --redirects=3: what a rank prints before it opens its own log (an import that fails) goes to a
        # file of the job's (ElasticJob.early_output), not to the launcher's terminal.
        argv = [f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}", "--max-restarts=0",
                "--monitor-interval=0.1", "--redirects=3"]
        register_rendezvous()
        if self.nnodes > 1:
            # The node's rank travels in --rdzv-conf, which our rendezvous reads; torchrun's own --node-rank is
            # read by its static backend alone, and warned about in every node's log otherwise.
            argv += [f"--rdzv-backend={NODES_RENDEZVOUS}", f"--rdzv-endpoint={self.rdzv_endpoint}",
                     f"--rdzv-id={self.rdzv_id or 'harness'}",
                     f"--rdzv-conf=timeout={int(self.rendezvous_timeout_s)},rank={self.node_rank}"]
        else:  # one node: an in-memory store, no socket, no pickled state (module docstring)
            argv += [f"--rdzv-backend={LOCAL_RENDEZVOUS}", "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={uuid.uuid4()}"]
        # `--no-python` with this interpreter as the program: torchrun's own `--module` would run
        # $PYTHON_EXEC (when set) with the working folder first on the ranks' path (interpreter.py).
        return argv + ["--no-python", *interpreter.python_argv(self.module, *self.args)]


LOCAL_RENDEZVOUS = "harness-local"
NODES_RENDEZVOUS = "harness-static"


def free_port() -> int:
    """A port nobody listens on now (rank 0's process-group store binds it moments later, as torchrun's
    own choice of MASTER_PORT does)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def register_rendezvous() -> None:
    """The two rendezvous of the module docstring, registered once per process in torch's registry."""
    from torch.distributed import HashStore, PrefixStore, TCPStore
    from torch.distributed.elastic.rendezvous import (RendezvousInfo, RendezvousStoreInfo,
                                                      rendezvous_handler_registry)
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    if _registered:
        return

    class LocalRendezvous(StaticTCPRendezvous):
        """One node: the agent's store is a HashStore in its own memory; the ranks get rank 0's."""

        def get_backend(self) -> str:
            return LOCAL_RENDEZVOUS

        @property
        def use_agent_store(self) -> bool:
            return False

        def next_rendezvous(self) -> RendezvousInfo:
            if not self._store:
                self._store = HashStore()
                self.master_port = free_port()
            return RendezvousInfo(self._store, 0, 1, RendezvousStoreInfo("127.0.0.1", self.master_port))

    class NodesRendezvous(StaticTCPRendezvous):
        """Several nodes: every agent, node 0's too, is a client of the store process node 0 runs."""

        def get_backend(self) -> str:
            return NODES_RENDEZVOUS

        def next_rendezvous(self) -> RendezvousInfo:
            if not self._store:
                self._store = TCPStore(self.master_addr, self.master_port, self.world_size, False, self.timeout,
                                       wait_for_workers=False)
            return RendezvousInfo(PrefixStore(self.run_id, self._store), self.rank, self.world_size,
                                  RendezvousStoreInfo(self.master_addr, self.master_port))

    def create_local(params) -> LocalRendezvous:
        return LocalRendezvous("127.0.0.1", 0, 0, 1, params.run_id, int(params.config.get("timeout", 300)))

    def create_nodes(params) -> NodesRendezvous:
        addr, port = parse_rendezvous_endpoint(params.endpoint, -1)
        return NodesRendezvous(addr, port, int(params.config["rank"]), params.max_nodes, params.run_id,
                               int(params.config.get("timeout", 300)))

    rendezvous_handler_registry.register(LOCAL_RENDEZVOUS, create_local)
    rendezvous_handler_registry.register(NODES_RENDEZVOUS, create_nodes)
    _registered.append(True)


_registered: list = []


# torch elastic installs its SIGTERM/SIGINT handlers only from the main thread; its agent runs in the
# launcher's "harness-agent" thread, so every launcher.log opened with a warning that workers "could be
# orphaned". They cannot: the launcher's main thread owns those signals (watch.abort_on_signals), ends
# the job's whole process tree (process_tree.ProcessScope), and every rank dies with the launcher
# (process.die_with_launcher, PR_SET_PDEATHSIG). The warning is dropped, not the handlers' failures.
NOT_ON_MAIN_THREAD = "Failed to register signal handlers since torchelastic is running on a child thread"


def _not_the_agent_thread_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(NOT_ON_MAIN_THREAD)


def _route_torch_logs(log_path: Path) -> logging.Handler:
    """torch elastic's own messages go to the launcher log, not over the progress line."""
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.addFilter(_not_the_agent_thread_warning)
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
        self._scope = process_tree.ProcessScope(spec.shutdown_timeout_s, contain="job", caps=spec.caps)
        self._thread = threading.Thread(target=self._run, name="harness-agent", daemon=True)
        self._handler: logging.Handler | None = None
        self._env = None
        self._store_proc = None  # node 0 of several: the rendezvous store's process
        self.early_output: dict[int, str] = {}  # local rank -> the end of what it printed before its own log

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
        from harness.ranks.confine.sandbox import allowed_environment

        self._handler = _route_torch_logs(self.log_path)
        # torch elastic gives each rank a copy of this process's environment: for the job's life it holds
        # only what team code may see (sandbox.KEEP_ENV), then the job's own settings (a private TMPDIR).
        dropped = tuple(k for k in os.environ if k not in allowed_environment())
        self._env = patched_environ({"OMP_NUM_THREADS": str(self.spec.threads_per_rank), "TMPDIR": str(self._tmp),
                                     **interpreter.harness_path(), **self._scope.env(), **self.spec.env}, unset=dropped)
        self._env.__enter__()  # undone in close()
        tempfile.tempdir = str(self._tmp)  # the agent's own temporary folders, cleaned up by us
        if self.spec.nnodes > 1 and self.spec.node_rank == 0:
            why = self._start_store()
            if why:  # no agent at all: every node would wait its rendezvous timeout for a store that is not there
                self.error = RuntimeError(f"the rendezvous store did not start on node 0: {why}")
                return
        self._thread.start()

    def _start_store(self, ready_within_s: float = 60.0) -> str:
        """Node 0: the rendezvous store in a process of its own (harness/launcher/control/store_server.py); "" once it
        listens, else why not. It is the harness's, not the job's: left out of the job's process scope (the
        record never counts it among what a submission left running), ended in close()."""
        import subprocess

        from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

        _, port = parse_rendezvous_endpoint(self.spec.rdzv_endpoint, -1)
        self._store_proc = subprocess.Popen(
            interpreter.python_argv("harness.launcher.control.store_server", port, self.spec.nnodes,
                                   int(self.spec.rendezvous_timeout_s), os.getpid()),
            env=interpreter.child_environment(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
        self._scope.before.add(process_tree.identity(self._store_proc.pid))
        line = process_tree.first_line(self._store_proc, ready_within_s) or ""
        if line.startswith("ready"):
            return ""
        return line or (f"it exited ({self._store_proc.poll()})" if self._store_proc.poll() is not None
                        else f"not listening within {ready_within_s:.0f} s")

    def release_environment(self) -> None:
        """Gives this process its environment and temporary folder back: called once every rank has started (each
        took its copy then), so that the launcher's other thread, which checks the submission meanwhile, reads its
        own settings (the scratch folder, the protected paths), never the ranks'. Idempotent; close() calls it."""
        if self._env is not None:  # first: a gettempdir() between the two must not cache the job's TMPDIR
            self._env.__exit__(None, None, None)
            self._env = None
        tempfile.tempdir = None

    def running(self) -> bool:
        return self._thread.is_alive()

    def containment(self) -> dict:
        """Whether the job's processes were held in a cgroup of their own (job_cgroup.py), or why not."""
        return self._scope.containment()

    def wait(self, timeout_s: float) -> bool:
        if self._thread.ident is None:  # never started (node 0's rendezvous store did not start): nothing to wait for
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def kill(self) -> list[int]:
        """End every process the job started (ranks and anything they spawned)."""
        return self._scope.close()

    def _read_early_output(self) -> dict[int, str]:
        """torch elastic's per-rank files (<tmp>/torchelastic_*/<run>/attempt_0/<local rank>/std{out,err}.log)."""
        out: dict[int, str] = {}
        for err in sorted(self._tmp.glob("torchelastic_*/*/attempt_*/*/stderr.log")):
            if err.parent.name.isdigit():
                both = read_tail(err.with_name("stdout.log"), 16 << 10) + read_tail(err, 48 << 10)
                out[int(err.parent.name)] = both
        return out

    def close(self, wait_s: float = 10.0) -> list[int]:
        """After the job: nothing of it may stay alive; returns pids that had to be killed."""
        self.wait(wait_s)
        leftover = self._scope.close()
        if self._store_proc is not None:  # the harness's own: ended here, not counted as the job's
            self._store_proc.kill()
            self._store_proc.wait()
            self._store_proc.stdout.close()
        reap_children()
        self.release_environment()
        self.early_output = self._read_early_output()
        shutil.rmtree(self._tmp, ignore_errors=True)
        if self._handler is not None:
            for name in ("torch.distributed", "torch.distributed.elastic"):
                logging.getLogger(name).removeHandler(self._handler)
            self._handler.close()
        return leftover
