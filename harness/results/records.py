"""Run records: the source of truth. One self-contained directory per run, written atomically.

    runs/<track>/<team>/<run_id>/
        run.json        the record (this module's RunRecord)
        metrics.csv     step, train_time_s, train_loss, lr_scale, tokens, tokens_per_s, grad_norm
        checkpoint.pt   {config, model, step, tokens}: what evaluation scored
        submission/     the exact files that ran
        logs/           launcher.log, preflight.log, rank<R>.log, eval-rank<R>.log

Everything else (leaderboards, charts, comparisons) is derived from these and can be rebuilt.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import secrets
import tempfile
import time
import typing
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Iterator, Sequence

# 2: the probe's figure is `comm_overlap_efficiency` (was `scaling_efficiency`), `comm_probe`.
# 3: `launcher_pid`, so that `harness finalize` can tell whether a record's launcher is gone.
SCHEMA_VERSION = 3
STATUSES = ("running", "evaluating", "ok", "timeout", "crashed", "invalid", "diverged", "aborted")
FINAL_STATUSES = ("ok", "timeout", "crashed", "invalid", "diverged", "aborted")  # a record says when it is done
METRICS_COLUMNS = ("step", "train_time_s", "train_loss", "lr_scale", "tokens", "tokens_per_s", "grad_norm")


def runs_root(cli_value: str | None = None) -> Path:
    """--runs-dir, then HARNESS_RUNS_DIR, then ./runs; absolute, because the processes a run starts (the
    check, the ranks, evaluation's model processes) work in private folders of their own."""
    return Path(cli_value or os.environ.get("HARNESS_RUNS_DIR") or "runs").expanduser().absolute()


def beside_runs(runs: Path | None, name: str) -> Path:
    """A view's default folder, next to the runs folder it is derived from and named after it: `runs` ->
    `leaderboard`, `event-runs` -> `event-runs-leaderboard`. Two runs folders never share (and overwrite)
    one board, as they did when every default board was ./leaderboard."""
    runs = runs_root() if runs is None else Path(runs).expanduser().absolute()
    return runs.parent / (name if runs.name == "runs" else f"{runs.name}-{name}")


def leaderboard_root(cli_value: str | None = None, runs: Path | None = None) -> Path:
    """--out, then HARNESS_LEADERBOARD_DIR, then beside the runs folder (`runs` (default: runs_root()) ->
    `leaderboard`). Here, beside runs_root, so that the launcher (which guards the leaderboard during a
    run) needs no pandas to find it."""
    explicit = cli_value or os.environ.get("HARNESS_LEADERBOARD_DIR")
    return Path(explicit) if explicit else beside_runs(runs, "leaderboard")


def plots_root(cli_value: str | None = None, runs: Path | None = None) -> Path:
    """--plots-dir, then HARNESS_PLOTS_DIR, then beside the runs folder (`runs` -> `plots`)."""
    explicit = cli_value or os.environ.get("HARNESS_PLOTS_DIR")
    return Path(explicit) if explicit else beside_runs(runs, "plots")


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


STAMP = "%Y-%m-%dT%H:%M:%SZ"  # a record's times (started_at, ended_at): UTC, to the second


def utc_now() -> str:
    return time.strftime(STAMP, time.gmtime())


def stamp_epoch_s(stamp: object) -> float | None:
    """Seconds since the epoch of a time written by utc_now; None for anything else (a record may be edited)."""
    import calendar

    try:
        return float(calendar.timegm(time.strptime(stamp, STAMP))) if isinstance(stamp, str) else None
    except ValueError:
        return None


@dataclass(kw_only=True)
class RunRecord:
    # identity
    run_id: str
    team: str
    track_name: str
    division: str = "fixed"  # "fixed": the harness's loop; "open": the team's own train.py
    status: str = "running"
    reason: str = ""
    official: bool = True
    flagged: bool = False
    flag_reason: str = ""
    # result
    val_loss: float | None = None
    loss_floor: float | None = None
    loss_gap: float | None = None  # val_loss - loss_floor
    unigram_entropy: float | None = None
    train_loss: float | None = None
    # training
    steps: int | None = None
    tokens: int | None = None
    budget_s: float | None = None
    startup_s: float | None = None  # the team's start-up: process group up -> first step (launcher's clock)
    train_time_s: float | None = None  # measured by the ranks
    launcher_train_time_s: float | None = None  # measured by the launcher from rank 0's reports
    tokens_per_s: float | None = None
    tokens_per_s_per_device: float | None = None
    throughput_source: str = "measured"  # "reported": an open-division script's own figures, not measured
    params: int | None = None
    flops_per_token: float | None = None  # measured: FLOP counter over one training step
    peak_flops_per_device: float | None = None
    mfu: float | None = None  # None where the device's peak is unknown (a CPU)
    # The communication probe after training, at this run's world size: compute-only step time / synchronised
    # step time (1 = no exposed communication). Not weak-scaling efficiency: that is `harness scale`'s figure.
    comm_overlap_efficiency: float | None = None
    comm_probe: dict[str, Any] = field(default_factory=dict)  # steps, both medians, the spread, comm_s
    peak_mem_gib: float | None = None
    data_wait_s: float | None = None
    # setup
    seed: int | None = None
    world_size: int | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    device_name: str | None = None
    precision: str | None = None  # bfloat16 (autocast) or float32: the track's dtype resolved on this machine
    torch_version: str | None = None
    python_version: str | None = None
    harness_version: str | None = None
    versions: dict[str, Any] = field(default_factory=dict)  # torch, cuda, nccl, numpy, python, harness, git commit
    hostname: str | None = None
    launcher_pid: int | None = None  # with hostname: the process that writes this record (harness finalize)
    machine: dict[str, Any] = field(default_factory=dict)  # cpu model, cores, gpus: what produced the figures
    command: list[str] = field(default_factory=list)
    submission_dir: str | None = None  # the team's folder on the machine that ran it (provenance, never shown)
    submission_sha256: str | None = None
    checkpoint_sha256: str | None = None
    data_fingerprint: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    track: dict[str, Any] = field(default_factory=dict)  # the resolved track, overrides applied
    overrides: dict[str, Any] = field(default_factory=dict)
    team_members: list[str] = field(default_factory=list)
    # evaluation
    eval: dict[str, Any] = field(default_factory=dict)
    # isolation: per phase (check, training, evaluation), whether the sandbox was active and why not
    sandbox: dict[str, Any] = field(default_factory=dict)
    # what a team should fix that did not stop the run, and what a reviewer should read (static screen, sandbox)
    warnings: list[str] = field(default_factory=list)
    # failure detail
    failing_rank: int | None = None
    traceback: str | None = None
    killed_pids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # time
    timings: dict[str, float] = field(default_factory=dict)  # launcher-measured phase durations, seconds
    started_at: str = field(default_factory=utc_now)
    ended_at: str | None = None
    schema_version: int = SCHEMA_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # metrics added by later features

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(d.pop("extra"))
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RunRecord":
        d = upgrade_record(d)
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**known, extra=extra)


