"""`harness compare` through the CLI, on records made by the tests."""

import pytest
import json

from records_factory import make_run

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)


def _runs(tmp_path):
    runs = tmp_path / "runs"
    for seed, v in enumerate((2.00, 2.01, 2.005, 1.995), 1):
        make_run(runs, "alpha", v, seed=seed, tokens_per_s=1000.0 + seed)
    for seed, v in enumerate((2.10, 2.12, 2.11), 1):
        make_run(runs, "bravo", v, seed=seed, tokens_per_s=1500.0 + seed)
    single = make_run(runs, "charlie", 2.05, seed=1)
    return runs, single


def test_significant_difference_with_interval_and_ratio(cli, tmp_path):
    runs, _ = _runs(tmp_path)
    result = cli("compare", "alpha", "bravo", "--runs-dir", str(runs), "--format", "json",
                 "--chart", str(tmp_path / "c.png"))
    assert result.code == 0, result.err
    out = json.loads(result.out)
    val = next(r for r in out["rows"] if r["metric"] == "val_loss")
    assert val["alpha n"] == 4 and val["bravo n"] == 3
    assert abs(val["bravo vs alpha: diff"] - (2.11 - 2.0025)) < 1e-9
    assert val["bravo vs alpha: p"] < 0.001 and val["bravo vs alpha: ci95"] > 0
    tps = next(r for r in out["rows"] if r["metric"] == "tokens_per_s")
    assert abs(tps["bravo vs alpha: ratio"] - 1502.0 / 1002.5) < 1e-9
    assert "alpha beats bravo" in out["verdict"][0] and "significant" in out["verdict"][0]
    assert (tmp_path / "c.png").stat().st_size > 0
    text = cli("compare", "alpha", "bravo", "--runs-dir", str(runs), "--chart", str(tmp_path / "t.png")).out
    tps_line = next(line for line in text.splitlines() if line.startswith("tokens_per_s"))
    assert " x1.498 " in f"{tps_line} " and "x1.4983" not in tps_line  # the ratio written as every figure is


def test_a_single_run_claims_no_significance(cli, tmp_path):
    runs, single = _runs(tmp_path)
    result = cli("compare", "alpha", str(single), "--runs-dir", str(runs), "--chart", str(tmp_path / "c.png"))
    assert result.code == 0, result.err
    assert "no significance can be claimed" in result.out and "n/a (1 run)" in result.out
    by_id = cli("compare", "alpha", single.name, "--runs-dir", str(runs), "--format", "csv",
                "--chart", str(tmp_path / "d.png"))
    assert by_id.code == 0 and by_id.out.splitlines()[0].startswith("metric,alpha,alpha ci95,alpha n")


def test_unknown_side_is_a_clear_error(cli, tmp_path):
    runs, _ = _runs(tmp_path)
    result = cli("compare", "alpha", "zulu", "--runs-dir", str(runs))
    assert result.code == 2 and "'zulu' is not a run directory, a run id or a team" in result.err
    assert "Did you mean" not in result.err and "Teams: alpha, bravo, charlie." in result.err
    near = cli("compare", "alpah", "bravo", "--runs-dir", str(runs))
    assert near.code == 2 and "Did you mean: alpha?" in near.err


def test_sides_made_differently_and_exact_p_values_are_said_plainly(cli, tmp_path):
    """Two runs a side with no spread gave Welch p = 0.0 exactly, printed `< 0.001`: a spread of 0 is no
    measurement, so no p-value is printed at all (`constant`) and no significance is claimed; never `0`. One side
    trained to the budget, the other bounded by --max-steps: the verdict says they are not comparable."""
    runs = tmp_path / "runs"
    for seed in (1, 2):
        make_run(runs, "alpha", 2.0, seed=seed)
        bounded = make_run(runs, "bravo", 2.1, seed=seed, official=False)
        record = json.loads((bounded / "run.json").read_text())
        record["track"]["max_steps"] = 200
        (bounded / "run.json").write_text(json.dumps(record))
    result = cli("compare", "alpha", "bravo", "--all", "--runs-dir", str(runs), "--chart", str(tmp_path / "c.png"))
    assert result.code == 0, result.err
    val_row = next(line for line in result.out.splitlines() if line.startswith("val_loss "))
    assert val_row.split()[-1] == "constant"  # the p column
    assert ("alpha has the lower val_loss than bravo by 0.1, but the figure does not vary between the runs of either "
            "side: no test can be made.") in result.out
    assert ": significant." not in result.out
    assert "p = 0" not in result.out and "  0  " not in val_row
    assert ("alpha and bravo are not comparable: their runs differ in --max-steps (alpha: none (the time budget); "
            "bravo: 200)") in result.out


def _bounded_by_steps(run_dir, max_steps: int):
    """A record as `harness run --max-steps N` writes it: the track it ran holds N."""
    record = json.loads((run_dir / "run.json").read_text())
    record["track"]["max_steps"] = max_steps
    (run_dir / "run.json").write_text(json.dumps(record))
    return run_dir


