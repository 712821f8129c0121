"""What the launcher hands to the processes it starts: one JSON file per job, read at start-up.

A TrainJob never holds the validation shards' location: training processes are not told where
the validation data is. Evaluation processes get an EvalJob, after every training process is gone.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.data.shards import ShardInfo

T = TypeVar("T")


def _shards_to_json(shards: list[ShardInfo]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(s) for s in shards]


def _shards_from_json(items: list[dict[str, Any]]) -> list[ShardInfo]:
    return [ShardInfo(**s) for s in items]


@dataclass(kw_only=True)
class TrainJob:
    run_id: str
    track: str
    submission_dir: str  # the snapshot inside the run record, not the team's working folder
    seed: int
    budget_s: float
    clock_start: str
    backend: str
    device: str
    dtype: str
    log_interval_s: float
    collective_timeout_s: float
    cpu_threads_per_rank: int
    vocab_size: int
    train_shards: list[ShardInfo] = field(default_factory=list)
    channel_path: str = ""
    log_dir: str = ""
    staging_dir: str = ""  # where rank 0 leaves the checkpoint for the launcher to take over
    work_dir: str = ""  # the ranks' private working directory
    job_namespace: str = ""  # the socket of the job's namespace holder (harness/launcher/control/job_namespace.py)
    comm_probe_steps: int = 0  # after training: k synchronised vs k compute-only steps (0: no probe)
    max_steps: int = 0  # >0: stop after this many steps instead of on the clock (tests, `harness scale`)
    warmup_steps: int = 0  # steps of a fixed-step probe left out of its throughput figure
    data_fingerprint: str = ""  # what this node's launcher found: all nodes must agree before training
    submission_sha256: str = ""
    sandbox: str = "auto"  # auto | required | off
    sandbox_policy: dict = field(default_factory=dict)  # harness/ranks/confine/sandbox.py Policy, decided by the launcher
    ddp: dict = field(default_factory=dict)  # the track's [ddp] table (harness/tracks/ddp.py); empty: the defaults
    # The check said the model is torch.compile'd (COMPILE, or get_model's own): the ranks import the
    # compiler before the team's start-up begins, so its seconds of import are the harness's, not the allowance's.
    compiles: bool = False
    compile_mode: str = "as_submitted"  # the track's `compile`: "eager" trains a compiled model's plain module
    gated: bool = False  # started while its submission is checked: waits for the launcher's word before building

    def save(self, path: Path) -> None:
        d = dataclasses.asdict(self)
        d["train_shards"] = _shards_to_json(self.train_shards)
        path.write_text(json.dumps(d, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "TrainJob":
        return cls.from_dict(json.loads(Path(path).read_text()))

    @classmethod
    def from_dict(cls, d: dict) -> "TrainJob":
        """From the job file's JSON, read before the sandbox closed the folder it lives in."""
        return cls(**{**d, "train_shards": _shards_from_json(d["train_shards"])})


@dataclass(kw_only=True)
class EvalJob:
    checkpoint: str
    checkpoint_sha256: str  # checked before loading: the file scored is the file recorded
    submission_dir: str
    model_file: str = "submission.py"  # what defines get_model: an open-division submission's model.py
    val_shards: list[ShardInfo]
    val_tokens: int
    seq_len: int
    batch_size: int
    vocab_size: int
    device: str
    dtype: str
    collective_timeout_s: float
    cpu_threads_per_rank: int
    vocab_out: int = 0  # the checkpoint's vocabulary (padded vocabularies are larger than the track's)
    causality_check: bool = True
    causality_fraction: float = 0.1  # of the scoring batches, re-run with the tokens after a secret cut replaced
    causality_min_rows: int = 0  # and at least this many rows (the track's causality_detect_fraction, as rows)
    causality_tolerance: float = 1e-3  # largest honest change of a log-probability before the cut (nats)
    sandbox: str = "auto"  # auto | required | off: Landlock for the model processes
    protected: list[str] = field(default_factory=list)  # paths no model process may be able to read
    channel_path: str = ""
    log_dir: str = ""
    scratch_dir: str = ""  # where the model processes' private folders are made (harness/ranks/confine/scratch.py)

    def __post_init__(self) -> None:
        if not self.vocab_out:
            self.vocab_out = self.vocab_size

    def save(self, path: Path) -> None:
        d = dataclasses.asdict(self)
        d["val_shards"] = _shards_to_json(self.val_shards)
        path.write_text(json.dumps(d, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "EvalJob":
        d = json.loads(Path(path).read_text())
        d["val_shards"] = _shards_from_json(d["val_shards"])
        return cls(**d)


@dataclass(kw_only=True)
class OpenJob:
    """An open-division training job: the team's own script, run on every rank (harness/ranks/open_rank.py)."""

    run_id: str
    submission_dir: str  # the copy in the private folder; the script's working directory
    script: str  # file name inside submission_dir
    argv: list[str]  # the starter kit's arguments, filled by the launcher
    device: str
    log_dir: str
    budget_s: float = 0.0  # for the launcher's progress line; the script gets it as --time_limit_min
    max_steps: int = 0
    log_interval_s: float = 1.0  # how often the progress line may change (the script reports when it likes)
    channel_path: str = ""
    job_namespace: str = ""
    sandbox: str = "auto"
    sandbox_policy: dict = field(default_factory=dict)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1))

    @classmethod
    def from_dict(cls, d: dict) -> "OpenJob":
        return cls(**d)
