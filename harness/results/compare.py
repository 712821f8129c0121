"""`harness compare A B [C ...]`: does one submission really beat another?

Each side is a team name (its official ok runs of its latest submission), a run id, or a run
directory. Every metric is shown side by side with the difference from the first side (the
reference), a 95% Welch interval and a Welch t-test p-value; with a single run on a side no
significance is claimed, nor for a figure that does not vary between the runs of either side (params,
flops_per_token; steps and tokens of runs bounded by steps): it is said to be constant, with each side's
value, and no verdict rests on it. Throughput is compared as a ratio. An overlay chart shows the loss
curves of every run of every side.

The verdict also says when the comparison cannot be trusted whatever the p-value: sides made
differently (another track, budget, --max-steps, world size, precision, data, or, for runs
bounded by time, another machine), and run-to-run noise as large as the difference (on a busy
laptop the same seed has given 2.03 and 2.33), with what to do: more seeds, runs bounded by steps.
The overlay chart is harness/results/charts/compare_chart.py's.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.results.leaderboard import current_runs, scored
from harness.results.records import iter_run_dirs, match_runs, read_record_json, upgrade_record
from harness.results.stats import POWER, RUNS_NEEDED_MAX, Comparison, is_finite, runs_needed, summarize, welch
from harness.tracks.resolve import track_flag

# (field, label, how differences are shown)
METRICS = [
    ("val_loss", "val_loss", "diff"),
    ("loss_gap", "loss_gap", "diff"),  # val_loss - the data's floor: what compares across machines' local draws
    ("train_loss", "train_loss", "diff"),
    ("tokens_per_s", "tokens_per_s", "ratio"),
    ("mfu", "mfu", "diff"),
    ("comm_overlap_efficiency", "comm_overlap_efficiency", "diff"),
    ("steps", "steps", "diff"),
    ("tokens", "tokens", "diff"),
    ("train_time_s", "train_time_s", "diff"),
    ("params", "params", "diff"),
    ("flops_per_token", "flops_per_token", "diff"),
    ("peak_mem_gib", "peak_mem_gib", "diff"),
]


@dataclass
class Side:
    label: str
    runs: list[dict] = field(default_factory=list)  # raw run.json contents, with "run_dir"
    left_out: list[dict] = field(default_factory=list)  # the team's runs made another way (one_setup)
    note: str | None = None  # what was left out and what is compared, said first in the verdict

    def values(self, key: str) -> list[float]:
        """The side's figures for a metric; missing and non-finite ones are left out (never averaged in)."""
        return [float(r[key]) for r in self.runs if is_finite(r.get(key))]


def _load(run_dir: Path) -> dict:
    raw = upgrade_record(read_record_json(run_dir / "run.json"))
    raw["run_dir"] = str(run_dir)
    return raw