def _after_the_readme_and_the_recipe(tmp_path):
    """The README's quickstart (one official run of baseline and one of minimal, bounded by the time budget),
    then the fair-comparison recipe: five seeds of each at --max-steps 200 (unofficial), of the same submission."""
    runs = tmp_path / "runs"
    for team, loss in (("baseline", 1.87), ("minimal", 2.45)):
        make_run(runs, team, loss + 0.3, seed=1, steps=292, started_at="2026-11-29T09:00:00Z",
                 run_id="20261129T090000-quick1")  # the same seed as the recipe's first: its own run id
        for seed in range(1, 6):
            _bounded_by_steps(make_run(runs, team, loss + 0.01 * seed, seed=seed, official=False, steps=200,
                                       started_at=f"2026-11-29T10:{seed:02d}:00Z"), 200)
    return runs


def test_the_fair_comparison_recipe_works_after_the_quickstart(cli, tmp_path):
    """With --all a team side holds every run of its latest submission: the official time-bound run of the
    quickstart and the five step-bound runs of the recipe. The side keeps its newest run's setup and the
    verdict says what it left out, instead of "not comparable" over a mean of both kinds."""
    runs = _after_the_readme_and_the_recipe(tmp_path)
    result = cli("compare", "baseline", "minimal", "--all", "--runs-dir", str(runs), "--format", "json",
                 "--chart", str(tmp_path / "c.png"))
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert not any("not comparable" in line for line in out["verdict"]), out["verdict"]
    assert out["verdict"][:2] == [
        "baseline: 1 run bounded by the time budget left out; compared: 5 runs at --max-steps 200 (the setup of "
        "its newest run; `--max-steps N` chooses).",
        "minimal: 1 run bounded by the time budget left out; compared: 5 runs at --max-steps 200 (the setup of its "
        "newest run; `--max-steps N` chooses)."]
    val = next(r for r in out["rows"] if r["metric"] == "val_loss")
    assert (val["baseline n"], val["minimal n"]) == (5, 5)
    assert abs(val["baseline"] - 1.90) < 1e-9  # the step-bound runs' mean alone, not pulled by the 2.17
    assert not any("more than once" in line for line in out["verdict"])  # seed 1 of each kind is not a repeat


def test_compare_max_steps_chooses_the_runs_and_counts_unofficial_ones(cli, tmp_path):
    """`--max-steps 200` keeps the runs bounded by 200 steps (unofficial, as every step-bound run is, so counted
    without --all); `--max-steps 0` the runs bounded by the time budget; a bound no run has is a clear error."""
    runs = _after_the_readme_and_the_recipe(tmp_path)
    common = ("--runs-dir", str(runs), "--format", "json", "--chart", str(tmp_path / "c.png"))
    bounded = cli("compare", "baseline", "minimal", "--max-steps", "200", *common)
    assert bounded.code == 0, bounded.err
    out = json.loads(bounded.out)
    assert [len(side["run_ids"]) for side in out["sides"]] == [5, 5]
    assert out["verdict"][0] == ("baseline: 1 run bounded by the time budget left out; compared: 5 runs at "
                                 "--max-steps 200.")
    assert not any("not comparable" in line for line in out["verdict"])
    timed = json.loads(cli("compare", "baseline", "minimal", "--max-steps", "0", "--all", *common).out)
    assert [len(side["run_ids"]) for side in timed["sides"]] == [1, 1]
    assert timed["verdict"][0] == ("baseline: 5 runs at --max-steps 200 left out; compared: 1 run bounded by the "
                                   "time budget.")
    missing = cli("compare", "baseline", "minimal", "--max-steps", "100", *common)
    assert missing.code == 2
    assert ("team 'baseline' has no ok run at --max-steps 100 of its latest submission: its ok runs are 1 run "
            "bounded by the time budget and 5 runs at --max-steps 200") in missing.err, missing.err


def test_compare_prints_no_p_value_for_what_does_not_vary(cli, tmp_path):
    """Every run of both sides has the same params, steps and tokens (make_run's): the table said `< 0.001` or
    `1` for them. It says `constant`, beside each side's value, and p-values only for what varies."""
    runs, _ = _runs(tmp_path)
    result = cli("compare", "alpha", "bravo", "--runs-dir", str(runs), "--chart", str(tmp_path / "c.png"))
    assert result.code == 0, result.err
    lines = {line.split()[0]: line for line in result.out.splitlines() if line.strip()}
    for metric in ("params", "steps", "tokens"):
        assert lines[metric].split()[-1] == "constant", lines[metric]
        assert "±" not in lines[metric] and "<" not in lines[metric]
    assert lines["val_loss"].split()[-2:] == ["<", "0.001"] and lines["tokens_per_s"].split()[-2:] == ["<", "0.001"]
    out = json.loads(cli("compare", "alpha", "bravo", "--runs-dir", str(runs), "--format", "json",
                         "--chart", str(tmp_path / "c.png")).out)
    params = next(r for r in out["rows"] if r["metric"] == "params")
    assert params["bravo vs alpha: p"] is None and params["alpha"] == params["bravo"] == 1000
    assert params["bravo vs alpha: note"].startswith("the figure does not vary between the runs of either side")
