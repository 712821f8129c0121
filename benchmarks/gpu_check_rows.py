"""benchmarks/gpu_check.py's checks and its one table: what each run's record, its re-evaluations, the
watch on its scorers and its submission's own reports say, one row per figure or check.

A cell is a figure (info), a check that holds (ok) or not (fail, with the reason under the table),
skipped (cannot hold on a CPU: the CPU smoke), unavailable (the host lacks what it checks: the sandbox's
rows on a kernel without Landlock, where every run is measured without it), or "-" (does not apply to
that run). The table's first row says what the host offers the sandbox (`host_rows`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpu_check_parts import DRIVER_ONLY, HostSandbox, Sizes

OK, FAIL, SKIP, INFO, NA, UNAVAILABLE = "ok", "fail", "skip", "info", "na", "unavailable"
AGREE = 1e-5  # evaluation at 1 rank and at every rank: the same figure (every token scored once either way)


@dataclass
class Cell:
    text: str
    state: str = INFO
    why: str = ""
    note: str = ""  # said under the table whatever the state (what a figure does not cover)


@dataclass
class Column:
    """One run: what it is, and what came back."""

    name: str
    kind: str  # "big" (the 124M-class baseline), "small" (compiled code in forward), "open" (DataLoader script)
    compiled: bool = False  # expected in the record (the big runs)
    record: dict | None = None
    run_dir: Path | None = None
    error: str = ""  # why there is no record
    evals: dict = field(default_factory=dict)  # harness eval: ranks -> val_loss, or the failure's text
    scorers: dict = field(default_factory=dict)  # ScorerWatch.scorers, over the run and its re-evaluations
    probes: list = field(default_factory=list)  # the compiled-forward submission's model-process reports
    dataloader: dict | None = None  # the open-division script's report
    seconds: dict = field(default_factory=dict)  # wall time of each harness command: "run", "eval at N"


def check(holds: bool, text: str, why: str = "") -> Cell:
    return Cell(text, OK, "") if holds else Cell(f"FAIL {text}", FAIL, why)


def skip(why: str) -> Cell:
    return Cell("skipped", SKIP, why)


def num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


# --------------------------------------------------------------------------- the rows


def status(c: Column, s: Sizes) -> Cell:
    r = c.record
    flagged = f" flagged: {r.get('flag_reason')}" if r.get("flagged") else ""
    holds = r["status"] == "ok" and not r.get("flagged") and not c.error
    return check(holds, r["status"] + (" flagged" if flagged else ""),
                 "; ".join(w for w in (r.get("reason"), flagged.strip(), c.error) if w))


def mfu(c: Column, s: Sizes) -> Cell:
    if c.kind != "big":
        return Cell("-", NA)
    if not s.gpu:
        return skip("a CPU has no peak FLOP/s: MFU is null off a GPU")
    m = c.record.get("mfu")
    return check(bool(m), num(m and 100 * m, ".1f") + "%", "no MFU: the device's peak FLOP/s is unknown to the harness "
                 f"({c.record.get('device_name')})")


def mfu_median(c: Column, s: Sizes) -> Cell:
    """MFU at the median step: the compile step and the first steps' warm-up left out."""
    r = c.record
    if c.kind != "big":
        return Cell("-", NA)
    if not s.gpu:
        return skip("a CPU has no peak FLOP/s: MFU is null off a GPU")
    parts = (r.get("flops_per_token"), r.get("tokens_per_step"), r.get("median_step_s"), r.get("peak_flops_per_device"))
    if not all(parts):
        return Cell("-")
    flops, tokens, step_s, peak = parts
    return Cell(f"{100 * flops * tokens / step_s / (peak * (r.get('world_size') or 1)):.1f}%")


def precision(c: Column, s: Sizes) -> Cell:
    if not s.gpu:
        return skip("bf16 on the device is a GPU's: the smoke runs the track's dtype = auto on the CPU")
    p = c.record.get("precision")
    return check(p == "bfloat16", str(p), f"the run computed in {p}: {c.record.get('precision_reason')}")


def backend(c: Column, s: Sizes) -> Cell:
    if not s.gpu:
        return skip("NCCL is a GPU's: the smoke's ranks use gloo")
    name, nccl = c.record["track"].get("backend"), (c.record.get("versions") or {}).get("nccl")
    return check(name == "nccl" and bool(nccl) and c.record["status"] == "ok", f"{name} {nccl}",
                 f"backend {name}, NCCL {nccl}, status {c.record['status']}")


