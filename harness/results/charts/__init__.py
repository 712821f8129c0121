"""The charts of the leaderboard and of `harness compare`, drawn with matplotlib from the results' tables."""
