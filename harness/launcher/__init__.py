"""The launcher side: code that runs in the `harness` command's own process (and the processes it
starts only to watch them). It resolves the track and the submission, owns the run directory,
starts the ranks with torch elastic, watches the clock, and writes the record. No submission
code ever runs here: the submission is imported only in the processes under harness/ranks/.
"""