def _active(report) -> tuple[bool, str]:
    if not isinstance(report, dict) or not report:
        return False, "no sandbox report"
    if "active" in report:
        return bool(report["active"]), str(report.get("why"))
    found = [_active(sub) for sub in report.values()]  # evaluation: one report per model process
    return all(a for a, _ in found), "; ".join(f"{name}: {why}" for name, (a, why) in zip(report, found) if not a)


def sandbox(phase: str):
    def row(c: Column, s: Sizes) -> Cell:
        active, why = _active((c.record.get("sandbox") or {}).get(phase))
        return check(active, "active" if active else "off", f"the {phase} sandbox was not active: {why}")
    return row


def forked(c: Column, s: Sizes) -> Cell:
    how = (c.record.get("eval") or {}).get("model_processes")
    return check(how == "forked from a clean template", "yes" if how == "forked from a clean template" else "no",
                 f"evaluation's model processes: {how}")


def causality(c: Column, s: Sizes) -> Cell:
    ca = (c.record.get("eval") or {}).get("causality")
    if not ca:
        return check(False, "none", "the record has no causality check")
    worst, tol = ca.get("worst_deviation"), ca.get("tolerance")
    return check(worst is not None and worst <= tol, num(worst, ".1e"), f"worst deviation {worst} > tolerance {tol}")


def compiled(c: Column, s: Sizes) -> Cell:
    if c.kind != "big":
        return Cell("-", NA)
    got = bool(c.record.get("compiled"))
    return check(got == c.compiled, "yes" if got else "no", f"the record says compiled={got}, expected {c.compiled}")


def agree(c: Column, s: Sizes) -> Cell:
    if not c.evals:
        return Cell("-", NA)
    figures = {"the run": c.record.get("val_loss"), **{f"{n} rank(s)": v for n, v in c.evals.items()}}
    values = [v for v in figures.values() if isinstance(v, float)]
    spread = max(values) - min(values) if len(values) == len(figures) else None
    cell = check(spread is not None and spread <= AGREE, num(spread, ".1e"),
                 "val_loss " + ", ".join(f"{k} {v}" for k, v in figures.items()) + f" (must agree within {AGREE})")
    if s.gpu and set(c.evals) == {1}:  # every rank is one rank: the run's own figure against a fresh evaluation
        cell.note = ("this machine has 1 GPU: evaluated at 1 process only (the run's figure against `harness eval`'s); "
                     "the invariance across N processes needs a box with N GPUs")
    return cell


def scorers(c: Column, s: Sizes) -> Cell:
    n, clean = len(c.scorers), sum(1 for v in c.scorers.values() if v is False or v == DRIVER_ONLY)
    cell = check(n > 0 and clean == n, f"{clean} of {n}", "no scorer process was seen" if not n else
                 f"{n - clean} scorer(s) opened a GPU (/dev/nvidia*) or could not be read: {c.scorers}")
    driver_only = sorted(pid for pid, v in c.scorers.items() if v == DRIVER_ONLY)
    if driver_only:
        cell.note = f"scorer(s) {driver_only}: {DRIVER_ONLY} (a library's link, no CUDA started)"
    return cell


def probe(what: str):
    """The compiled-forward submission's reports from inside evaluation's model processes (probe.py)."""
    def row(c: Column, s: Sizes) -> Cell:
        if c.kind != "small":
            return Cell("-", NA)
        p = c.probes
        expected = 2 * ((c.record.get("eval") or {}).get("eval_world_size") or 0)  # scoring + check, per scorer
        if len(p) != expected:
            return check(False, f"{len(p)} of {expected}",
                         f"{len(p)} model-process reports in the logs, expected {expected}")
        if what == "deterministic":
            held = all(x["inductor_deterministic_env"] == "1" and x["inductor_config_deterministic"] in (None, True)
                       for x in p)
            return check(held, "on" if held else "off", f"Inductor's deterministic mode in the model processes: {p}")
        if not s.gpu:
            return skip("no GPU: the model processes run on the CPU")
        if what == "one_gpu":
            held = all(x["cuda_devices"] == 1 and "," not in str(x["cuda_visible_devices"]) for x in p)
            seen = sorted({str(x["cuda_visible_devices"]) for x in p})
            return check(held, ",".join(seen), f"a model process saw more than its rank's GPU: {p}")
        held = all(x.get("pinned") and x.get("pending_error") == 0 for x in p)
        return check(held, "yes" if held else "no",
                     f"the logits buffer was not page-locked, or CUDA had an error pending: {p}")
    return row


