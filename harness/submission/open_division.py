"""The open division's contract: a team's own training script, launched and clocked by the harness.

A folder is an open-division submission when its submission.toml says `division = "open"`, or
when it holds `train.py` and no `submission.py`. It holds:

- the script (`train.py`, or `[open] script`), started on every rank by torch elastic exactly as
  the event's `torchrun ... train.py --data_dir ...` did, with the starter kit's arguments filled
  from the track: `--data_dir` (a folder that holds only the train shards), `--checkpoint_path`
  (in the run's private folder), `--vocab_size`, `--time_limit_min` (the budget), `--seq_len`
  (where the team's `[open.args]` leave it out) and `--max_steps` (only when the run is bounded by
  steps); the team's own arguments come from `[open.args]`;
- the model file (`model.py`, or `[open] model`) defining `get_model(config)`: the checkpoint,
  `{"model": state_dict, "config": dict}` saved by rank 0 at `--checkpoint_path`, is scored with
  `get_model(checkpoint["config"])`, exactly as a fixed-loop run's.

Everything here is pure: it reads the folder's files and builds argument lists; nothing runs.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.submission.contract import DOCS, SubmissionError, read_team_file

FIXED, OPEN = "fixed", "open"
DIVISIONS = (FIXED, OPEN)
# Filled by the harness from the track and the run; a team may not set them in [open.args].
HARNESS_ARGS = ("data_dir", "checkpoint_path", "vocab_size", "time_limit_min")
OPEN_KEYS = {"script", "model", "args", "tokens_per_step", "config"}


@dataclass
class OpenSpec:
    """[open] of submission.toml, checked: which files, which arguments."""

    folder: Path
    script: str = "train.py"
    model: str = "model.py"
    args: dict[str, Any] = field(default_factory=dict)  # the team's own --key value arguments
    tokens_per_step: int | None = None  # for throughput from the checkpoint's step count, when the script reports none
    config: dict[str, Any] | None = None  # the config the script saves: its model is checked strictly before training

    def __post_init__(self) -> None:
        toml = self.folder / "submission.toml"
        for key in ("script", "model"):
            name = getattr(self, key)
            if not isinstance(name, str) or not name.endswith(".py") or Path(name).is_absolute() or ".." in Path(name).parts:
                raise SubmissionError(toml, f"[open] {key} must be a .py file inside the submission folder, got {name!r}.",
                                      f'write {key} = "{"train.py" if key == "script" else "model.py"}"')
            if not (self.folder / name).is_file():
                raise SubmissionError(self.folder / name, "not found: an open-division submission needs its training "
                                      "script and the model file that scores its checkpoint.",
                                      f"add {name}, or name the file in [open] {key} (see {DOCS})")
        for key, value in self.args.items():
            if key in HARNESS_ARGS:
                raise SubmissionError(toml, f"[open.args] sets {key!r}, which the harness fills from the track.",
                                      f"remove {key} from [open.args]")
            if not isinstance(value, (str, int, float, bool)):
                raise SubmissionError(toml, f"[open.args] {key} must be a string, number or boolean, got {value!r}.",
                                      "write one value per argument")
        if self.config is not None and not (isinstance(self.config, dict) and _json_like(self.config)):
            raise SubmissionError(toml, "[open] config must be a table of strings, numbers, booleans, arrays and "
                                  f"tables (at most {CONFIG_MAX_DEPTH} deep), as checkpoint['config'] holds.",
                                  "write it as [open.config], with the keys your script saves in checkpoint['config']")
        if self.tokens_per_step is not None and (isinstance(self.tokens_per_step, bool)
                                                 or not isinstance(self.tokens_per_step, int) or self.tokens_per_step < 1):
            raise SubmissionError(toml, f"[open] tokens_per_step must be a positive int, got {self.tokens_per_step!r}.",
                                  "write the tokens one optimizer step consumes over all ranks, or remove it")


CONFIG_MAX_DEPTH = 8


def _json_like(value: Any, depth: int = 0) -> bool:
    """What JSON carries (the check process gets the config as JSON): no dates, no infinities."""
    if depth > CONFIG_MAX_DEPTH:
        return False
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_like(v, depth + 1) for k, v in value.items())
    if isinstance(value, list):
        return all(_json_like(v, depth + 1) for v in value)
    if isinstance(value, float):
        return value == value and abs(value) != float("inf")
    return isinstance(value, (str, int, bool))


def _read_toml(folder: Path) -> dict:
    path = folder / "submission.toml"
    text = read_team_file(folder)  # a regular file only, bounded: the team's folder is hostile input
    if text is None:
        return {}
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:  # nested past the parser's depth too
        raise SubmissionError(path, f"is not valid TOML: {type(exc).__name__}: {str(exc)[:200]}.",
                              f"fix the syntax (see {DOCS})") from None


def division_of(folder: Path) -> str:
    """"open" or "fixed": what submission.toml says, else what the folder holds."""
    raw = _read_toml(folder)
    said = raw.get("division")
    if said is not None:
        if said not in DIVISIONS:
            raise SubmissionError(folder / "submission.toml", f"division must be one of {', '.join(DIVISIONS)}, "
                                  f"got {said!r}.", 'write division = "open" for your own train.py, or remove it')
        return said
    if not (folder / "submission.py").is_file() and (folder / "train.py").is_file():
        return OPEN
    return FIXED


def read_open_spec(folder: Path) -> OpenSpec:
    raw = _read_toml(folder).get("open", {})
    if not isinstance(raw, dict):
        raise SubmissionError(folder / "submission.toml", "`open` must be a table.", "write it as [open]")
    unknown = set(raw) - OPEN_KEYS
    if unknown:
        raise SubmissionError(folder / "submission.toml", f"unknown key(s) in [open]: {', '.join(sorted(unknown))}.",
                              f"allowed: {', '.join(sorted(OPEN_KEYS))}")
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise SubmissionError(folder / "submission.toml", "[open] args must be a table.", "write it as [open.args]")
    return OpenSpec(folder=folder, script=raw.get("script", "train.py"), model=raw.get("model", "model.py"),
                    args=dict(args), tokens_per_step=raw.get("tokens_per_step"), config=raw.get("config"))


def config_before_training(spec: OpenSpec, *, vocab_size: int, seq_len: int) -> tuple[dict[str, Any], bool]:
    """The config model.py's get_model is checked with before the script runs, and whether the team
    declared it ([open.config]: the check is then strict, a failure ends the run before training).
    Otherwise the config the script's own arguments suggest, the starter kit's way (its saved config
    is built from --vocab_size, --seq_len and the model's --n_layer ...): a failure with a config the
    harness guessed is a warning, never a rejection."""
    if spec.config is not None:
        return dict(spec.config), True
    return {"vocab_size": vocab_size, "seq_len": seq_len, **spec.args}, False


def _flag(key: str, value: Any) -> list[str]:
    if isinstance(value, bool):  # the starter kit's style: --compile true|false
        value = "true" if value else "false"
    return [f"--{key}", str(value)]


def script_argv(spec: OpenSpec, *, data_dir: str, checkpoint_path: str, vocab_size: int, budget_s: float,
                seq_len: int, max_steps: int = 0) -> list[str]:
    """The starter kit's command line for the team's script: the harness's values, then the team's."""
    argv = [*_flag("data_dir", data_dir), *_flag("checkpoint_path", checkpoint_path),
            *_flag("vocab_size", vocab_size), *_flag("time_limit_min", f"{budget_s / 60:.6g}")]
    args = dict(spec.args)
    args.setdefault("seq_len", seq_len)
    if max_steps:
        args["max_steps"] = max_steps
    for key, value in args.items():
        argv += _flag(key, value)
    return argv

