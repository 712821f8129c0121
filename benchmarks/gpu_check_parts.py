"""benchmarks/gpu_check.py's parts: the sizes of each mode, the data, the submissions it writes, the track
it runs (dev-gpu, or a copy), what this host offers the sandbox, and the watch on the scorers. The checks
on what comes back are gpu_check_rows.py's.

Standard library only at import: gpu_check.py says which package the interpreter lacks before anything
imports one (numpy is imported where the data is made)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import threading
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBS = Path(__file__).resolve().parent / "gpu_check_subs"


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """What one mode runs: the GPU box's sizes (dev-gpu) or the CPU smoke's."""

    gpu: bool
    vocab: int
    shard_tokens: int  # each of 3 train shards; the validation shard holds 2 x val_tokens
    val_tokens: int  # every run's evaluation (`--val-tokens`): 8 batches of the track's 32 x 1,024 on a GPU
    big: dict  # the copy of the baseline: 124M-class on a GPU
    eager_budget_s: float  # its training budgets (the dev-gpu track's clock and stop rule)...
    compile_budget_s: float  # ...longer with COMPILE: Inductor compiles in the first step, on the clock
    big_steps: int  # ...or a few steps (the smoke counts steps: a CPU's speed must not decide it)
    small: dict  # the compiled-forward submission's CONFIG
    small_steps: int  # the compiled-forward and open-division runs: steps, on every mode
    open_args: dict  # the open-division script's [open.args]
    caps_s: dict = field(default_factory=dict)  # the longest each phase may take (gpu_check.py PHASES)


GPT_124M = {"n_layer": 12, "n_head": 12, "d_model": 768, "seq_len": 1024, "micro_batch_size": 16,
            "grad_accum_steps": 1, "learning_rate": 1e-3, "weight_decay": 0.1}
GPU = Sizes(gpu=True, vocab=32000, shard_tokens=20_000_000, val_tokens=262_144, big=GPT_124M,
            eager_budget_s=30.0, compile_budget_s=75.0, big_steps=0,
            small={"n_layer": 2, "n_head": 4, "d_model": 256, "seq_len": 1024, "micro_batch_size": 8,
                   "learning_rate": 3e-3, "compile_backend": "inductor"}, small_steps=20,
            open_args={"n_layer": 2, "n_head": 4, "n_embd": 256, "batch_size": 8, "num_workers": 2},
            caps_s={"run_eager": 180, "run_compile": 240, "eval": 90, "run_small": 150})
SMOKE = Sizes(gpu=False, vocab=256, shard_tokens=100_000, val_tokens=8_192,
              big={**GPT_124M, "n_layer": 2, "n_head": 2, "d_model": 64, "seq_len": 64, "micro_batch_size": 4},
              eager_budget_s=0.0, compile_budget_s=0.0, big_steps=3,
              small={"n_layer": 1, "n_head": 2, "d_model": 32, "seq_len": 64, "micro_batch_size": 4,
                     "learning_rate": 3e-3, "compile_backend": "eager"}, small_steps=3,
              open_args={"n_layer": 1, "n_head": 2, "n_embd": 32, "batch_size": 4, "num_workers": 2},
              caps_s={"run_eager": 300, "run_compile": 300, "eval": 180, "run_small": 300})

# The CPU smoke's track: dev-gpu's file with these keys changed (the same data layout, format, clock,
# allowances and evaluation), on 2 CPU ranks of one thread each with gloo.
SMOKE_TRACK = {"name": "gpu-check-cpu", "description": "scripts/gpu-check --cpu-smoke: dev-gpu on 2 CPU ranks, tiny",
               "nproc_per_node": 2, "cpu_threads_per_rank": 1, "backend": "gloo", "device": "cpu", "dtype": "auto",
               "device_peak": "", "comm_probe_steps": 2, "log_cap_mib": 16, "scratch_cap_gib": 2,
               "checkpoint_cap_gib": 1, "budget_s": 120.0, "grace_s": 60.0, "collective_timeout_s": 60.0,
               "data": {"vocab_size": SMOKE.vocab, "val_tokens": SMOKE.val_tokens},
               "eval": {"seq_len": 64, "batch_size": 16, "timeout_s": 120.0}}


# --------------------------------------------------------------------------- data, track, submissions


def make_data(folder: Path, sizes: Sizes) -> None:
    """A learnable token set in the event's format (raw uint16 shards laid out as dev-gpu expects:
    chunk_0001.bin ... and chunk_0049.bin for validation): an order-1 source with 4 successors per
    token, entropy ln 4 = 1.386 nats."""
    import numpy as np

    rng = np.random.default_rng(0)
    table = rng.integers(0, sizes.vocab, size=(sizes.vocab, 4), dtype=np.int64)

    def chain(n: int, chains: int = 512) -> np.ndarray:
        length = -(-n // chains)
        out = np.empty((chains, length), dtype=np.uint16)
        cur = rng.integers(0, sizes.vocab, size=chains)
        for t in range(length):
            out[:, t] = cur
            cur = table[cur, rng.integers(0, 4, size=chains)]
        return out.ravel()[:n]

    folder.mkdir(parents=True, exist_ok=True)
    for i in (1, 2, 3):
        chain(sizes.shard_tokens).astype("<u2").tofile(folder / f"chunk_{i:04d}.bin")
    chain(2 * sizes.val_tokens).astype("<u2").tofile(folder / "chunk_0049.bin")


def track_copy(folder: Path, changes: dict) -> Path:
    """harness/tracks/dev-gpu.toml with `changes` over it (a key's table merged one level deep), written as
    <name>.toml in `folder`."""
    table = tomllib.loads((ROOT / "harness" / "tracks" / "dev-gpu.toml").read_text())
    for key, value in changes.items():
        if isinstance(value, dict):
            table[key] = {**table.get(key, {}), **value}
        else:
            table[key] = value
    lines = [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    for name, sub in ((k, v) for k, v in table.items() if isinstance(v, dict)):
        assert not any(isinstance(v, dict) for v in sub.values()), f"[{name}]: one level of tables only"
        lines += ["", f"[{name}]", *(f"{k} = {json.dumps(v)}" for k, v in sub.items())]
    path = folder / f"{table['name']}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def the_track(folder: Path, sizes: Sizes, host: HostSandbox) -> tuple[str, str]:
    """(what `--track` gets, the track's name): dev-gpu itself on a GPU box whose kernel has Landlock; the
    smoke's CPU copy; and, where Landlock is missing, a copy with `sandbox = "off"` named so in every record
    (`-no-sandbox`). dev-gpu's own "auto" would also run there, but then each run and each model process
    would still try the namespaces and the filesystem confinement one by one on a kernel that refuses them
    (gVisor): off, those are not attempted at all, and every GPU path is measured without them."""
    changes = dict(SMOKE_TRACK) if not sizes.gpu else {}
    if host.landlock:
        name = changes.get("name", "dev-gpu") + "-no-sandbox"
        changes.update(name=name, sandbox="off", description=f"scripts/gpu-check on a host without Landlock "
                       f"({host.landlock}): {changes.get('description', 'dev-gpu')}, the sandbox off")
    if not changes:
        return "dev-gpu", "dev-gpu"
    return str(track_copy(folder, changes)), changes["name"]


# --------------------------------------------------------------------------- the host's sandbox


@dataclass(frozen=True, kw_only=True)
class HostSandbox:
    """What this machine offers the sandbox, found before any run: "" where available, else why not."""

    landlock: str = ""
    landlock_abi: int | None = None
    userns: str = ""  # the user namespaces of the job's own (harness/launcher/control/job_namespace.py)

    def to_dict(self) -> dict:
        return {"landlock": self.landlock or "available", "landlock_abi": self.landlock_abi,
                "user_namespaces": self.userns or "available"}


def landlock_missing() -> tuple[str, int | None]:
    """(why Landlock cannot confine a process here, "" when it can; its ABI): the tests harness/ranks/confine/sandbox.py
    `apply` makes before it adds a rule, without applying any to this process."""
    if not sys.platform.startswith("linux"):
        return f"Landlock is Linux-only; this is {sys.platform}", None
    try:
        from py_landlock import get_abi_version
    except ImportError:
        return "the py-landlock package is not installed", None
    try:
        abi = int(get_abi_version())
    except Exception as exc:  # not compiled in, disabled at boot, or a kernel that has no such call (gVisor)
        return f"not available on this kernel, {platform.release()} ({type(exc).__name__}: {exc})", None
    if abi < 1:
        return f"not available on this kernel, {platform.release()} (ABI {abi})", None
    return "", abi


def userns_missing() -> str:
    """Why the training job cannot have namespaces of its own here, "" when it can: made for real, as `harness
    doctor` does (harness/launcher/doctor/host.py namespaces_check)."""
    from harness.launcher.control.job_namespace import JobNamespace

    holder = JobNamespace(writable="")
    try:
        return "" if holder.active else holder.why
    finally:
        holder.close()


def host_sandbox() -> HostSandbox:
    landlock, abi = landlock_missing()
    return HostSandbox(landlock=landlock, landlock_abi=abi, userns=userns_missing())


def _set_team(folder: Path, team: str) -> None:
    (folder / "submission.toml").write_text(f'[team]\nname = "{team}"\n')


def _set_config(path: Path, config: dict, after: str = "") -> str:
    """The file's `CONFIG = {...}` (a dict with no nested braces) replaced by `config`, then `after`."""
    text = path.read_text()
    start = text.index("CONFIG = {")
    end = text.index("}", start) + 1
    return text[:start] + f"CONFIG = {json.dumps(config)}\n{after}" + text[end:]


def big_submission(folder: Path, sizes: Sizes, compiled: bool, team: str) -> Path:
    """submissions/baseline at the mode's size, COMPILE off or on. In the CPU smoke the compiled one is
    get_model's own torch.compile on dynamo's eager backend: Inductor's C++ compile of COMPILE = True
    takes 30 s on 2 cores, half the smoke; the harness unwraps and records both kinds alike."""
    shutil.copytree(ROOT / "submissions" / "baseline", folder)
    text = _set_config(folder / "submission.py", sizes.big, f"COMPILE = {compiled and sizes.gpu}\n")
    if compiled and not sizes.gpu:
        text += ("\n\nimport torch  # noqa: E402\n\n_plain_model = get_model\n\n\n"
                 "def get_model(config):  # noqa: F811\n"
                 "    return torch.compile(_plain_model(config), backend=\"eager\")\n")
    (folder / "submission.py").write_text(text)
    _set_team(folder, team)
    return folder


def compiled_forward_submission(folder: Path, sizes: Sizes, team: str) -> Path:
    shutil.copytree(SUBS / "compiled_forward", folder)
    (folder / "submission.py").write_text(_set_config(folder / "submission.py", sizes.small))
    _set_team(folder, team)
    return folder


def open_submission(folder: Path, sizes: Sizes, team: str) -> Path:
    """The open-division DataLoader script beside submissions/open_example's model.py."""
    shutil.copytree(SUBS / "open_dataloader", folder)
    shutil.copy(ROOT / "submissions" / "open_example" / "model.py", folder / "model.py")
    args = "\n".join(f"{k} = {json.dumps(v)}" for k, v in sizes.open_args.items())
    (folder / "submission.toml").write_text(f'division = "open"\n\n[team]\nname = "{team}"\n\n[open]\n'
                                            f'script = "train.py"\nmodel = "model.py"\n\n[open.args]\n{args}\n')
    return folder


def log_lines(run_dir: Path, pattern: str, tag: str) -> list[dict]:
    """The JSON after `tag` on each line of the run's logs matching `pattern` (the submissions' reports)."""
    found = []
    for log in sorted((run_dir / "logs").glob(pattern)):
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(tag + " "):
                found.append({"log": log.name, **json.loads(line[len(tag) + 1:])})
    return found


# --------------------------------------------------------------------------- the scorers, watched


DRIVER_ONLY = "libcuda mapped, no GPU opened"


class ScorerWatch:
    """Samples /proc while a harness command runs: each scorer process below it (python -m
    harness.scoring.scorer) and whether it ever opened a GPU: a descriptor or a mapping of /dev/nvidia*,
    which CUDA's initialisation opens and a context keeps. A scorer must never touch CUDA
    (harness/scoring/scorer.py): a GPU then holds one context, its model process's. The driver's library
    mapped without a device opened is said (DRIVER_ONLY), not failed: a library torch loads may link it
    (the first run on the lent H200 saw libcuda.so in every scorer's maps) without the driver ever being
    started."""

    def __init__(self, root_pid: int, interval_s: float = 0.2):
        self.root, self.interval_s = root_pid, interval_s
        self.scorers: dict[int, bool | None] = {}  # pid: CUDA seen (None: its maps could not be read)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScorerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for pid in _pids():
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:  # gone
                    continue
                if b"harness.scoring.scorer" not in cmdline or not _descends(pid, self.root):
                    continue
                try:
                    maps = Path(f"/proc/{pid}/maps").read_text()
                except OSError:  # not ours to read (not seen to be free of CUDA), or gone meanwhile
                    if Path(f"/proc/{pid}").exists():
                        self.scorers.setdefault(pid, None)
                    continue
                opened = "/dev/nvidia" in maps or any("/dev/nvidia" in target for target in _fd_targets(pid))
                if opened or self.scorers.get(pid) is True:
                    self.scorers[pid] = True
                elif "libcuda.so" in maps:
                    self.scorers[pid] = DRIVER_ONLY
                else:
                    self.scorers.setdefault(pid, False)


def _fd_targets(pid: int) -> list[str]:
    targets = []
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return targets
    for fd in fds:
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
    return targets


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _descends(pid: int, root: int) -> bool:
    for _ in range(64):
        if pid == root:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
        if pid <= 1:
            return False
    return False
