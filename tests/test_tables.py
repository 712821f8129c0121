"""The leaderboard's tables as people read and load them: CSV and Markdown, one column order, counts as counts."""

import csv
import io
import json

from harness.results.leaderboard import COLUMNS, build_table, load_rows
from harness.results.tables import MARKDOWN_COLUMNS, to_csv, to_markdown
from records_factory import make_run


def _table(root):
    return build_table(load_rows(root, "local"))


def test_csv_writes_counts_as_integers_even_when_they_are_means(tmp_path):
    for seed, tokens in enumerate((1196032, 1196035), 1):  # a mean of 1196033.5 tokens
        make_run(tmp_path, "alpha", 2.0 + seed / 100, seed=seed, params=425984, tokens=tokens, steps=290 + seed)
    make_run(tmp_path, "delta", None, status="crashed", reason="boom")
    rows = list(csv.DictReader(io.StringIO(to_csv(_table(tmp_path)))))
    assert rows[0]["params"] == "425984" and rows[0]["tokens"] == "1196034" and rows[0]["steps"] == "292"
    assert rows[0]["rank"] == "1" and rows[0]["n_runs"] == "2"
    assert rows[1]["rank"] == "" and rows[1]["params"] == "1000"
    assert not any(v.endswith(".0") for r in rows for k, v in r.items() if k in ("params", "tokens", "steps", "rank"))


def test_the_csv_holds_every_column_and_the_markdown_the_ones_a_reader_needs(tmp_path):
    """The Markdown had the CSV's 23 columns. It has the page's: rank, team, division, val_loss, its interval, n,
    whom it is tied with, status, tokens/s, MFU, comm overlap, and the reason a team is not ranked; the CSV keeps
    every column, raw. A measurement a ranked team lacks reads n/a, as on the charts."""
    make_run(tmp_path, "alpha", 2.0, comm_overlap_efficiency=1.012)
    make_run(tmp_path, "alpha", 2.02, seed=2, comm_overlap_efficiency=1.012)
    make_run(tmp_path, "bravo", 2.1, comm_overlap_efficiency=0.931)
    make_run(tmp_path, "open", 2.2, division="open")  # its own train.py: no communication probe
    make_run(tmp_path, "delta", None, status="crashed", reason="rank 1: boom")
    table = _table(tmp_path)
    assert to_csv(table).splitlines()[0].split(",") == COLUMNS
    assert {"interval_low", "interval_high", "interval_kind", "p_vs_next", "params", "run_id", "reason"} <= set(COLUMNS)
    md = to_markdown(table, "local", "mean")
    md_header = [c.strip() for c in next(line for line in md.splitlines() if line.startswith("| rank")).strip("|").split("|")]
    assert md_header == MARKDOWN_COLUMNS == ["rank", "team", "division", "val_loss", "interval", "n_runs", "vs_next",
                                             "status", "tokens_per_s", "mfu", "comm_overlap_efficiency", "reason"]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in md.splitlines() if line.startswith("| ") and not line.startswith("| rank")}
    by = {team: dict(zip(MARKDOWN_COLUMNS, cells)) for team, cells in rows.items()}
    assert by["alpha"]["interval"] == "2.0000–2.0200 (min–max)" and by["alpha"]["vs_next"] == "undetermined"
    assert by["alpha"]["mfu"] == "n/a" and by["open"]["comm_overlap_efficiency"] == "n/a"
    assert by["delta"]["mfu"] == "" and by["delta"]["reason"] == "rank 1: boom"  # not ranked: nothing to measure
    assert "comm_overlap_efficiency" in COLUMNS and "scaling_efficiency" not in md
    # Above 1 is timing noise around "nothing exposed": shown as such, kept raw in the CSV.
    assert by["alpha"]["comm_overlap_efficiency"] == "≈100%" and by["bravo"]["comm_overlap_efficiency"] == "93.1%"
    assert "101.2%" not in md and "1.012" in to_csv(table)


def test_records_of_the_old_schema_still_rank_with_the_new_names(tmp_path):
    run_dir = make_run(tmp_path, "alpha", 2.0)
    raw = json.loads((run_dir / "run.json").read_text())
    raw.pop("comm_overlap_efficiency"), raw.pop("comm_probe")
    raw.update(scaling_efficiency=0.97, scaling={"scaling_probe_steps": 4, "comm_s": 0.01}, schema_version=1)
    (run_dir / "run.json").write_text(json.dumps(raw))
    table = _table(tmp_path)
    assert table.loc[0, "comm_overlap_efficiency"] == 0.97

    from harness.results.records import load_record

    record = load_record(run_dir)
    assert record.comm_overlap_efficiency == 0.97 and record.comm_probe == {"steps": 4, "comm_s": 0.01}
    assert "scaling_efficiency" not in record.extra and "scaling" not in record.extra


def test_multi_line_reasons_stay_in_one_markdown_row(tmp_path):
    make_run(tmp_path, "echo", None, status="invalid",
             reason="submission.py:5: syntax error: expected ':'. Fix the line shown:\n    def f(x)\n           ^")
    md = to_markdown(_table(tmp_path), "local", "mean")
    row = next(line for line in md.splitlines() if "| echo |" in line)
    assert "def f(x)<br>" in row and row.endswith("|")


def test_a_team_name_that_reads_as_a_formula_is_text_in_the_csv(tmp_path):
    """A spreadsheet opening the board would run `=HYPERLINK(...)` written as a team name or reason."""
    import csv
    import io

    from harness.results.leaderboard import build_table, load_rows
    from harness.results.tables import to_csv
    from records_factory import make_run

    make_run(tmp_path, "=HYPERLINK(\"x\")", 2.0)
    make_run(tmp_path, "bravo", None, status="crashed", reason="@SUM(A1)")
    rows = list(csv.DictReader(io.StringIO(to_csv(build_table(load_rows(tmp_path, "local"))))))
    assert {r["team"] for r in rows} == {"'=HYPERLINK(\"x\")", "bravo"}
    assert next(r for r in rows if r["team"] == "bravo")["reason"] == "'@SUM(A1)"
    assert all(not (v or "").startswith(("=", "@", "+")) for r in rows for v in r.values())