# Schema 1 called the communication probe's figure "scaling efficiency", which it is not (README, Results).
_PROBE_KEYS_V1 = {"scaling_probe_steps": "steps", "scaling_synced_step_s": "synced_step_s",
                  "scaling_compute_step_s": "compute_step_s", "scaling_efficiency_min": "efficiency_min",
                  "scaling_efficiency_max": "efficiency_max", "comm_s": "comm_s"}


def upgrade_record(d: dict[str, Any]) -> dict[str, Any]:
    """A run.json of any schema as the current one, saying so in its `schema_version` (old records stay
    readable; nothing is rewritten on disk, but a record saved after reading it follows, and says, this schema).
    A record of a newer schema than this harness knows is returned as it is."""
    version = d.get("schema_version", 1)  # schema 1 records all say it; a record without one is older still
    if isinstance(version, int) and not isinstance(version, bool) and version >= SCHEMA_VERSION:
        return d
    d = dict(d)
    if "scaling_efficiency" in d or "scaling" in d:  # schema 1
        old = d.pop("scaling_efficiency", None)
        probe = d.pop("scaling", None)
        probe = probe if isinstance(probe, dict) else {}  # a file edited by hand: never a crash of the board
        d.setdefault("comm_overlap_efficiency", old)
        d.setdefault("comm_probe", {new: probe[k] for k, new in _PROBE_KEYS_V1.items() if k in probe})
    # schema 2 to 3: `launcher_pid` is added; absent, it is unknown (the dataclass's None)
    d["schema_version"] = SCHEMA_VERSION
    return d


def field_kinds() -> dict[str, str]:
    """Each RunRecord field's kind as JSON holds it ("number", "text", "flag", "object", "list"), read from the
    dataclass: the one declaration of the schema, which the views check a record's fields against."""
    kinds = {}
    for name, hint in typing.get_type_hints(RunRecord).items():
        if name == "extra":  # not a field of run.json: its keys are written at the top level
            continue
        members = typing.get_args(hint) if isinstance(hint, UnionType) else (hint,)  # `float | None`: float
        members = [t for t in members if t is not type(None)]
        base = typing.get_origin(members[0]) or members[0]
        kinds[name] = {int: "number", float: "number", str: "text", bool: "flag", dict: "object", list: "list"}[base]
    return kinds


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: Path, suffix: str = "") -> Iterator[tuple[int, Path]]:
    """A temporary file beside `path` (its descriptor and path), renamed onto `path` when the block ends
    without an error, removed otherwise: readers see the old file or the new one, never half of one.

    mkstemp creates files readable by their owner only; outputs get the mode any other new file of the user
    gets (0666 less the umask), so a leaderboard can be served or shared like the rest of the folder.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        yield fd, Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, fsync, then rename (see atomic_path)."""
    with atomic_path(path) as (fd, _):
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())


