"""`harness compare`'s verdict on records held in memory: when the comparison is fair, when the run-to-run noise
is larger than the difference, what to do, and how its numbers are written (never `p = 0`)."""

import re

import pytest

import harness.results.compare as compare
from harness.results.compare import Side, one_setup, verdict
from harness.results.stats import runs_needed, summarize


def run(val_loss: float, seed: int, *, steps: int = 290, max_steps: int = 0, **fields) -> dict:
    """A run.json as `harness run` writes it, reduced to what the verdict reads: the local track, 30 s, 2 ranks."""
    return {"val_loss": val_loss, "seed": seed, "steps": steps, "track_name": "local",
            "track": {"name": "local", "budget_s": 30.0, "max_steps": max_steps}, "budget_s": 30.0,
            "world_size": 2, "precision": "bfloat16", "device_name": "cpu",
            "machine": {"cpu": "AMD EPYC 7B13", "cores": 2}, "data_fingerprint": "5e1f", **fields}


def sides(a: list[dict], b: list[dict]) -> list[Side]:
    return [Side("A", a), Side("B", b)]


def test_noise_larger_than_the_difference_is_said_with_what_to_do():
    """The issue's laptop: one seed gave 2.03 and 2.33. Time-bound runs that trained 180 to 290 steps spread
    far more than the two models differ: the verdict says so, with how many seeds would be needed at this
    spread and a --max-steps that fits the slowest run's budget."""
    a = [run(2.03, 1, steps=290), run(2.33, 2, steps=180), run(2.10, 3, steps=260)]
    b = [run(2.00, 1, steps=280), run(2.25, 2, steps=200), run(2.15, 3, steps=250)]
    welch_line, noise, cause_a, cause_b, todo = verdict(sides(a, b))
    assert "not significant" in welch_line
    assert noise == ("The run-to-run noise is larger than the difference: val_loss std A 0.157; B 0.1258, against "
                     "a difference of 0.02.")
    assert cause_a.startswith("A's runs trained 180 to 290 steps in their budget: the machine's speed changed")
    assert cause_b.startswith("B's runs trained 200 to 280 steps")
    assert runs_needed(summarize([2.03, 2.33, 2.10]).std, 0.02, most=10_000) > 100  # a std 8 times the difference
    assert todo.startswith("For a fair comparison: more seeds (`harness run SUBMISSION --seed 4 --repeat N`: more than "
                           "100 a side: at this spread the difference cannot be told apart from noise)")
    assert "`--max-steps 180`" in todo and "`harness compare ... --max-steps 180`" in todo  # step-bound: unofficial


def test_one_run_a_side_says_the_noise_cannot_be_measured():
    welch_line, noise, todo = verdict(sides([run(2.03, 1)], [run(2.33, 1, steps=180)]))
    assert welch_line.startswith("A has the lower val_loss than B by 0.3, but one run on a side")
    assert noise.startswith("One run a side: the run-to-run noise cannot be measured")
    assert "`harness run SUBMISSION --seed 2 --repeat N`: at least 3 a side" in todo and "`--max-steps 180`" in todo


def test_sides_already_bounded_by_steps_are_told_to_run_more_seeds_only():
    a = [run(2.00, 1, steps=100, max_steps=100), run(2.10, 2, steps=100, max_steps=100)]
    b = [run(2.05, 1, steps=100, max_steps=100), run(1.98, 2, steps=100, max_steps=100)]
    welch_line, noise, todo = verdict(sides(a, b))  # the same steps: no runs that trained more than others
    assert "not significant" in welch_line
    assert noise.startswith("The run-to-run noise is larger than the difference")
    assert todo == ("For a fair comparison: more seeds (`harness run SUBMISSION --seed 3 --repeat N`: about 66 a side "
                    "to detect a difference of 0.035 (the one observed) with 80% power).")


def test_a_difference_far_inside_the_noise_asks_for_no_count_of_runs():
    """The count a t-test needs grows as (std / diff)^2: a difference of 0.0001 against a spread of 0.05 once
    asked for about 7,850,000 seeds a side. Past 100 a side the verdict says the difference cannot be told
    apart from noise."""
    a = [run(2.00, 1, steps=200, max_steps=200), run(2.10, 2, steps=200, max_steps=200)]
    b = [run(2.0001, 1, steps=200, max_steps=200), run(2.1001, 2, steps=200, max_steps=200)]
    _, noise, todo = verdict(sides(a, b))
    assert noise.startswith("The run-to-run noise is larger than the difference")
    assert todo == ("For a fair comparison: more seeds (`harness run SUBMISSION --seed 3 --repeat N`: more than 100 a "
                    "side: at this spread the difference cannot be told apart from noise).")


