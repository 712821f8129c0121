"""The submission contract, in one place: what a team's folder must define, and how it is checked.

A submission is a folder with `submission.py` defining:

- `CONFIG: dict`: hyperparameters passed to `get_model` and saved in the checkpoint. The harness
  reads `micro_batch_size`, `seq_len` and `grad_accum_steps` (default 1), and sets `vocab_size`
  from the track when CONFIG leaves it out (a smaller one is an error, a larger one is a padded
  vocabulary and allowed).
- `get_model(config) -> torch.nn.Module` whose `forward(idx, targets=None)` returns
  `(logits, loss)`: logits [B, T, vocab_size], loss a scalar tensor when targets are given.
- optional `build_optimizers(model, ctx) -> Optimizer | list[Optimizer]` (default: AdamW).
- optional `lr_schedule(progress) -> float`: a multiplier on each param group's initial lr,
  `progress` in [0, 1] being the fraction of the time budget used (default: warm-up, constant,
  linear decay).
- optional `COMPILE: bool`: the harness applies torch.compile before wrapping in DDP.
- optional `submission.toml` beside it: `[team] name, members, description`.

Every error names the file, the wrong piece and the fix (docs/submission.md has a full example).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
import unicodedata
import sys
import tomllib
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

DOCS = "docs/submission.md"
from harness.submission import files
from harness.submission.files import IGNORED_DIRS, MAX_SUBMISSION_BYTES  # noqa: F401 (one definition, re-exported)

PACKAGE = "_harness_submission"
PACKAGE_ROOT = str(Path(__file__).resolve().parent / "package_root")  # holds _harness_submission/
PACKAGE_DIR_ENV = "HARNESS_SUBMISSION_PACKAGE_DIR"  # the folder package_root/_harness_submission stands for


class SubmissionError(Exception):
    """The submission breaks the contract. `problem` says what, `fix` says how to repair it."""

    def __init__(self, file: str | Path, problem: str, fix: str = ""):
        self.file, self.problem, self.fix = str(file), problem, fix
        super().__init__(f"{file}: {problem}" + (f" Fix: {fix}" if fix else ""))


@dataclass(frozen=True)
class SubmissionContext:
    """What `build_optimizers` may know about the run. Read-only; never where the val data is."""

    rank: int
    local_rank: int
    world_size: int
    device: str
    budget_s: float
    vocab_size: int
    seed: int
    track: str


@dataclass
class TeamInfo:
    name: str
    members: list[str] = field(default_factory=list)
    description: str = ""


@dataclass
class Submission:
    """A loaded, checked submission module."""

    folder: Path
    config: dict[str, Any]
    get_model: Callable[[dict], Any]
    build_optimizers: Callable | None
    lr_schedule: Callable[[float], float] | None
    compile: bool

    @property
    def file(self) -> Path:
        return self.folder / "submission.py"

    @property
    def vocab_out(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def micro_batch_size(self) -> int:
        return int(self.config["micro_batch_size"])

    @property
    def seq_len(self) -> int:
        return int(self.config["seq_len"])

    @property
    def grad_accum_steps(self) -> int:
        return int(self.config.get("grad_accum_steps", 1))


# --------------------------------------------------------------------------- finding and copying


def find_submission(path: str | Path) -> Path:
    """The submission folder for a path given on the command line (the folder, its submission.py,
    or an open-division submission's train.py)."""
    p = Path(path).expanduser()
    if p.is_file() and p.name in ("submission.py", "train.py"):
        p = p.parent
    if not p.exists():
        near = _near_folders(p)
        raise SubmissionError(p, "does not exist." + (f" Did you mean: {', '.join(near)}?" if near else ""),
                              "pass the folder that holds your submission.py")
    if not p.is_dir():
        raise SubmissionError(p, "is not a folder.", "pass the folder that holds your submission.py")
    if not (p / "submission.py").is_file() and not (p / "train.py").is_file() \
            and not (p / "submission.toml").is_file():
        raise SubmissionError(
            p / "submission.py", "not found: a submission is a folder with submission.py (the fixed loop) or "
            "train.py and model.py (the open division).",
            f"add submission.py defining CONFIG and get_model (see {DOCS})",
        )
    return p.resolve()


def _near_folders(path: Path) -> list[str]:
    """Sibling folders whose name is close to a mistyped one (submissions/newcomr -> submissions/newcomer)."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        names = sorted(d.name for d in parent.iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError:
        return []
    return [str(path.parent / n) if str(path.parent) != "." else n
            for n in difflib.get_close_matches(path.name, names, n=2, cutoff=0.7)]


def submission_files(folder: Path) -> list[Path]:
    """The files that make up a submission (what is hashed and copied into the record): its regular
    files, never through a link (harness/submission/files.py); raises SubmissionError naming anything
    else in the folder."""
    try:
        return [folder / e.rel for e in files.walk(folder)]
    except files.UnsafeEntry as exc:
        raise _unsafe(folder, exc) from None


def _unsafe(folder: Path, exc: files.UnsafeEntry) -> SubmissionError:
    return SubmissionError(folder / exc.rel, f"is {exc.kind}: {exc.why}", exc.fix)


def submission_sha256(folder: Path) -> str:
    """One hash over the submission's files: their relative paths and contents, in sorted order."""
    try:
        return files.tree_sha256(folder)
    except files.UnsafeEntry as exc:
        raise _unsafe(folder, exc) from None


def snapshot_submission(folder: Path, dest: Path) -> str:
    """Copy the submission into the run record; the run imports this copy, so later edits cannot leak in.
    Only regular files are copied, opened without following a link: a link, FIFO, socket or device in the
    folder is a SubmissionError naming it (a link to where the validation shard lies would otherwise make
    the shard the team's own file)."""
    try:
        files.copy_tree(folder, dest, MAX_SUBMISSION_BYTES)
    except files.UnsafeEntry as exc:
        raise _unsafe(folder, exc) from None
    except files.TooLarge:
        raise SubmissionError(
            folder, f"holds more than {MAX_SUBMISSION_BYTES // 2**20} MiB of files.",
            "keep only code and small config files in the submission folder",
        ) from None
    return submission_sha256(dest)


TEAM_FILE_MAX_BYTES = 64 * 1024


def read_team_file(folder: Path) -> str | None:
    """submission.toml's text, read as a regular file only and bounded; None when there is none."""
    path = folder / "submission.toml"
    try:
        return files.read_regular(path, TEAM_FILE_MAX_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except files.UnsafeEntry as exc:
        raise SubmissionError(path, f"is {exc.kind}: the harness reads regular files only.",
                              "put the file itself in the folder") from None
    except files.TooLarge:
        raise SubmissionError(path, f"is larger than {TEAM_FILE_MAX_BYTES // 1024} KiB.",
                              "keep the team and division settings only") from None
    except OSError as exc:
        raise SubmissionError(path, f"cannot be read ({exc.strerror or exc}).", "") from None


def read_team(folder: Path) -> TeamInfo:
    """[team] from submission.toml, or the folder's name."""
    path = folder / "submission.toml"
    text = read_team_file(folder)
    if text is None:
        return TeamInfo(name=folder.name)
    try:
        raw = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError) as exc:  # nested past the parser's depth too
        raise SubmissionError(path, f"is not valid TOML: {type(exc).__name__}: {str(exc)[:200]}.",
                              f"fix the syntax (see {DOCS})") from None
    team = raw.get("team", {})
    if not isinstance(team, dict):
        raise SubmissionError(path, "`team` must be a table.", "write it as [team] with name = \"...\"")
    unknown = set(team) - {"name", "members", "description"}
    if unknown:
        raise SubmissionError(path, f"unknown key(s) in [team]: {', '.join(sorted(unknown))}.",
                              "allowed: name, members, description")
    name = team.get("name", folder.name)
    members = team.get("members", [])
    if not isinstance(name, str) or not name.strip():
        raise SubmissionError(path, "[team] name must be a non-empty string.", 'write name = "your team"')
    if not team_name_is_plain(name):
        raise SubmissionError(path, f"[team] name {ascii(name)[:80]} holds invisible or control characters (a name "
                              "shown like another team's, or one that moves the terminal's cursor).",
                              "write the name in letters, digits, spaces and punctuation")
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise SubmissionError(path, "[team] members must be a list of strings.", 'write members = ["ada", "alan"]')
    return TeamInfo(name=name.strip(), members=members, description=str(team.get("description", "")))


def relative_paths(text: str, copies: list[Path]) -> str:
    """Paths into a copy of the submission written relative to the submission folder ("submission.py:5"),
    whichever machine or private folder ran it: what a team can open in its own checkout."""
    for copy in copies:
        forms = {str(Path(copy).resolve()), str(copy)}
        for form in sorted(forms, key=len, reverse=True):  # the longer (absolute) form first: it contains the other
            text = text.replace(form.rstrip("/") + "/", "")
    return text


def team_name_is_plain(name: str) -> bool:
    """No control, format (zero-width, bidi) or other invisible characters, and at most 100 characters: a
    name that looks like another team's would share its place on the leaderboard and in a queue."""
    import unicodedata

    return len(name) <= 100 and all(c == " " or (c.isprintable() and unicodedata.category(c) not in ("Cf", "Zl", "Zp"))
                                    for c in name)


def team_slug(name: str) -> str:
    """A file-system-safe form of a team name (the records' directory): letters and digits of any script kept
    (an ASCII-only form made "队伍一" and "队伍二" one folder, `team`), every other run of characters one `-`."""
    slug = re.sub(r"[^\w.-]+", "-", unicodedata.normalize("NFC", name.strip())).strip("-.")
    slug = slug.encode()[:200].decode(errors="ignore")  # a folder name is at most 255 bytes; CJK is 3 a character
    return slug or "team"


# --------------------------------------------------------------------------- importing and checking


def import_submission_module(folder: Path, entry: str = "submission.py") -> types.ModuleType:
    """Import folder/submission.py (an open-division submission: its model.py) so that both
    `from .model import x` and `from model import x` work."""
    folder = Path(folder).resolve()
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]  # relative imports resolve inside the submission folder
    sys.modules[PACKAGE] = package
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # plain sibling imports
    # A worker the team starts with multiprocessing's spawn or forkserver imports the package by name to
    # unpickle a function of submission.py: it finds it through package_root, on the sys.path it inherits, and
    # this variable. A training rank has it from its start (workarea.rank_environment): set here, while NCCL's
    # threads may read the environment, only where it is not already so (the check's and model processes, a test).
    if os.environ.get(PACKAGE_DIR_ENV) != str(folder):
        os.environ[PACKAGE_DIR_ENV] = str(folder)
    if PACKAGE_ROOT not in sys.path:
        sys.path.append(PACKAGE_ROOT)
    path = folder / entry
    spec = importlib.util.spec_from_file_location(f"{PACKAGE}.{Path(entry).stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else str(path)
        raise SubmissionError(where, f"syntax error: {exc.msg}. Fix the line shown:\n{show_line(exc)}") from exc
    except ImportError as exc:
        raise SubmissionError(
            path, f"import failed: {exc}.",
            "import only packages installed in the event's environment, and siblings of submission.py",
        ) from exc
    except Exception as exc:
        raise SubmissionError(path, f"raised {type(exc).__name__} while importing: {exc}.",
                              f"importing {entry} must not fail") from exc
    return module


def show_line(exc: SyntaxError) -> str:
    """The offending line and a caret under the column Python points at (indentation trimmed, tabs expanded)."""
    text = (exc.text or "").rstrip("\n").expandtabs(4)
    if not text.strip():
        return "    (Python gave no source line)"
    stripped = text.lstrip()
    offset = max(1, (exc.offset or 1) - (len(text) - len(stripped)))
    width = max(1, ((exc.end_offset or 0) - (exc.offset or 0))) if exc.end_lineno in (None, exc.lineno) else 1
    return f"    {stripped}\n    {' ' * (min(offset, len(stripped) + 1) - 1)}{'^' * min(width, 40)}"


# CONFIG keys the harness itself reads (contract and default optimizer). Any other key belongs to the team's
# model, but a near miss of one of these is almost always a typo that silently leaves the default in force.
HARNESS_CONFIG_KEYS = ("micro_batch_size", "seq_len", "grad_accum_steps", "vocab_size", "learning_rate",
                       "weight_decay", "betas")
DEFAULTED_CONFIG_KEYS = {"grad_accum_steps": "1", "vocab_size": "the track's", "learning_rate": "1e-3",
                         "weight_decay": "0.1", "betas": "[0.9, 0.95]"}


def config_warnings(config: dict) -> list[str]:
    """Keys of CONFIG that resemble a key the harness reads but are not it (`learnig_rate`, `micro_batchsize`)."""
    out = []
    for key in config:
        if not isinstance(key, str) or key in HARNESS_CONFIG_KEYS:
            continue
        near = difflib.get_close_matches(key, HARNESS_CONFIG_KEYS, n=1, cutoff=0.8)
        if near and near[0] not in config:
            default = DEFAULTED_CONFIG_KEYS.get(near[0])
            out.append(f"CONFIG key {key!r} is not one the harness reads; did you mean {near[0]!r}?"
                       + (f" As written, {near[0]} keeps its default ({default})." if default else ""))
    return out


def _positive_int(config: dict, key: str, path: Path, problems: list, default: int | None = None) -> int | None:
    value = config.get(key, default)
    if value is None:
        problems.append(SubmissionError(path, f"CONFIG has no `{key}`.", f'add "{key}": <positive int> to CONFIG'))
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problems.append(SubmissionError(path, f"CONFIG[{key!r}] must be a positive int, got {value!r}.",
                                        f'set "{key}" to a positive integer'))
        return None
    return value


def inspect_submission(module: types.ModuleType, folder: Path,
                       vocab_size: int) -> tuple[Submission | None, list[SubmissionError]]:
    """Every contract problem that can be found without running the model, all at once."""
    path = folder / "submission.py"
    problems: list[SubmissionError] = []
    config = getattr(module, "CONFIG", None)
    if config is None:
        problems.append(SubmissionError(path, "defines no CONFIG.",
                                        "add CONFIG = {\"micro_batch_size\": ..., \"seq_len\": ...}"))
        config = {}
    elif not isinstance(config, dict):
        problems.append(SubmissionError(path, f"CONFIG must be a dict, got {type(config).__name__}.",
                                        "make CONFIG a dict"))
        config = {}
    config = dict(config)
    _positive_int(config, "micro_batch_size", path, problems)
    _positive_int(config, "seq_len", path, problems)
    config["grad_accum_steps"] = _positive_int(config, "grad_accum_steps", path, problems, default=1)
    clip = config.get("grad_clip")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
        problems.append(SubmissionError(path, f"CONFIG['grad_clip'] must be a positive number (a max gradient norm), "
                                        f"got {clip!r}.", 'set "grad_clip": 1.0, or remove it for no clipping'))
    if "vocab_size" not in config:
        config["vocab_size"] = vocab_size
    else:
        v = _positive_int(config, "vocab_size", path, problems)
        if v is not None and v < vocab_size:
            problems.append(SubmissionError(
                path, f"CONFIG['vocab_size'] = {v} is smaller than the track's vocabulary of {vocab_size}.",
                "remove vocab_size from CONFIG (the harness sets it) or set it >= the track's"))
    get_model = getattr(module, "get_model", None)
    if get_model is None:
        problems.append(SubmissionError(path, "defines no get_model.", "add `def get_model(config): ...` returning "
                                        "a torch.nn.Module (or import it from model.py)"))
    elif not callable(get_model):
        problems.append(SubmissionError(path, "get_model is not callable.", "define get_model as a function of config"))
    hooks = {}
    for name in ("build_optimizers", "lr_schedule"):
        hook = getattr(module, name, None)
        if hook is not None and not callable(hook):
            problems.append(SubmissionError(path, f"{name} is defined but not callable.",
                                            f"make {name} a function or remove it"))
        hooks[name] = hook if callable(hook) else None
    compile_flag = getattr(module, "COMPILE", False)
    if not isinstance(compile_flag, bool):
        problems.append(SubmissionError(path, f"COMPILE must be True or False, got {compile_flag!r}.",
                                        "set COMPILE = True or False"))
    try:
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        problems.append(SubmissionError(path, f"CONFIG must hold plain values (it is saved with the checkpoint): "
                                        f"{exc}.", "use numbers, strings, booleans, lists and dicts in CONFIG"))
    if problems:
        return None, problems
    return Submission(folder=folder, config=config, get_model=get_model, compile=compile_flag, **hooks), []


def check_submission(module: types.ModuleType, folder: Path, vocab_size: int) -> Submission:
    """The checked submission, or the first contract problem raised."""
    sub, problems = inspect_submission(module, folder, vocab_size)
    if problems:
        raise problems[0]
    return sub


def load_submission(folder: str | Path, vocab_size: int) -> Submission:
    folder = Path(folder).resolve()
    return check_submission(import_submission_module(folder), folder, vocab_size)


def check_forward_output(out: Any, batch: int, seq_len: int, vocab_size: int, with_targets: bool, file: str) -> None:
    """The model contract on one forward: (logits [B, T, V], scalar loss when targets were given)."""
    import torch

    fix = "forward(idx, targets=None) must return (logits, loss)"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        got = f"a {type(out).__name__}" + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise SubmissionError(file, f"forward returned {got}, not a pair (logits, loss).", fix)
    logits, loss = out
    if not isinstance(logits, torch.Tensor):
        raise SubmissionError(file, f"forward's logits are a {type(logits).__name__}, not a tensor.", fix)
    if tuple(logits.shape) != (batch, seq_len, vocab_size):
        raise SubmissionError(
            file, f"forward's logits have shape {tuple(logits.shape)}, expected {(batch, seq_len, vocab_size)} "
            "[batch, seq_len, vocab_size].", "return logits for every position, over the whole (padded) vocabulary")
    if not logits.is_floating_point():
        raise SubmissionError(file, f"forward's logits have dtype {logits.dtype}, not a float type.", fix)
    if with_targets:
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            what = f"shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__
            raise SubmissionError(file, f"forward's loss is {what}, not a scalar tensor.",
                                  "return the mean cross-entropy as a 0-dim tensor when targets are given")
        if not loss.is_floating_point():
            raise SubmissionError(file, f"forward's loss has dtype {loss.dtype}.", "return a float loss")