def resolve_side(key: str, runs_root: Path, track: str | None, include_unofficial: bool,
                 max_steps: int | None = None) -> Side:
    """A side from a run directory, a run id (or unique prefix), or a team name. A team side holds the runs of
    one setup (one_setup): those bounded by `max_steps` steps where given (0: by the time budget), and of those
    the ones made as its newest run was. A run named by id or directory is taken as named."""
    path = Path(key)
    if (path / "run.json").is_file():
        raw = _load(path)
        return Side(f"{raw['team']}/{raw['run_id']}", [raw])
    dirs = list(iter_run_dirs(runs_root, track))
    by_id = match_runs(runs_root, key, track)
    if len(by_id) == 1:
        raw = _load(by_id[0])
        return Side(f"{raw['team']}/{raw['run_id']}", [raw])
    loaded = [_load(d) for d in dirs]
    team_runs = [r for r in loaded if r.get("team") == key]
    if not team_runs:
        if len(by_id) > 1:
            raise LookupError(f"{key!r} matches {len(by_id)} runs: give more of the run id")
        teams = sorted({str(r.get("team")) for r in loaded})
        hint = difflib.get_close_matches(key, teams, n=1)
        raise LookupError(f"{key!r} is not a run directory, a run id or a team under {runs_root}"
                          + (f" (track {track})" if track else "") + "."
                          + (f" Did you mean: {hint[0]}?" if hint else "")
                          + (f" Teams: {', '.join(teams)}." if teams and len(teams) <= 20 else ""))
    tracks = sorted({r["track_name"] for r in team_runs})
    if len(tracks) > 1:
        raise LookupError(f"team {key!r} has runs on tracks {', '.join(tracks)}: choose one with --track")
    # Every run bounded by steps is unofficial: asking for them is asking for unofficial runs.
    include_unofficial = include_unofficial or bool(max_steps)
    eligible = [r for r in team_runs if r.get("official") or include_unofficial]
    counted = current_runs(eligible).get(key, [])
    ok = [r for r in counted if scored(r)]
    if not ok:
        raise LookupError(f"team {key!r} has no {'' if include_unofficial else 'official '}ok run to compare"
                          + ("" if include_unofficial else " (--all includes unofficial runs)"))
    return one_setup(Side(key, ok), max_steps)


def compare(sides: list[Side]) -> list[dict[str, Any]]:
    """One row per metric: each side's mean and n, and each later side against the first."""
    ref = sides[0]
    rows = []
    for key, label, mode in METRICS:
        row: dict[str, Any] = {"metric": label}
        for side in sides:
            vals = side.values(key)
            s = summarize(vals) if vals else None
            row[side.label] = None if s is None else s.mean
            # A side whose runs all gave one figure has that figure, not an interval of width 0 around it.
            row[f"{side.label} ci95"] = None if s is None or constant([vals]) else s.ci95
            row[f"{side.label} n"] = len(vals)
        for side in sides[1:]:
            a, b = ref.values(key), side.values(key)
            prefix = f"{side.label} vs {ref.label}"
            if not a or not b:
                row[f"{prefix}: diff"] = row[f"{prefix}: ci95"] = row[f"{prefix}: p"] = None
                row[f"{prefix}: note"] = "missing on a side"
                continue
            cmp = difference(b, a)
            if mode == "ratio":
                ma, mb = sum(a) / len(a), sum(b) / len(b)
                row[f"{prefix}: ratio"] = mb / ma if ma else None
            row[f"{prefix}: diff"] = cmp.diff
            row[f"{prefix}: ci95"] = cmp.ci95
            row[f"{prefix}: p"] = cmp.p_value
            row[f"{prefix}: note"] = cmp.note
        rows.append(row)
    return rows


def verdict(sides: list[Side]) -> list[str]:
    """Plain sentences on val_loss, for each side against the first: whether the two are comparable at all,
    who is lower and whether it is significant, whether the run-to-run noise is larger than the difference
    (and what to do), and seeds repeated within a side."""
    ref = sides[0]
    lines = [s.note for s in sides if s.note]  # what each mean is of, before anything is said of the means
    for side in sides[1:]:
        cmp = difference(side.values("val_loss"), ref.values("val_loss"))
        lines += [line for line in (comparability_line(ref, side), welch_line(ref, side, cmp)) if line]
        lines += noise_lines(ref, side, cmp)
    lines += [line for s in sides if (line := repeated_seeds_line(s))]
    return list(dict.fromkeys(lines))  # what is said of the reference alone is said once, not once per side


# What is said of a figure that no run of either side varied: no test is made on it.
CONSTANT = "the figure does not vary between the runs of either side: no test can be made"


def constant(per_side: list[list[float]]) -> bool:
    """Every side holds two runs or more and each side's runs all gave one figure (params, flops_per_token; steps
    and tokens of runs bounded by steps; val_loss of a seed repeated bounded by steps). A spread of 0 measures no
    noise: a t-test on it calls any difference certain (p = 0) and none a difference at all (p = 1)."""
    return all(len(v) >= 2 and max(v) - min(v) <= 1e-12 * max(1.0, *(abs(x) for x in v)) for v in per_side)