def save_record(run_dir: Path, record: RunRecord) -> Path:
    path = run_dir / "run.json"
    write_atomic(path, json.dumps(record.to_dict(), indent=2, sort_keys=False, default=str) + "\n")
    return path


RECORD_MAX_BYTES = 16 << 20  # a run.json is tens of kB; the bound keeps a planted file from filling memory


def read_record_json(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """A run.json (or its bytes, already read) as a JSON object. Read as a regular file only (never through
    a link, never a FIFO that would block the reader) and bounded: how every harness process reads a file
    of the records, which a team without the sandbox could have planted. Raises OSError or ValueError."""
    from harness.submission.files import read_regular

    try:
        raw = json.loads(read_regular(path, RECORD_MAX_BYTES) if data is None else data)
    except RecursionError:  # nested past the parser's depth: a planted file, never a crash of its reader
        raise ValueError("JSON nested too deep") from None
    if not isinstance(raw, dict):
        raise ValueError(f"a JSON {type(raw).__name__}, not an object")
    return raw


# orjson parses a JSON integer past 64 bits as a float, where the stdlib gives an int: the one value it reads
# differently (what it refuses, NaN, nesting past 1,024, an encoding other than UTF-8, goes to the stdlib).
_WIDE = float(2**63)


def _wide_number(value: Any) -> bool:
    """A float of 2**63 or more anywhere in value; walked with a list, not recursion (orjson nests 1,024 deep,
    past Python's recursion limit)."""
    todo = [value]
    while todo:
        item = todo.pop()
        kind = type(item)
        if kind is float:
            if abs(item) >= _WIDE:
                return True
        elif kind is dict:
            todo.extend(item.values())
        elif kind is list:
            todo.extend(item)
    return False


def read_record_fields(path: Path | str, keys: Sequence[str]) -> dict[str, Any]:
    """read_record_json's object, parsed by orjson (three times as fast: parsing is most of a cold board's rebuild
    at event size) wherever that gives the same values for the `keys` the caller reads; by the stdlib elsewhere,
    and for a record of another schema (upgrade_record reads what no caller names)."""
    from harness.submission.files import read_regular

    data = read_regular(path, RECORD_MAX_BYTES)
    try:
        import orjson
    except ImportError:  # a checkout pulled without `pip install`: slower, the same rows
        return read_record_json(Path(path), data)
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError:
        return read_record_json(Path(path), data)
    if (not isinstance(raw, dict) or type(raw.get("schema_version")) is not int
            or raw["schema_version"] != SCHEMA_VERSION or any(_wide_number(raw.get(k)) for k in keys)):
        return read_record_json(Path(path), data)
    return raw


def load_record(run_dir: Path) -> RunRecord:
    return RunRecord.from_dict(read_record_json(Path(run_dir) / "run.json"))


def save_metrics(run_dir: Path, rows: list[dict[str, Any]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=METRICS_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    write_atomic(run_dir / "metrics.csv", buf.getvalue())


def iter_run_dirs(root: Path, track: str | None = None) -> Iterator[Path]:
    """Every run directory under root (runs/<track>/<team>/<run_id>/run.json), sorted."""
    pattern = f"{track}/*/*/run.json" if track else "*/*/*/run.json"
    for path in sorted(Path(root).glob(pattern)):
        yield path.parent


def match_runs(root: Path, key: str, track: str | None = None) -> list[Path]:
    """Run directories whose id is `key`, else those whose id starts with it (an exact id always names its
    own run: a SLURM array's `12345_1` is not also `12345_10` to `12345_19`)."""
    dirs = list(iter_run_dirs(root, track))
    exact = [d for d in dirs if d.name == key]
    return exact or [d for d in dirs if d.name.startswith(key)]


def find_run(root: Path, key: str) -> Path:
    """A run directory from a path or a run id."""
    p = Path(key)
    if (p / "run.json").is_file():
        return p
    matches = match_runs(root, key)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise FileNotFoundError(f"no run {key!r} under {root} (give a run id or a run directory)")
    raise FileNotFoundError(f"{key!r} matches {len(matches)} runs under {root}: give more of the id")


def record_folder(raw: dict) -> str:
    """The name of the submission folder a record's run came from: the one the launcher resolved (its identity),
    else the last part of the path it was given, resolved as well as a path of another machine can be; "" when
    none can be told (never ".", "..")."""
    identity = raw.get("identity")
    name = identity.get("folder") if isinstance(identity, dict) else None
    if not isinstance(name, str) or not name:
        source = raw.get("submission_dir")
        name = Path(os.path.normpath(source)).name if isinstance(source, str) and source else ""
    return "" if name in ("", ".", "..") else name
