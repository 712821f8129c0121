"""The results side: run records and everything derived from them; pure work on files, no process, no torch.

- here: records, locks, flags, the leaderboard's table, statistics, comparisons, the page and the tables;
- charts/: every chart (matplotlib), its colours and its empty states.
"""