def difference(b: list[float], a: list[float]) -> Comparison:
    """Welch's test of mean(b) - mean(a), but none where the figure is constant within each side: the difference,
    exact, and CONSTANT as the note."""
    cmp = welch(b, a)
    return Comparison(cmp.diff, None, None, CONSTANT) if constant([a, b]) else cmp


def welch_line(ref: Side, side: Side, cmp: Comparison) -> str:
    if cmp.diff == 0:
        return f"{ref.label} and {side.label} have the same mean val_loss."
    better, worse = (side.label, ref.label) if cmp.diff < 0 else (ref.label, side.label)
    by = format_number(abs(cmp.diff))
    if cmp.p_value is None:
        return f"{better} has the lower val_loss than {worse} by {by}, but {cmp.note}."
    interval = f"{by} ± {format_number(cmp.ci95)} (95% CI), Welch {p_phrase(cmp.p_value)}"
    if cmp.significant:
        return f"{better} beats {worse} by {interval}: significant."
    return f"{better} is lower than {worse} by {interval}: not significant at 0.05."


# --------------------------------------------------------------------------- numbers, one way

# A t-test's p below this speaks of the normal distribution's tails, not of a few runs; the leaderboard's floor too.
P_FLOOR = 1e-3


def format_number(value: float | None, signed: bool = False) -> str:
    """Every figure `harness compare` prints, in its table and its verdict alike: 4 significant digits,
    whole numbers with grouped thousands from 1000 up."""
    if value is None:
        return "-"
    sign = "+" if signed else ""
    # Decided on the rounded figure: 999.96 is 1,000 at 4 digits, not "1000".
    return f"{value:{sign},.0f}" if abs(float(f"{value:.4g}")) >= 1000 else f"{value:{sign}.4g}"


def format_p(p: float | None) -> str:
    """A p-value, never `0`: a test on a handful of runs makes no difference certain (and two sides without
    spread give p = 0.0 exactly); below P_FLOOR it is `< 0.001`."""
    if p is None:
        return "n/a"
    return f"< {P_FLOOR:g}" if p < P_FLOOR else f"{p:.3g}"


def p_phrase(p: float) -> str:
    text = format_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"


# --------------------------------------------------------------------------- are the two sides comparable?

# What a record says of how its val_loss was made, with the name a sentence uses. Sides that differ in any of
# these compare their setups as much as their models.
SETUP_KEYS = (("track", "track"), ("max_steps", "--max-steps"),
              ("budget_s", "budget_s"), ("world_size", "world size"), ("precision", "precision"),
              ("machine", "machine (runs bounded by time)"), ("data", "data fingerprint"))


def setup_of(run: dict) -> dict[str, Any]:
    """How a run was made, as far as it decides its val_loss; None where the record does not say."""
    track = run.get("track") or {}
    bound = track.get("max_steps")  # absent from records made before --max-steps: they trained to the budget
    max_steps = bound if isinstance(bound, int) and not isinstance(bound, bool) and bound > 0 else 0
    machine = run.get("machine") or {}
    hardware = ", ".join(f"{v}" for v in (run.get("device_name"), machine.get("cpu")) if v)
    if hardware and machine.get("cores"):
        hardware += f" ({machine['cores']} cores)"
    return {
        "track": run.get("track_name"),
        "max_steps": max_steps,
        # Bounded by steps, a run trains the same steps under any budget it finishes within, on any machine;
        # bounded by time, a faster machine (or a quieter moment) trains more of them.
        "budget_s": None if max_steps else (run.get("budget_s") or track.get("budget_s")),
        "machine": None if max_steps else (hardware or None),
        "world_size": run.get("world_size"),  # the global batch: the tokens a step sees
        "precision": run.get("precision"),
        "data": run.get("data_fingerprint"),
    }


