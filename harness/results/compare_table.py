"""`harness compare`'s table as text: one row per metric, each side's mean ± its interval, each later side's
difference (or throughput ratio) from the reference, and the p-value (or why there is none: one run on a
side, or a figure constant within each side). Every figure is written by
compare.format_number and every p-value by compare.format_p, as in the verdict under it (the CSV and the
JSON keep the raw figures)."""

from __future__ import annotations

from typing import Any

from harness.results.compare import CONSTANT, Side, format_number, format_p


def _mean(mean: float | None, ci: float | None, signed: bool = False) -> str:
    if mean is None:
        return "-"
    return format_number(mean, signed) + (f" ± {format_number(ci)}" if ci is not None else "")


def _p(row: dict[str, Any], prefix: str) -> str:
    p, note = row[f"{prefix}: p"], row[f"{prefix}: note"] or ""
    if p is None:  # no test: the table says why rather than "-" (the side columns show the constant values)
        return "n/a (1 run)" if note.startswith("one run") else "constant" if note == CONSTANT else "-"
    return format_p(p)


def compare_table(sides: list[Side], rows: list[dict[str, Any]]) -> str:
    """The table printed above the verdict; `rows` are compare.compare(sides)'s."""
    ref = sides[0].label
    header = (["metric"] + [f"{s.label} (n={format_number(len(s.runs))})" for s in sides]
              + [f"{s.label} vs {ref}" for s in sides[1:]] + ["p"] * (len(sides) - 1))
    lines = []
    for row in rows:
        cells = [row["metric"]] + [_mean(row[s.label], row[f"{s.label} ci95"]) for s in sides]
        for s in sides[1:]:
            prefix = f"{s.label} vs {ref}"
            if f"{prefix}: ratio" in row:
                ratio = row[f"{prefix}: ratio"]
                cells.append("-" if ratio is None else "x" + format_number(ratio))
            else:
                cells.append(_mean(row[f"{prefix}: diff"], row[f"{prefix}: ci95"], signed=True))
        cells += [_p(row, f"{s.label} vs {ref}") for s in sides[1:]]
        lines.append(cells)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in [header, *lines])