def workers(c: Column, s: Sizes) -> Cell:
    if c.kind != "open":
        return Cell("-", NA)
    d = c.dataloader
    if d is None:
        return check(False, "no report", "the script's gpu-check-dataloader line is not in logs/rank0.log")
    held = set(range(d["num_workers"])) <= set(d["served_by"]) and -1 not in d["served_by"]
    return check(held, f"{len(d['served_by'])} of {d['num_workers']}", f"batches came from {d['served_by']}")


ROWS = [
    ("status", status),
    ("steps", lambda c, s: Cell(str(c.record.get("steps")))),
    ("tokens/s", lambda c, s: Cell(num(c.record.get("tokens_per_s"), ",.0f"))),
    ("MFU", mfu),
    ("MFU at the median step", mfu_median),
    ("peak memory GiB", lambda c, s: Cell(num(c.record.get("peak_mem_gib"), ".2f"))),
    ("start-up s", lambda c, s: Cell(num(c.record.get("startup_s"), ".1f"))),
    ("val_loss", lambda c, s: Cell(num(c.record.get("val_loss"), ".4f"))),
    ("eval tokens/s", lambda c, s: Cell(num((c.record.get("eval") or {}).get("eval_tokens_per_s"), ",.0f"))),
    ("precision bf16", precision),
    ("backend NCCL", backend),
    ("compiled", compiled),
    ("sandbox: training", sandbox("training")),
    ("sandbox: evaluation", sandbox("evaluation")),
    ("model procs forked", forked),
    ("causality deviation", causality),
    ("eval run/1/all ranks", agree),
    ("scorers without CUDA", scorers),
    ("model proc: 1 GPU", probe("one_gpu")),
    ("logits buffer pinned", probe("pinned")),
    ("Inductor deterministic", probe("deterministic")),
    ("DataLoader workers", workers),
]


SANDBOX_ROWS = ("sandbox: training", "sandbox: evaluation")


def host_rows(host: HostSandbox) -> list[str]:
    """The table's first row (two where both are missing): what this host offers the sandbox."""
    if host.landlock:
        rows = [f"sandbox: Landlock unavailable ({host.landlock}) — measured without it (the track's copy has "
                f"sandbox = \"off\")"]
        return rows + ([f"sandbox: user namespaces unavailable too ({host.userns})"] if host.userns else [])
    if host.userns:
        return [f"sandbox: Landlock ABI {host.landlock_abi}; user namespaces unavailable ({host.userns}) — "
                "measured with Landlock alone"]
    return [f"sandbox: Landlock ABI {host.landlock_abi} and user namespaces available — measured with them"]


def cells(columns: list[Column], sizes: Sizes, host: HostSandbox | None = None) -> dict[str, dict[str, Cell]]:
    """Every row of every run. `host` None: a host with the sandbox (the rows check that it was active)."""
    out = {}
    for c in columns:
        if c.record is None:
            out[c.name] = {label: Cell("-", NA) for label, _ in ROWS}
            out[c.name]["status"] = Cell("FAIL no record", FAIL, c.error)
            continue
        out[c.name] = {label: fn(c, sizes) for label, fn in ROWS}
        if host is not None and host.landlock:  # the runs were told to go without: not the harness's failure
            for label in SANDBOX_ROWS:
                out[c.name][label] = Cell("unavailable", UNAVAILABLE,
                                          f"Landlock unavailable on this host ({host.landlock}): measured without it")
    return out


def table(columns: list[Column], table_cells: dict[str, dict[str, Cell]], host: HostSandbox | None = None) -> str:
    width = max(16, *(len(c.name) + 2 for c in columns))
    lines = host_rows(host) + [""] if host is not None else []
    lines += [f"{'':<24}" + "".join(f"{c.name:>{width}}" for c in columns)]
    for label, _ in ROWS:
        row = [table_cells[c.name][label].text for c in columns]
        lines.append(f"{label:<24}" + "".join(f"{t[:width - 1]:>{width}}" for t in row))
    failed = [(c.name, label, cell.why) for c in columns for label, cell in table_cells[c.name].items()
              if cell.state == FAIL]

    def once(state: str) -> list[tuple[str, str]]:  # (row, why), each said once for every run it applies to
        return sorted({(label, cell.why) for c in columns for label, cell in table_cells[c.name].items()
                       if cell.state == state})

    notes = sorted({(label, cell.note) for c in columns for label, cell in table_cells[c.name].items() if cell.note})
    lines += [""] + [f"FAIL  {name} / {label}: {why}" for name, label, why in failed]
    lines += [f"off   {label}: {why}" for label, why in once(UNAVAILABLE)]
    lines += [f"skip  {label}: {why}" for label, why in once(SKIP)]
    lines += [f"note  {label}: {note}" for label, note in notes]
    return "\n".join(lines)
