"""`harness compare` through the CLI, on records made by the tests."""

import json

from records_factory import make_run


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
    """Two runs a side with no spread give Welch p = 0.0 exactly: printed `< 0.001`, never `0`. One side
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
    assert val_row.split()[-2:] == ["<", "0.001"]  # the p column
    assert "alpha beats bravo by 0.1 ± 0 (95% CI), Welch p < 0.001: significant." in result.out
    assert "p = 0" not in result.out and "  0  " not in val_row
    assert ("alpha and bravo are not comparable: their runs differ in --max-steps (alpha: none (the time budget); "
            "bravo: 200)") in result.out
