"""The leaderboard's tables as people read and load them: CSV and Markdown, one column order, counts as counts."""

import csv
import io
import json

from harness.results.leaderboard import COLUMNS, build_table, load_rows
from harness.results.tables import to_csv, to_markdown
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


def test_csv_and_markdown_have_the_same_columns_in_the_same_order(tmp_path):
    make_run(tmp_path, "alpha", 2.0, comm_overlap_efficiency=1.012)
    make_run(tmp_path, "bravo", 2.1, comm_overlap_efficiency=0.931)
    table = _table(tmp_path)
    csv_header = to_csv(table).splitlines()[0].split(",")
    md = to_markdown(table, "local", "mean")
    md_header = [c.strip() for c in next(line for line in md.splitlines() if line.startswith("| rank")).strip("|").split("|")]
    assert csv_header == md_header == COLUMNS
    assert "comm_overlap_efficiency" in COLUMNS and "scaling_efficiency" not in md
    # Above 1 is timing noise around "nothing exposed": shown as such, kept raw in the CSV.
    assert "| ≈100% |" in md and "| 93.1% |" in md and "101.2%" not in md
    assert "1.012" in to_csv(table)


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
