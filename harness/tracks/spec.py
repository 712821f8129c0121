"""Tracks: the fixed setup of an event (hardware, clock, data, evaluation), as TOML.

A track is named (`local`, `paris2026`, `dev-gpu`: the files in harness/tracks/) or given as a
path to an organiser's own TOML file. Every key is validated: a typo is an error that names
the file and the key, never a silent fall-back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.tracks.ddp import DdpError, DdpSpec

BUILTIN_DIR = Path(__file__).resolve().parent

BACKENDS = ("nccl", "gloo")
DEVICES = ("cuda", "cpu")
DTYPES = ("bfloat16", "float32", "auto")  # auto: bf16 where the device computes it natively
CLOCK_STARTS = ("first_forward", "model_build")
RANKINGS = ("best", "mean")
SHARD_FORMATS = ("auto", "raw_uint16", "llmc_uint16", "llmc_uint32")
SANDBOX_MODES = ("auto", "required", "off")
COMPILE_MODES = ("as_submitted", "eager")


class TrackError(ValueError):
    """A track could not be found or its TOML is wrong; the message says where and how to fix it."""


def _positive(name: str, value: float, where: str) -> None:
    if not value > 0:
        raise TrackError(f"{where}: `{name}` must be > 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class SyntheticSpec:
    """A random sparse Markov source whose entropy rate is computed exactly (see harness.data.synthetic)."""

    order: int = 2  # tokens of context the source conditions on
    branching: int = 4  # successors per context in each sparse component
    mix: float = 0.35  # weight of the component keyed by the older token (what makes it order 2)
    concentration: float = 0.7  # Dirichlet concentration of each sparse distribution
    # None (the default): drawn when the cache is built, and kept in the cache where no sandbox reaches; a
    # seed in the track file makes the validation tokens a public function of it (research only).
    seed: int | None = None
    train_tokens: int = 8_000_000

    def __post_init__(self) -> None:
        where = "[data.synthetic]"
        if self.order != 2:
            raise TrackError(f"{where}: only `order = 2` is implemented, got {self.order}")
        if self.branching < 1:
            raise TrackError(f"{where}: `branching` must be >= 1, got {self.branching}")
        if not 0.0 <= self.mix < 1.0:
            raise TrackError(f"{where}: `mix` must be in [0, 1), got {self.mix}")
        _positive("concentration", self.concentration, where)
        _positive("train_tokens", self.train_tokens, where)
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0):
            raise TrackError(f"{where}: `seed` must be an integer >= 0 (or left out: drawn when the cache is built), "
                             f"got {self.seed!r}")


TEXT_CORPORA = ("python-stdlib",)


@dataclass(frozen=True, kw_only=True)
class TextSpec:
    """Real text built on first use, without a download (see harness.data.text)."""

    corpus: str = "python-stdlib"  # trained on the running Python's standard library, validated on its test suite
    train_bytes: int = 4_000_000  # text taken for training (files in a fixed pseudo-random order)
    val_bytes: int = 1_000_000  # text taken for validation, from the held-out files

    def __post_init__(self) -> None:
        where = "[data.text]"
        if self.corpus not in TEXT_CORPORA:
            raise TrackError(f"{where}: `corpus` must be one of {', '.join(TEXT_CORPORA)}, got {self.corpus!r}")
        _positive("train_bytes", self.train_bytes, where)
        _positive("val_bytes", self.val_bytes, where)


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """Where the tokens come from. Training processes only ever see the `train` part."""

    source: str  # "synthetic" or "text" (built on first use into a cache), or "shards" (files on disk)
    vocab_size: int
    val_tokens: int  # evaluation scores exactly this many target tokens
    root: str = ""  # shard globs are relative to it; HARNESS_DATA_ROOT or --data-root replace it
    train: tuple[str, ...] = ()
    val: tuple[str, ...] = ()
    format: str = "auto"
    synthetic: SyntheticSpec | None = None
    text: TextSpec | None = None

    def __post_init__(self) -> None:
        where = "[data]"
        if self.source not in ("synthetic", "text", "shards"):
            raise TrackError(f"{where}: `source` must be 'synthetic', 'text' or 'shards', got {self.source!r}")
        _positive("vocab_size", self.vocab_size, where)
        _positive("val_tokens", self.val_tokens, where)
        if self.format not in SHARD_FORMATS:
            raise TrackError(f"{where}: `format` must be one of {', '.join(SHARD_FORMATS)}, got {self.format!r}")
        if self.source == "shards" and (not self.train or not self.val):
            raise TrackError(f"{where}: a 'shards' source needs both `train` and `val` globs")
        if self.source == "synthetic":
            if self.synthetic is None:
                raise TrackError(f"{where}: a 'synthetic' source needs a [data.synthetic] table")
            if self.vocab_size > 65535:
                raise TrackError(f"{where}: a synthetic vocabulary must fit uint16 (<= 65535)")
        if self.source == "text":
            if self.text is None:
                raise TrackError(f"{where}: a 'text' source needs a [data.text] table")
            if not 257 <= self.vocab_size <= 65536:
                raise TrackError(f"{where}: a 'text' vocabulary (its BPE tokenizer's) must be in [257, 65536] "
                                 "(256 bytes and the end-of-text token; uint16 shards)")


@dataclass(frozen=True, kw_only=True)
class EvalSpec:
    seq_len: int  # target tokens per evaluation window
    batch_size: int  # windows per forward pass; the batches are the unit sharded over ranks
    nproc_per_node: int = 0  # scorer ranks (each with its model processes); 0: as many as training
    timeout_s: float = 600.0
    causality_check: bool = True  # re-run a secret sample of the scoring batches with their ends replaced
    causality_fraction: float = 0.1  # share of the scoring batches checked (at least 2, or all if fewer)
    causality_tolerance: float = 1e-3  # largest change of a log-probability before the cut an honest model shows
    # Check enough rows that a model looking ahead at this fraction of positions is caught with 95%
    # probability (more batches than causality_fraction when needed); 0: causality_fraction alone.
    causality_detect_fraction: float = 0.0

    def __post_init__(self) -> None:
        _positive("seq_len", self.seq_len, "[eval]")
        _positive("batch_size", self.batch_size, "[eval]")
        _positive("timeout_s", self.timeout_s, "[eval]")
        _positive("causality_tolerance", self.causality_tolerance, "[eval]")
        if not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 0:
            raise TrackError(f"[eval]: `nproc_per_node` must be an integer >= 0, got {self.nproc_per_node!r}")
        if not 0.0 <= self.causality_detect_fraction < 1.0:
            raise TrackError(f"[eval]: `causality_detect_fraction` must be in [0, 1), got {self.causality_detect_fraction!r}")
        if not 0.0 < self.causality_fraction <= 1.0:
            raise TrackError(f"[eval]: `causality_fraction` must be in (0, 1], got {self.causality_fraction!r}")
        if self.seq_len < 2:
            raise TrackError("[eval]: `seq_len` must be >= 2 (a causality check needs a token after a cut)")


@dataclass(frozen=True, kw_only=True)
class InterconnectSpec:
    """The links gradients cross, per device and per direction: what `harness scale` predicts beyond what one
    node can measure (harness/launcher/scaling/comm_model.py). Defaults: an HGX B300 node (docs/tracks.md, sources)."""

    intra_node_gb_per_s: float = 900.0  # NVLink 5: 1.8 TB/s per GPU counting both directions
    inter_node_gb_per_s: float = 100.0  # one 800 Gb/s ConnectX-8 NIC per GPU
    intra_node_efficiency: float = 0.8  # achievable share of the link rate (NVLink: 128 B payloads, ~20 of 25 GB/s)
    inter_node_efficiency: float = 0.96  # InfiniBand: 24 of 25 GB/s (HDR), 192 of 200 GB/s (8 x HDR)
    intra_node_latency_us: float = 3.4  # NCCL's tuner: a ring step over NVLink (Simple protocol)
    inter_node_latency_us: float = 14.0  # NCCL's tuner: a ring step over the network (Simple protocol)
    launch_latency_us: float = 8.4  # NCCL's tuner: the base latency of an all-reduce (ring, Simple)

    def __post_init__(self) -> None:
        where = "[interconnect]"
        for name in ("intra_node_gb_per_s", "inter_node_gb_per_s"):
            _positive(name, getattr(self, name), where)
        for name in ("intra_node_efficiency", "inter_node_efficiency"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise TrackError(f"{where}: `{name}` must be in (0, 1], got {getattr(self, name)!r}")
        for name in ("intra_node_latency_us", "inter_node_latency_us", "launch_latency_us"):
            if getattr(self, name) < 0:
                raise TrackError(f"{where}: `{name}` must be >= 0, got {getattr(self, name)!r}")


@dataclass(frozen=True, kw_only=True)
class Track:
    """The fixed setup of an event. Resolved copies (with overrides) are saved in every run record."""

    name: str
    description: str = ""
    nnodes: int = 1
    nproc_per_node: int | str = 1  # or "auto": every visible GPU
    backend: str = "gloo"
    device: str = "cpu"
    dtype: str = "bfloat16"
    budget_s: float
    grace_s: float = 30.0  # the launcher kills the job at budget_s + grace_s
    clock_start: str = "first_forward"
    startup_timeout_s: float = 600.0  # from launch to the first training step (rendezvous included)
    startup_allowance_s: float = 30.0  # from the process group being up to the first step: the team's start-up
    save_allowance_s: float = 120.0  # after training: checkpoint, communication probe, teardown; never extends the clock
    checkpoint_allowance_s: float = 30.0  # end of training -> rank 0's checkpoint saved (the launcher takes it then)
    overrun_allowance_s: float = 1.0  # how far past the budget a training window may end beyond two median steps
    log_cap_mib: float = 256.0  # what a node's training ranks may write to their logs, together
    scratch_cap_gib: float = 64.0  # what they may leave in their private folder (logs, checkpoint, caches, tmp)
    checkpoint_cap_gib: float = 8.0  # the checkpoint's size (2B parameters in float32: what the allowance holds)
    # What one job's processes on a node may hold together, held by the kernel (harness/launcher/control/job_limits.py):
    # memory (0: 90% of what the node offers the launcher) and tasks, threads included (a fork past it fails).
    job_memory_gib: float = 0.0
    job_pids_max: int = 32768
    collective_timeout_s: float = 120.0  # process-group timeout: how long a hung rank can hide
    rendezvous_timeout_s: float = 300.0
    shutdown_timeout_s: float = 5.0  # SIGTERM -> SIGKILL when tearing a job down
    log_interval_s: float = 5.0
    comm_probe_steps: int = 5  # after training: k synchronised vs k compute-only steps (0: off)
    cpu_threads_per_rank: int = 0  # 0: the machine's cores divided among the local ranks
    peak_flops_per_device: float = 0.0  # 0: no peak known (MFU is then null, not invented)
    device_peak: str = ""  # a GPU name (B300, H100, ...) or "auto" to look the device up
    ranking: str = "mean"  # how a team's runs combine on the leaderboard
    divisions: str = "together"  # fixed-loop and open-division runs ranked together, or "separate"
    max_steps: int = 0  # >0: stop after exactly this many steps, not on the budget (tests and benchmarks)
    sandbox: str = "auto"  # Landlock for processes that run team code: auto (where available), required, off
    # A team's torch.compile'd model (COMPILE, or get_model's own) trained compiled, or eagerly (its plain
    # module): compiling on a laptop's CPU can cost more than a short budget; the figure is the same model's.
    compile: str = "as_submitted"
    data: DataSpec
    eval: EvalSpec
    interconnect: InterconnectSpec = field(default_factory=InterconnectSpec)
    ddp: DdpSpec = field(default_factory=DdpSpec)  # how DDP wraps every team's model (harness/tracks/ddp.py)
    source: str = ""  # where the track came from (a path); not part of its identity

    def __post_init__(self) -> None:
        where = f"track {self.name!r}"
        if self.backend not in BACKENDS:
            raise TrackError(f"{where}: `backend` must be one of {BACKENDS}, got {self.backend!r}")
        if self.device not in DEVICES:
            raise TrackError(f"{where}: `device` must be one of {DEVICES}, got {self.device!r}")
        if self.backend == "nccl" and self.device != "cuda":
            raise TrackError(f"{where}: backend 'nccl' needs device 'cuda' (use 'gloo' on cpu)")
        if self.dtype not in DTYPES:
            raise TrackError(f"{where}: `dtype` must be one of {DTYPES}, got {self.dtype!r}")
        if self.clock_start not in CLOCK_STARTS:
            raise TrackError(f"{where}: `clock_start` must be one of {CLOCK_STARTS}, got {self.clock_start!r}")
        if self.sandbox not in SANDBOX_MODES:
            raise TrackError(f"{where}: `sandbox` must be one of {SANDBOX_MODES}, got {self.sandbox!r}")
        if self.compile not in COMPILE_MODES:
            raise TrackError(f"{where}: `compile` must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.ranking not in RANKINGS:
            raise TrackError(f"{where}: `ranking` must be one of {RANKINGS}, got {self.ranking!r}")
        if self.divisions not in ("together", "separate"):
            raise TrackError(f"{where}: `divisions` must be \"together\" or \"separate\", got {self.divisions!r}")
        if self.nnodes < 1:
            raise TrackError(f"{where}: `nnodes` must be >= 1, got {self.nnodes}")
        if self.nproc_per_node != "auto" and (not isinstance(self.nproc_per_node, int) or self.nproc_per_node < 1):
            raise TrackError(f"{where}: `nproc_per_node` must be a positive integer or 'auto', got {self.nproc_per_node!r}")
        if self.nproc_per_node == "auto" and self.device != "cuda":
            raise TrackError(f"{where}: `nproc_per_node = 'auto'` counts GPUs; give a number on cpu")
        for name in ("budget_s", "startup_timeout_s", "startup_allowance_s", "save_allowance_s", "checkpoint_allowance_s",
                     "overrun_allowance_s", "collective_timeout_s", "rendezvous_timeout_s", "shutdown_timeout_s",
                     "log_interval_s", "log_cap_mib", "scratch_cap_gib", "checkpoint_cap_gib"):
            _positive(name, getattr(self, name), where)
        if self.grace_s < 0:
            raise TrackError(f"{where}: `grace_s` must be >= 0, got {self.grace_s}")
        if not isinstance(self.job_memory_gib, (int, float)) or not 0 <= self.job_memory_gib < 1 << 20:
            raise TrackError(f"{where}: `job_memory_gib` must be >= 0 (0: 90% of the node's memory), "
                             f"got {self.job_memory_gib!r}")
        if not isinstance(self.job_pids_max, int) or self.job_pids_max < 64:
            raise TrackError(f"{where}: `job_pids_max` must be an integer >= 64 (a torch rank holds dozens of threads), "
                             f"got {self.job_pids_max!r}")
        if not isinstance(self.max_steps, int) or self.max_steps < 0:
            raise TrackError(f"{where}: `max_steps` must be an integer >= 0, got {self.max_steps!r}")
        if self.comm_probe_steps < 0:
            raise TrackError(f"{where}: `comm_probe_steps` must be >= 0")
        if self.peak_flops_per_device < 0:
            raise TrackError(f"{where}: `peak_flops_per_device` must be >= 0")
        try:
            self.ddp.check_backend(self.backend)
        except DdpError as exc:
            raise TrackError(f"{where}: {exc}") from None
        if self.data.val_tokens % self.eval.seq_len:
            raise TrackError(
                f"{where}: data.val_tokens ({self.data.val_tokens}) must be a multiple of eval.seq_len "
                f"({self.eval.seq_len}) so that every window is whole"
            )

    @property
    def hard_limit_s(self) -> float:
        return self.budget_s + self.grace_s

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- loading

_TOP_KEYS = {f.name for f in dataclasses.fields(Track)} - {"source"}
_DATA_KEYS = {f.name for f in dataclasses.fields(DataSpec)}
_SYNTH_KEYS = {f.name for f in dataclasses.fields(SyntheticSpec)}
_TEXT_KEYS = {f.name for f in dataclasses.fields(TextSpec)}
_EVAL_KEYS = {f.name for f in dataclasses.fields(EvalSpec)}
_INTERCONNECT_KEYS = {f.name for f in dataclasses.fields(InterconnectSpec)}
_DDP_KEYS = {f.name for f in dataclasses.fields(DdpSpec)}


def builtin_track_names() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def _check_keys(table: dict[str, Any], allowed: set[str], where: str, path: str) -> None:
    for key in table:
        if key not in allowed:
            hint = difflib.get_close_matches(key, sorted(allowed), n=1)
            tip = f" Did you mean `{hint[0]}`?" if hint else f" Known keys: {', '.join(sorted(allowed))}."
            raise TrackError(f"{path}: unknown key `{key}` in {where}.{tip}")


def _as_globs(value: Any, key: str, path: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TrackError(f"{path}: [data] `{key}` must be a glob string or a list of them")


# Keys renamed since: tracks saved in older run records (and organisers' older files) still load.
RENAMED_KEYS = {"scaling_probe_steps": "comm_probe_steps"}


def track_from_dict(raw: dict[str, Any], path: str) -> Track:
    """Build a Track from parsed TOML, naming `path` in every error."""
    raw = dict(raw)
    for old, new in RENAMED_KEYS.items():
        if old in raw and new not in raw:
            raw[new] = raw.pop(old)
    _check_keys(raw, _TOP_KEYS, "the top level", path)
    for required in ("name", "budget_s", "data", "eval"):
        if required not in raw:
            raise TrackError(f"{path}: missing required key `{required}`")
    data_raw = dict(raw.pop("data"))
    _check_keys(data_raw, _DATA_KEYS, "[data]", path)
    synth_raw = data_raw.pop("synthetic", None)
    synthetic = None
    if synth_raw is not None:
        _check_keys(synth_raw, _SYNTH_KEYS, "[data.synthetic]", path)
        synthetic = SyntheticSpec(**synth_raw)
    text_raw = data_raw.pop("text", None)
    text = None
    if text_raw is not None:
        _check_keys(text_raw, _TEXT_KEYS, "[data.text]", path)
        try:
            text = TextSpec(**text_raw)
        except (TrackError, TypeError) as exc:
            raise TrackError(f"{path}: {exc}") from None
    for key in ("train", "val"):
        if key in data_raw:
            data_raw[key] = _as_globs(data_raw[key], key, path)
    eval_raw = dict(raw.pop("eval"))
    _check_keys(eval_raw, _EVAL_KEYS, "[eval]", path)
    links_raw = dict(raw.pop("interconnect", None) or {})
    _check_keys(links_raw, _INTERCONNECT_KEYS, "[interconnect]", path)
    ddp_raw = raw.pop("ddp", None)
    if ddp_raw is not None and not isinstance(ddp_raw, dict):
        raise TrackError(f"{path}: `ddp` must be a table ([ddp]), got {ddp_raw!r}")
    ddp_raw = dict(ddp_raw or {})
    _check_keys(ddp_raw, _DDP_KEYS, "[ddp]", path)
    try:
        return Track(data=DataSpec(synthetic=synthetic, text=text, **data_raw), eval=EvalSpec(**eval_raw),
                     interconnect=InterconnectSpec(**links_raw), ddp=DdpSpec(**ddp_raw), source=path, **raw)
    except (TrackError, DdpError) as exc:
        raise TrackError(f"{path}: {exc}") from None
    except TypeError as exc:  # a value of the wrong type reaching a comparison
        raise TrackError(f"{path}: {exc}") from None


def track_from_record(d: dict[str, Any]) -> Track:
    """Rebuild the resolved Track saved in a run record (Track.to_dict output)."""
    d = dict(d)
    source = d.pop("source", "") or "run.json"
    text = ((d.get("data") or {}).get("text") or None)
    if isinstance(text, dict) and "val_every" in text:  # records from before local-text validated on the test suite
        d["data"] = {**d["data"], "text": {k: v for k, v in text.items() if k != "val_every"}}
    return track_from_dict(d, source)


def is_track_file(name_or_path: str) -> bool:
    """Whether a `--track` value names a TOML file (else a track's name): every command decides it this way."""
    return name_or_path.endswith(".toml") or Path(name_or_path).expanduser().is_file()


def load_track(name_or_path: str) -> Track:
    """A built-in track by name, or an organiser's TOML file by path."""
    candidate = Path(name_or_path).expanduser()
    if is_track_file(name_or_path):
        if not candidate.is_file():
            raise TrackError(f"track file {candidate} does not exist")
        path = candidate.resolve()
    else:
        path = BUILTIN_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            names = builtin_track_names()
            hint = difflib.get_close_matches(name_or_path, names, n=1)
            tip = f" Did you mean: {hint[0]}?" if hint else ""
            raise TrackError(
                f"Unknown track {name_or_path!r}.{tip} Built-in tracks: {', '.join(names)}; "
                "or pass the path of a .toml file."
            )
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TrackError(f"{path}: not valid TOML: {exc}") from None
    return track_from_dict(raw, str(path))


# --------------------------------------------------------------------------- overrides

# Command-line overrides for testing: each one is recorded in the run and makes it unofficial.
OVERRIDABLE = {
    "budget_s": ("budget_s",),
    "grace_s": ("grace_s",),
    "nproc_per_node": ("nproc_per_node",),
    "nnodes": ("nnodes",),
    "val_tokens": ("data", "val_tokens"),
    "log_interval_s": ("log_interval_s",),
    "collective_timeout_s": ("collective_timeout_s",),
    "eval_timeout_s": ("eval", "timeout_s"),
    "max_steps": ("max_steps",),
}


@dataclass(frozen=True)
class ResolvedTrack:
    """A track after command-line overrides; `overrides` maps each changed key to (track, run) values."""

    track: Track
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def official(self) -> bool:
        return not self.overrides


def _get(track: Track, path: tuple[str, ...]) -> Any:
    obj: Any = track
    for part in path:
        obj = getattr(obj, part)
    return obj


def _replace(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    if len(path) == 1:
        return dataclasses.replace(obj, **{path[0]: value})
    return dataclasses.replace(obj, **{path[0]: _replace(getattr(obj, path[0]), path[1:], value)})


def apply_overrides(track: Track, **values: Any) -> ResolvedTrack:
    """Apply the given overrides (None means "not given"); only real changes are recorded."""
    overrides: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if value is None:
            continue
        if key not in OVERRIDABLE:
            raise TrackError(f"`{key}` cannot be overridden; overridable: {', '.join(OVERRIDABLE)}")
        path = OVERRIDABLE[key]
        before = _get(track, path)
        if before == value:
            continue
        try:
            track = _replace(track, path, value)
        except TrackError as exc:
            raise TrackError(f"override {key}={value!r}: {exc}") from None
        overrides[key] = {"track": before, "run": value}
    return ResolvedTrack(track=track, overrides=overrides)


def data_root(track: Track, cli_root: str | None = None) -> Path:
    """The directory the track's shard globs are relative to: --data-root, then HARNESS_DATA_ROOT, then the track."""
    root = cli_root or os.environ.get("HARNESS_DATA_ROOT") or track.data.root
    path = Path(os.path.expandvars(root)).expanduser()
    if not path.is_absolute() and track.source:
        path = Path(track.source).parent / path
    return path
