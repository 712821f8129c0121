"""Why a leaderboard ranks nobody, and what to type: said one way on the page, in the Markdown and on the charts.

A page that says "0 ranked of 0 teams" over an empty table leaves a newcomer guessing whether the harness
failed; the usual cause is that every run so far was unofficial (a command-line override: `--max-steps`,
`--budget-s`, ...), which `--all` shows.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import pandas as pd

from harness.results.leaderboard import UNREADABLE, scored


@dataclass(frozen=True)
class EmptyState:
    headline: str  # what is missing: "No official runs yet"
    command: str  # what to type ("" when there is nothing to type)
    detail: str  # what the command shows, or why the ranking is empty

    def markdown(self) -> str:
        """One sentence with the command in backticks: the Markdown table's note, and the page's."""
        command = f"`{self.command}` " if self.command else ""
        return f"**{self.headline}.** {command}{self.detail}"

    def figure(self, title: str):
        """A chart that says this instead of drawing empty axes."""
        from harness.results.charts.kit import message_figure

        lines = textwrap.wrap(self.detail.replace("`", ""), 56, break_on_hyphens=False)
        return message_figure(title, lines, self.command, headline=self.headline + ".")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def empty_state(rows: list[dict], table: pd.DataFrame, track: str, include_unofficial: bool) -> EmptyState | None:
    """None when at least one team is ranked; else what is missing and what to type. `rows` are every run of the
    track (leaderboard.load_rows), `table` the leaderboard built from them."""
    if (table["status"] == "ok").any():
        return None
    if not rows:
        return EmptyState("No runs yet", f"harness run submissions/<team> --track {track}",
                          "trains a submission, scores it and ranks it here.")
    unofficial = [r for r in rows if not r.get("official") and r.get("status") != UNREADABLE]
    hidden = [] if include_unofficial else unofficial
    teams = len({r["team"] for r in hidden})
    why = ("a run made with a command-line override (`--max-steps`, `--budget-s`, ...) is unofficial and never "
           "ranked.")
    if table.empty and hidden:  # every run so far is unofficial
        return EmptyState("No official runs yet", f"harness leaderboard --track {track} --all",
                          f"shows {_plural(len(hidden), 'unofficial run')} of {_plural(teams, 'team')} (in "
                          f"{track}-all.html): {why}")
    finished = [r for r in hidden if scored(r)]
    did_not = _plural(len(table), "team")
    if finished:
        return EmptyState("No official run has finished yet", f"harness leaderboard --track {track} --all",
                          f"shows {_plural(len(finished), 'unofficial run')} that finished: {why} The "
                          f"{did_not} in the table ran officially without finishing: each row says why.")
    return EmptyState("No run has finished yet", "",
                      f"{did_not} ran without finishing: each one's status and reason is in the table.")