def _setup_values(side: Side, key: str) -> list[str]:
    values = {v for r in side.runs if (v := setup_of(r)[key]) is not None}
    if key == "max_steps":
        return sorted(str(v) if v else "none (the time budget)" for v in values)
    return sorted(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def setup_differences(ref: Side, side: Side) -> list[str]:
    """Each way the two sides' runs were made differently (or a side's runs among themselves), as
    'what (A: x; B: y)'. A figure one side's records do not hold is not a difference."""
    out = []
    for key, name in SETUP_KEYS:
        a, b = _setup_values(ref, key), _setup_values(side, key)
        if a and b and (a != b or len(a) > 1 or len(b) > 1):
            out.append(f"{name} ({ref.label}: {', '.join(a)}; {side.label}: {', '.join(b)})")
    return out


def comparability_line(ref: Side, side: Side) -> str | None:
    diffs = setup_differences(ref, side)
    if not diffs:
        return None
    data = (" (on the synthetic local tracks each machine draws its own data: compare loss_gap)"
            if any(d.startswith("data") for d in diffs) else "")
    return (f"{ref.label} and {side.label} are not comparable: their runs differ in {'; '.join(diffs)}. A "
            f"difference in val_loss measures the setups as much as the models{data}: run both the same way.")


# --------------------------------------------------------------------------- one setup a side

# How a sentence names one figure of a setup (setup_of), in SETUP_KEYS' order.
SETUP_PHRASES = {"track": "on track {}", "budget_s": "with a {}s budget", "world_size": "at world size {}",
                 "precision": "in {}", "machine": "on {}", "data": "with data fingerprint {}"}


def _newest(run: dict) -> tuple[str, str]:
    return run.get("started_at") or "", str(run.get("run_id", ""))  # as leaderboard.current_runs orders runs


def _same_setup(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """A figure one record does not hold is not a difference (as in setup_differences)."""
    return all(a[key] is None or b[key] is None or a[key] == b[key] for key, _ in SETUP_KEYS)


def _differs(a: dict[str, Any], b: dict[str, Any], key: str) -> bool:
    return a[key] is not None and b[key] is not None and a[key] != b[key]


def one_setup(side: Side, max_steps: int | None = None) -> Side:
    """The side's runs made one way, so that its mean is of one setup: a team that made an official run bounded
    by the time budget and then seeds at --max-steps 200 of the same submission holds both kinds. With
    `max_steps`, the runs bounded by that many steps (0: by the time budget); of those (or of all), the runs
    made as the newest one was. The rest is kept in `left_out`, and `note` says what was left out."""
    bounded = [r for r in side.runs if max_steps is None or setup_of(r)["max_steps"] == max_steps]
    if not bounded:
        raise LookupError(f"team {side.label!r} has no ok run {_bound_phrase(max_steps)} of its latest submission: "
                          f"its ok runs are {_counted(side.runs, lambda r: ['max_steps'])}")
    newest = setup_of(max(bounded, key=_newest))
    kept = [r for r in bounded if _same_setup(setup_of(r), newest)]
    left = [r for r in side.runs if not any(r is k for k in kept)]
    if not left:
        return Side(side.label, kept)
    # Each left-out run is named by what it differs in; the compared ones by everything any of those differ in.
    differs = {id(r): [key for key, _ in SETUP_KEYS if _differs(setup_of(r), newest, key)] for r in left}
    every = [key for key, _ in SETUP_KEYS if any(key in keys for keys in differs.values())]
    why = ""
    if len(kept) < len(bounded):  # the newest run chose, not the user
        why = " (the setup of its newest run" + ("; `--max-steps N` chooses" if max_steps is None and
                                                 "max_steps" in every else "") + ")"
    note = (f"{side.label}: {_counted(left, lambda r: differs[id(r)])} left out; compared: "
            f"{_counted(kept, lambda r: every)}{why}.")
    return Side(side.label, kept, left, note)


def _bound_phrase(max_steps: int | None) -> str:
    return "bounded by the time budget" if not max_steps else f"at --max-steps {max_steps}"


def _setup_phrase(setup: dict[str, Any], keys: list[str]) -> str:
    parts = []
    for key, _ in SETUP_KEYS:
        if key in keys and key == "max_steps":
            parts.append(_bound_phrase(setup[key]))
        elif key in keys and setup[key] is not None:
            value = setup[key]
            parts.append(SETUP_PHRASES[key].format(f"{value:g}" if isinstance(value, float) else value))
    return ", ".join(parts)


def _counted(runs: list[dict], keys_of: Callable[[dict], list[str]]) -> str:
    """'1 run bounded by the time budget and 5 runs at --max-steps 200': runs counted by how they were made, each
    as far as `keys_of` it says."""
    phrases = [_setup_phrase(setup_of(r), keys_of(r)) for r in runs]
    groups = list(dict.fromkeys(phrases))  # in the order first met
    return " and ".join(f"{phrases.count(g)} run{'' if phrases.count(g) == 1 else 's'}" + (f" {g}" if g else "")
                        for g in groups)


# --------------------------------------------------------------------------- is the noise larger than the difference?

STEPS_VARY = 0.05  # one submission's runs on one budget that differ by more than this in steps: the machine varied


def noise_lines(ref: Side, side: Side, cmp: Comparison) -> list[str]:
    """Said plainly when the run-to-run spread of val_loss (each side's standard deviation) is at least the
    difference of the means, or cannot be measured, or the runs are too few to tell; then why the runs spread
    (time-bound runs that trained different numbers of steps) and what to do."""
    diff = abs(cmp.diff)
    stds = {s.label: summarize(v).std for s in (ref, side) if (v := s.values("val_loss"))}
    measured = {label: std for label, std in stds.items() if std is not None}
    if cmp.note == CONSTANT and diff != 0:  # every run of each side gave one figure: no noise was measured
        values = "; ".join(f"{s.label} {format_number(s.values('val_loss')[0])}" for s in (ref, side))
        head = (f"val_loss did not vary between the runs of either side ({values}): the same figure again (a seed "
                "repeated, bounded by steps) measures no run-to-run noise, so this difference cannot be tested.")
        return [head, *causes(ref, side), advice(ref, side, seeds_needed(None, diff))]
    if not measured:
        head = (f"One run a side: the run-to-run noise cannot be measured, and on a busy machine it can be larger "
                f"than this difference ({format_number(diff)}).")
        return [head, *causes(ref, side), advice(ref, side, seeds_needed(None, diff))]
    noise = max(measured.values())
    if cmp.significant and noise < diff:
        return []
    if noise == 0 and diff == 0:  # not noise as large as a difference: nothing moved at all
        return [f"{ref.label} and {side.label} are identical within the measurement: every run on both sides gave "
                "the same val_loss."]
    spread = "; ".join(f"{label} {format_number(std)}" for label, std in measured.items())
    if noise >= diff:
        head = (f"The run-to-run noise is larger than the difference: val_loss std {spread}, against a difference "
                f"of {format_number(diff)}.")
    else:
        head = (f"The run-to-run noise (val_loss std {spread}) is below the difference of {format_number(diff)}, "
                "but there are too few runs to tell.")
    if cmp.significant:
        return [head + " The means differ significantly over these runs; a single run of either could come out ahead."]
    return [head, *causes(ref, side), advice(ref, side, seeds_needed(noise, diff))]


def seeds_needed(noise: float | None, diff: float) -> str:
    """The seeds a side the advice asks for: what a t-test needs to find the observed difference at the measured
    spread (stats.runs_needed), none promised past RUNS_NEEDED_MAX."""
    if noise is None:
        return "at least 3 a side: their spread says how many are needed"
    needed = runs_needed(noise, diff)
    if needed is None:
        return f"more than {RUNS_NEEDED_MAX} a side: at this spread the difference cannot be told apart from noise"
    return (f"about {format_number(needed)} a side to detect a difference of {format_number(diff)} (the one "
            f"observed) with {POWER:.0%} power")


def _bounded_alike(ref: Side, side: Side) -> bool:
    """Both sides bounded by the same number of steps: the machine's speed is out of their result already."""
    bounds = {setup_of(r)["max_steps"] for r in ref.runs + side.runs}
    return len(bounds) == 1 and 0 not in bounds


def causes(ref: Side, side: Side) -> list[str]:
    return [] if _bounded_alike(ref, side) else [line for s in (ref, side) if (line := steps_varied(s))]


def advice(ref: Side, side: Side, seeds: str) -> str:
    """What makes the comparison fair: enough seeds (`seeds`, from seeds_needed), and (unless both sides already
    are) runs bounded by the same number of steps, whose result does not depend on how fast the machine was at
    the time."""
    todo = [f"more seeds ({repeat_command(ref, side)}: {seeds})"]
    if not _bounded_alike(ref, side):
        runs = ref.runs + side.runs
        trained = [int(r["steps"]) for r in runs if not setup_of(r)["max_steps"] and is_finite(r.get("steps"))]
        steps = str(min(trained)) if trained else "N"
        fits = ": what the slowest of these runs trained in its budget, so both finish within it" if trained else ""
        # --max-steps on compare too: under --all each side would also hold its runs bounded by time.
        todo.append(f"the same number of steps for both (`--max-steps {steps}`{fits}), compared with "
                    f"`harness compare ... --max-steps {steps}` (runs bounded by steps are unofficial: it counts them)")
    return "For a fair comparison: " + "; and ".join(todo) + "."


def next_seed(side: Side) -> int:
    """The first seed past every seed a side has run: `--repeat N` counts up from `--seed` (1 unless given), so
    more runs started at the default would repeat seeds already run, which repeated_seeds_line then names."""
    seeds = [r["seed"] for r in side.runs if isinstance(r.get("seed"), int) and not isinstance(r["seed"], bool)]
    return max(seeds, default=0) + 1


def repeat_command(ref: Side, side: Side) -> str:
    """The command that adds seeds to both sides, each starting past its own, on their track."""
    starts = {s.label: next_seed(s) for s in (ref, side)}
    run = f"harness run SUBMISSION{track_flag(ref.runs + side.runs)}"
    if len(set(starts.values())) == 1:
        return f"`{run} --seed {starts[ref.label]} --repeat N`"
    each = " and ".join(f"{seed} for {label}" for label, seed in starts.items())
    return f"`{run} --seed S --repeat N`, S = {each}"


def steps_varied(side: Side) -> str | None:
    """One submission's runs on one time budget train about the same steps on a quiet machine; when they did
    not, the machine's speed changed under them, and val_loss with it."""
    steps = [int(r["steps"]) for r in side.runs if not setup_of(r)["max_steps"] and is_finite(r.get("steps"))]
    if len(steps) < 2 or max(steps) - min(steps) <= STEPS_VARY * max(steps):
        return None
    return (f"{side.label}'s runs trained {format_number(min(steps))} to {format_number(max(steps))} steps in their "
            "budget: the machine's speed changed under them, and val_loss with it.")


def repeated_seeds_line(side: Side) -> str | None:
    """A seed run twice measures the machine, not the spread between seeds that two models' means must be told
    apart from (bounded by steps, it repeats the same figure and shows a spread of 0)."""
    seeds = [r.get("seed") for r in side.runs if r.get("seed") is not None]
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if not repeated:
        return None
    return (f"{side.label} ran seed {', '.join(map(str, repeated))} more than once: a repeated seed is the same "
            "model and data order again (bounded by steps, the same figure), not another draw; `--repeat N` takes "
            "consecutive seeds from `--seed` (1 unless given): start it past the seeds already run.")
