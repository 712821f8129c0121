"""Charts of a track, drawn from run records (matplotlib, PNG), into plots/<track>/.

loss_vs_time.png    train loss curves and final val loss against training time, every team
loss_vs_tokens.png  train loss against tokens seen
val_loss.png        final validation loss per team with its 95% interval and n; non-finishers listed
throughput.png      tokens/s, MFU and the communication probe (comm overlap) per team
scaling.png         weak-scaling efficiency from `harness scale`: measured points and the model's prediction

What every chart shares is in kit.py. A team's colour is colors.py's, the same in every chart and on the page.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd

from harness.results.charts.colors import TeamColors
from harness.results.charts.empty import EmptyState
from harness.results.charts.parallel import ChartJob, draw_all


def draw_track(track: str, table: pd.DataFrame, counted: dict[str, list[dict]], scale_records: list[dict],
               out_dir: Path, ranking: str = "mean", track_option: str | None = None, *, colors: TeamColors,
               empty: EmptyState | None = None) -> list[Path]:
    """Draw every chart; `counted` maps each ranked team to its ok runs (rows from leaderboard.load_rows), `colors`
    is the track's (colors.team_colors), `empty` says why nobody is ranked (empty.empty_state), `track_option` the
    `--track` value of a command a chart suggests (views.command_track)."""
    from harness.results.charts.loss_charts import loss_figure, val_loss_figure
    from harness.results.charts.rate_charts import scaling_figure, throughput_figure

    # The costs: seconds each took for 100 teams (benchmarks/run.py), which decide the two shares of draw_all.
    jobs = [ChartJob(out_dir / name, partial(loss_figure, track, table, counted, x_col, colors=colors, ranking=ranking,
                                             empty=empty), cost=0.5)
            for x_col, name in (("train_time_s", "loss_vs_time.png"), ("tokens", "loss_vs_tokens.png"))]
    jobs += [ChartJob(out_dir / "val_loss.png", partial(val_loss_figure, track, table, counted, ranking, colors=colors,
                                                        empty=empty), cost=0.6),
             ChartJob(out_dir / "throughput.png", partial(throughput_figure, track, table, colors=colors, empty=empty),
                      cost=0.3),
             ChartJob(out_dir / "scaling.png", partial(scaling_figure, track, scale_records, colors=colors,
                                                       track_option=track_option), cost=0.1)]
    return draw_all(jobs)
