"""The results side: run records and everything derived from them (leaderboard, page, charts,
comparisons, statistics, flags). Pure work on files: no process is started or watched here,
and nothing here imports torch.distributed.
"""
