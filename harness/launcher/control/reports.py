"""What a report on the control channel may hold: one typed schema per kind, checked on arrival.

Reports come from processes that run a team's code (training ranks), or that a team's code could
have reached: every field is hostile input. The channel (harness/launcher/control/channel.py) passes each
message through `check` before anyone reads it; a message that breaks its schema is dropped, and
the channel notes it as `malformed`, which flags the run for review. Nothing a rank sends can
then put a string where the record, the leaderboard or a chart expects a number (a `steps` of
"many" once crashed `harness leaderboard` for every team), a negative count, an infinite time, a
status the launcher alone decides, or an object of unbounded size.

Numbers are range-checked to what a run can produce; strings and free-form objects (a team's
CONFIG, a sandbox report) are bounded in length. Unknown fields are a schema violation, except in
an open-division script's progress reports, which may carry a few extra scalars of its own.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

MAX_COUNT = 1 << 62  # steps, tokens, parameters: far above any run, far below float64's exact range
MAX_SECONDS = 1e7  # about 4 months: no phase of a run is longer
MAX_TEXT = 2_000
MAX_TRACEBACK = 60_000
MAX_OBJECT_BYTES = 60_000  # a CONFIG, a sandbox report, the causality evidence (as JSON): a frame's worth
MAX_EXTRA_FIELDS = 32  # an open-division script's own scalars per progress report


@dataclass(frozen=True)
class Field:
    check: Callable[[Any], bool]
    what: str
    optional: bool = False  # may be null

    def ok(self, value: Any) -> bool:
        return (value is None and self.optional) or (value is not None and self.check(value))


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def count(optional: bool = False) -> Field:
    return Field(lambda v: _is_int(v) and 0 <= v <= MAX_COUNT, "a count (an integer >= 0)", optional)


def integer(lo: int, hi: int, optional: bool = False) -> Field:
    return Field(lambda v: _is_int(v) and lo <= v <= hi, f"an integer in [{lo}, {hi}]", optional)


def seconds(optional: bool = False) -> Field:
    return Field(lambda v: _is_num(v) and math.isfinite(v) and 0 <= v <= MAX_SECONDS,
                 f"seconds (finite, 0 to {MAX_SECONDS:g})", optional)


def number(lo: float = -math.inf, hi: float = math.inf, nan: bool = False, optional: bool = False) -> Field:
    """A number in [lo, hi]; NaN only where a run can honestly produce one (a loss), never infinities
    outside the bounds."""
    def ok(v: Any) -> bool:
        if not _is_num(v):
            return False
        if math.isnan(v):
            return nan
        return lo <= v <= hi
    return Field(ok, f"a number in [{lo:g}, {hi:g}]" + (" or NaN" if nan else ""), optional)


def loss(optional: bool = True) -> Field:
    """A loss: finite and >= 0, or NaN / inf (a diverged run says so; the harness decides what it means)."""
    return Field(lambda v: _is_num(v) and (not math.isfinite(v) or v >= 0), "a loss (>= 0, or NaN/inf)", optional)


def text(max_len: int = MAX_TEXT, optional: bool = False) -> Field:
    return Field(lambda v: isinstance(v, str) and len(v) <= max_len, f"a string of at most {max_len} characters",
                 optional)


def sha256_hex(optional: bool = False) -> Field:
    return Field(lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v),
                 "a sha256 (64 lowercase hex digits)", optional)


def one_of(*values: str, optional: bool = False) -> Field:
    return Field(lambda v: v in values, f"one of {', '.join(values)}", optional)


def flag(optional: bool = False) -> Field:
    return Field(lambda v: isinstance(v, bool), "true or false", optional)


def _json_size(v: Any) -> int:
    try:
        return len(json.dumps(v, allow_nan=True))
    except (TypeError, ValueError, RecursionError):
        return MAX_OBJECT_BYTES + 1


MAX_DEPTH = 32  # objects and lists inside one another; a config, a sandbox report: a few levels


def _shallow(v: Any, max_depth: int = MAX_DEPTH) -> bool:
    """At most `max_depth` containers deep, measured without recursion: a report nested hundreds deep passes
    json on the channel's thread and then breaks every recursive reader of the record (dataclasses.asdict,
    json.dumps in save_record: RecursionError, the record left `running`, a free re-run)."""
    todo = [(v, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return False
            todo.extend((x, depth + 1) for x in (item.values() if isinstance(item, dict) else item))
    return True


def obj(max_bytes: int = MAX_OBJECT_BYTES, optional: bool = False) -> Field:
    return Field(lambda v: isinstance(v, dict) and _shallow(v) and _json_size(v) <= max_bytes,
                 f"an object of at most {max_bytes} bytes and {MAX_DEPTH} levels", optional)


def texts(max_items: int = 1000, optional: bool = False) -> Field:
    return Field(lambda v: isinstance(v, list) and len(v) <= max_items
                 and all(isinstance(s, str) and len(s) <= MAX_TEXT for s in v),
                 f"a list of at most {max_items} strings", optional)


_PROBE = {
    "comm_overlap_efficiency": number(0.0, 1e6, optional=True), "comm_probe_steps": count(),
    "comm_probe_synced_step_s": seconds(), "comm_probe_compute_step_s": seconds(),
    "comm_overlap_efficiency_min": number(0.0, 1e6, optional=True),
    "comm_overlap_efficiency_max": number(0.0, 1e6, optional=True), "comm_s": seconds(),
}
_SANDBOX = {"active": flag(), "why": text(), "abi": integer(0, 1000, True), "threads": integer(-1, 1 << 20, True),
            "policy": obj(), "namespaces": obj(), "filesystem": obj(), "seccomp": text(200, optional=True),
            "proc_writes": text(400, optional=True),
            "cgroup": obj(optional=True)}

SCHEMAS: dict[str, dict[str, Field]] = {
    "hello": {"pid": integer(1, 1 << 31), "local_rank": integer(0, 1 << 20), "group_rank": integer(0, 1 << 20),
              "world_size": integer(1, 1 << 20)},
    "sandbox": _SANDBOX,
    "setup_start": {},
    "train_start": {"clock_start": one_of("first_forward", "model_build")},
    "progress": {"step": count(), "train_time_s": seconds(), "train_loss": loss(), "lr_scale": number(-1e6, 1e6, True),
                 "tokens": count(optional=True), "tokens_per_s": number(0.0, 1e15, optional=True),
                 "grad_norm": number(0.0, math.inf, nan=True, optional=True), "reported": flag()},
    "train_end": {"step": count(), "tokens": count(optional=True), "train_time_s": seconds(),
                  "median_step_s": seconds(optional=True), "slowest_earlier_step_s": seconds(optional=True)},
    "checkpoint_saved": {"sha256": sha256_hex(), "bytes": count(), "save_s": seconds()},
    "result": {
        **_PROBE, "measured_tokens_per_s": number(0.0, 1e15, optional=True), "steps": count(), "tokens": count(),
        "train_time_s": seconds(), "params": count(), "peak_mem_gib": number(0.0, 1e6, optional=True),
        "data_wait_s": seconds(), "checkpoint_saved": flag(), "config": obj(), "tokens_per_step": count(),
        "weights_sha256": sha256_hex(), "device_name": text(200),
        "reports_dropped": count(), "train_loss": loss(), "max_step_s": seconds(), "median_step_s": seconds(),
        "slowest_earlier_step_s": seconds(), "first_step_s": seconds(optional=True),
        "compiled": flag(optional=True), "compile_skipped": flag(optional=True), "ddp": obj(optional=True),
        "last_step_start_s": seconds(), "first_step_loss": loss(), "first_step_relabeled_loss": loss(),
        "first_step_relabeled_spread": number(0.0, 1e6, nan=True, optional=True),
        "weights_changed_after_clock": flag(optional=True),
        "division": one_of("fixed", "open"),
    },
    "error": {"status": text(32), "reason": text(MAX_TRACEBACK), "traceback": text(MAX_TRACEBACK), "cause": text(64),
              "message": text(MAX_TEXT)},
    "eval_result": {
        "val_loss": number(nan=True, optional=True), "val_tokens": count(), "eval_world_size": integer(1, 1 << 20),
        "eval_time_s": seconds(), "eval_tokens_per_s": number(0.0, 1e15, optional=True), "causality": obj(optional=True),
        "sandbox": obj(), "sandbox_exposed": texts(), "scorer_clean": flag(), "model_processes": text(200),
        "val_loss_token_std": number(0.0, 1e6, optional=True), "model_compute": obj(optional=True),
        "logits_buffer": text(200, optional=True), "left_running": obj(optional=True),
    },
}
OPEN_EXTRAS = ("progress",)  # kinds where an open-division script may add scalars of its own (`reported` is set)


def check(kind: str, body: dict[str, Any]) -> str:
    """"" when the message fits its kind's schema, else what is wrong with it (one line)."""
    schema = SCHEMAS.get(kind)
    if schema is None:
        return f"an unknown kind of report {kind[:40]!r}"
    extras = 0
    for key, value in body.items():
        if key == "rank":
            continue  # replaced by the rank the connection is bound to
        field = schema.get(key)
        if field is None:
            if kind in OPEN_EXTRAS and body.get("reported") is True and _open_extra(key, value):
                extras += 1
                if extras <= MAX_EXTRA_FIELDS:
                    continue
                return f"{kind}: more than {MAX_EXTRA_FIELDS} extra fields"
            return f"{kind}: an unknown field {key[:40]!r}"
        if not field.ok(value):
            return f"{kind}: {key} = {_show(value)} is not {field.what}"
    return ""


def _open_extra(key: Any, value: Any) -> bool:
    """An open-division script's own scalar: a name, and a number (NaN and inf included: a script's grad
    norm may be either), a flag or a short string."""
    return (isinstance(key, str) and len(key) <= 64 and
            (isinstance(value, bool) or _is_num(value) or (isinstance(value, str) and len(value) <= 200)))


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