def test_identical_sides_are_said_to_be_identical_not_noisy():
    """Two sides bounded by the same steps that gave the same figures: no spread and no difference. That is not
    noise larger than a difference of 0: the verdict says the sides are identical within the measurement."""
    a = [run(2.00, 1, steps=200, max_steps=200), run(2.00, 2, steps=200, max_steps=200)]
    lines = verdict(sides(a, [dict(r) for r in a]))
    assert lines == ["A and B have the same mean val_loss.",
                     "A and B are identical within the measurement: every run on both sides gave the same val_loss."]


def test_the_advice_starts_new_seeds_past_those_already_run():
    """`--repeat N` counts up from `--seed`, 1 unless given: advice to run more seeds without a --seed repeated
    seeds 1.. and the next verdict named them. Each side is told where to start, and following the advice as
    typed adds no repeated seed."""
    a = [run(2.00 + 0.05 * (s % 2), s, steps=200, max_steps=200) for s in range(1, 6)]
    b = [run(2.01 + 0.05 * (s % 2), s, steps=200, max_steps=200) for s in range(1, 4)]
    todo = verdict(sides(a, b))[-1]
    assert todo.startswith("For a fair comparison: more seeds (`harness run SUBMISSION --seed S --repeat N`, S = 6 "
                           "for A and 4 for B: "), todo
    more_a = a + [run(2.0, s, steps=200, max_steps=200) for s in range(6, 9)]  # --seed 6 --repeat 3
    more_b = b + [run(2.0, s, steps=200, max_steps=200) for s in range(4, 7)]  # --seed 4 --repeat 3
    assert not any("more than once" in line for line in verdict(sides(more_a, more_b)))


def test_too_few_runs_below_the_noise_ask_for_the_runs_a_t_test_needs():
    """Spread below the difference, 2 runs a side, not significant: the count asked for is the t-test's (3),
    not the normal approximation's 2, which these runs already are."""
    a = [run(2.00, 1), run(2.02, 2)]
    b = [run(2.06, 1), run(2.09, 2)]
    _, noise, todo = verdict(sides(a, b))
    assert noise == ("The run-to-run noise (val_loss std A 0.01414; B 0.02121) is below the difference of 0.065, "
                     "but there are too few runs to tell.")
    assert "about 3 a side to detect a difference of 0.065 (the one observed) with 80% power" in todo


def test_a_clear_difference_is_not_buried_in_advice():
    """Guard: an honest, well-measured difference gets its one sentence."""
    a = [run(2.000, 1), run(2.010, 2), run(2.005, 3)]
    b = [run(2.100, 1), run(2.110, 2), run(2.120, 3)]
    assert verdict(sides(a, b)) == ["A beats B by 0.105 ± 0.02078 (95% CI), Welch p < 0.001: significant."]


def test_significant_but_noisier_than_the_difference_says_a_single_run_could_differ():
    a = [run(2.0 + 0.1 * (i % 3 - 1), i) for i in range(30)]
    b = [run(2.06 + 0.1 * (i % 3 - 1), i) for i in range(30)]
    lines = verdict(sides(a, b))
    assert lines[0].startswith("A beats B by 0.06") and lines[0].endswith(": significant.")
    assert lines[1].endswith("The means differ significantly over these runs; a single run of either could come "
                             "out ahead.")


@pytest.mark.parametrize("change, named", [
    ({"max_steps": 200, "steps": 200}, "--max-steps (A: none (the time budget); B: 200)"),
    ({"budget_s": 60.0}, "budget_s (A: 30; B: 60)"),
    ({"world_size": 1}, "world size (A: 2; B: 1)"),
    ({"track_name": "local-text"}, "track (A: local; B: local-text)"),
    ({"precision": "float32"}, "precision (A: bfloat16; B: float32)"),
    ({"machine": {"cpu": "Intel Xeon", "cores": 8}},
     "machine (runs bounded by time) (A: cpu, AMD EPYC 7B13 (2 cores); B: cpu, Intel Xeon (8 cores))"),
    ({"data_fingerprint": "77aa"}, "data fingerprint (A: 5e1f; B: 77aa)"),
])
def test_sides_made_differently_are_not_comparable(change, named):
    a = [run(2.00, 1), run(2.01, 2)]
    b = [run(1.90, 1, **change), run(1.91, 2, **change)]
    lines = verdict(sides(a, b))
    assert lines[0] == (f"A and B are not comparable: their runs differ in {named}. A difference in val_loss measures "
                        "the setups as much as the models"
                        + (" (on the synthetic local tracks each machine draws its own data: compare loss_gap)"
                           if "data" in named else "") + ": run both the same way.")
    assert lines[1].startswith("B beats A by 0.1")


def test_runs_bounded_by_the_same_steps_compare_across_machines_and_budgets_and_a_mixed_side_does_not():
    """Bounded by steps, the machine and the budget do not decide the result (only whether it finishes);
    a side whose runs mix setups compares a mixture, whatever the other side holds."""
    elsewhere = {"machine": {"cpu": "Intel Xeon", "cores": 8}, "budget_s": 60.0}
    a = [run(2.00, 1, steps=200, max_steps=200), run(2.01, 2, steps=200, max_steps=200)]
    b = [run(1.90, 1, steps=200, max_steps=200, **elsewhere), run(1.91, 2, steps=200, max_steps=200, **elsewhere)]
    assert not any("not comparable" in line for line in verdict(sides(a, b)))
    mixed = [run(2.00, 1), run(2.01, 2, steps=200, max_steps=200)]
    lines = verdict(sides(mixed, list(mixed)))
    assert lines[0].startswith("A and B are not comparable: their runs differ in --max-steps "
                               "(A: 200, none (the time budget); B: 200, none (the time budget))")


def test_a_side_that_mixes_setups_keeps_its_newest_runs_and_says_what_it_left_out():
    """Whatever the setups differ in (here the world size and, bounded by time, the machine), a side's mean is
    of its newest run's setup; the runs made otherwise are counted by how they were made, and the side keeps
    no pair of runs that would make it 'not comparable' with itself."""
    laptop = {"machine": {"cpu": "Intel Xeon", "cores": 8}}
    older = [run(2.30, 1, world_size=1, started_at="2026-11-29T09:00:00Z"),
             run(2.31, 2, world_size=1, started_at="2026-11-29T09:01:00Z"),
             run(2.20, 3, started_at="2026-11-29T09:02:00Z", **laptop)]
    newer = [run(2.00 + 0.01 * s, s, started_at=f"2026-11-29T10:0{s}:00Z") for s in (1, 2, 3)]
    side = one_setup(Side("A", older + newer))
    assert side.runs == newer and side.left_out == older
    assert side.note == ("A: 2 runs at world size 1 and 1 run on cpu, Intel Xeon (8 cores) left out; compared: 3 runs "
                         "at world size 2, on cpu, AMD EPYC 7B13 (2 cores) (the setup of its newest run).")
    same = one_setup(Side("B", list(newer)))
    assert same.note is None and same.runs == newer
    lines = verdict([side, Side("B", [dict(r) for r in newer])])
    assert lines[0] == side.note and not any("not comparable" in line for line in lines)


def test_a_repeated_seed_is_named():
    """Bounded by steps, a seed run twice gives the same figure twice: a spread of 0 is not a measurement (and no
    significance is claimed from it: test_a_figure_constant_within_each_side_gets_no_p_value)."""
    a = [run(2.0, 1, steps=100, max_steps=100), run(2.0, 1, steps=100, max_steps=100)]
    b = [run(2.1, 1, steps=100, max_steps=100), run(2.1, 2, steps=100, max_steps=100)]
    lines = verdict(sides(a, b))
    assert lines[0] == ("A has the lower val_loss than B by 0.1, but the figure does not vary between the runs of "
                        "either side: no test can be made.")
    assert any(line.startswith("A ran seed 1 more than once: a repeated seed is the same model and data order again")
               for line in lines)
    assert not any(line.startswith("B ran seed") for line in lines)


@pytest.mark.parametrize("p, text", [(0.0, "< 0.001"), (3e-300, "< 0.001"), (0.000565, "< 0.001"),
                                     (0.001, "0.001"), (0.00123, "0.00123"), (0.0496, "0.0496"), (None, "n/a")])
def test_p_values_are_never_written_as_zero(p, text):
    assert compare.format_p(p) == text


@pytest.mark.parametrize("value, signed, text", [(2.0025, False, "2.002"), (0.10749, False, "0.1075"),
                                                 (-0.0123, True, "-0.0123"), (0.5, True, "+0.5"),
                                                 (39912.4, False, "39,912"), (-1500.0, True, "-1,500"),
                                                 (None, False, "-")])
def test_numbers_are_written_one_way(value, signed, text):
    assert compare.format_number(value, signed) == text


def test_a_max_steps_of_the_wrong_type_reads_as_bounded_by_time():
    odd = run(2.1, 1)
    odd["track"] = {**odd["track"], "max_steps": "lots"}
    assert compare.setup_of(odd)["max_steps"] == 0 and compare.setup_of(run(2.0, 1, max_steps=200))["max_steps"] == 200
    assert verdict(sides([run(2.0, 1)], [odd]))[0].startswith("A has the lower val_loss than B")


def _figures(text: str) -> list[str]:
    """Every number a reader sees, commands in backticks left out (typed as they are: `--max-steps 1180`)."""
    return re.findall(r"(?<![\w.])[-+x]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?!\w)", re.sub(r"`[^`]*`", "", text))


def _one_way(figure: str) -> bool:
    """compare.format_number's way: whole numbers with grouped thousands from 1,000 up, else 4 significant digits."""
    plain = figure.lstrip("x+-")
    if "," in plain:
        return re.fullmatch(r"\d{1,3}(,\d{3})+", plain) is not None
    return float(plain) < 1000 and len(plain.split("e")[0].replace(".", "").lstrip("0")) <= 4


def test_every_figure_in_the_table_and_the_verdict_is_written_one_way():
    """The table wrote the throughput ratio with 3 decimals (x12.345: five digits) and the verdict step counts
    without their thousands (1180 to 1290 steps), beside figures written by format_number."""
    from harness.results.compare_table import compare_table

    a = [run(2.03, 1, steps=1290, tokens_per_s=1000.0), run(2.33, 2, steps=1180, tokens_per_s=1010.0),
         run(2.10, 3, steps=1260, tokens_per_s=990.0)]
    b = [run(2.00, 1, steps=1280, tokens_per_s=12345.0), run(2.25, 2, steps=1200, tokens_per_s=12340.0),
         run(2.15, 3, steps=1250, tokens_per_s=12350.0)]
    both = sides(a, b)
    rows = compare.compare(both)
    table, said = compare_table(both, rows), "\n".join(verdict(both))
    ratio = next(r for r in rows if r["metric"] == "tokens_per_s")["B vs A: ratio"]
    assert f"x{compare.format_number(ratio)}" in table and "12,345 ± " in table
    assert "trained 1,180 to 1,290 steps" in said and "`--max-steps 1180`" in said
    wrong = [f for f in _figures(table + "\n" + said) if not _one_way(f)]
    assert wrong == [], wrong
    assert not re.search(r"p = 0(?![.\d])", said) and not any(line.rstrip().endswith(" 0") for line in table.splitlines())


def test_a_figure_constant_within_each_side_gets_no_p_value():
    """`harness compare` printed `< 0.001` for params and `1` for steps: figures no run of either side varied (the
    model's size; the steps of runs bounded by steps). A t-test on a spread of 0 calls any difference certain and
    none none at all. Such a figure is said to be constant, each side's value shown, no p-value; the verdict rests
    on what varies, and when val_loss itself is constant (a seed repeated) it claims nothing."""
    from harness.results.compare_table import compare_table

    a = [run(2.00 + 0.01 * s, s, steps=200, max_steps=200, params=425_984, tokens_per_s=1000.0 + s) for s in (1, 2, 3)]
    b = [run(2.10 + 0.012 * s, s, steps=200, max_steps=200, params=494_848, tokens_per_s=1100.0 + s) for s in (1, 2, 3)]
    both = sides(a, b)
    rows = {r["metric"]: r for r in compare.compare(both)}
    for metric, (va, vb) in {"params": (425_984, 494_848), "steps": (200, 200)}.items():
        row = rows[metric]
        assert row["B vs A: p"] is None and row["B vs A: ci95"] is None and row["B vs A: note"] == compare.CONSTANT
        assert (row["A"], row["B"], row["A ci95"], row["B ci95"]) == (va, vb, None, None)
        assert row["B vs A: diff"] == vb - va
    assert rows["val_loss"]["B vs A: p"] < 0.001 and rows["tokens_per_s"]["B vs A: p"] < 0.001  # these vary: tested
    lines = {line.split()[0]: line for line in compare_table(both, list(rows.values())).splitlines()}
    assert lines["params"].split()[1:] == ["425,984", "494,848", "+68,864", "constant"]
    assert lines["steps"].split()[1:] == ["200", "200", "+0", "constant"]
    assert verdict(both) == ["A beats B by 0.104 ± 0.02536 (95% CI), Welch p < 0.001: significant."]
    # val_loss constant within each side: the difference is said, no significance, and why.
    same = verdict(sides([run(2.0, 1, steps=100, max_steps=100)] * 2, [run(2.1, 1, steps=100, max_steps=100)] * 2))
    assert same[0] == ("A has the lower val_loss than B by 0.1, but the figure does not vary between the runs of "
                       "either side: no test can be made.")
    assert same[1].startswith("val_loss did not vary between the runs of either side (A 2; B 2.1)")
    assert not any("significant" in line or "p <" in line or "p =" in line for line in same)
