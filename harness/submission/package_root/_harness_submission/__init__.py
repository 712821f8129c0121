"""The submission's package in a team's own worker processes (multiprocessing's spawn and forkserver).

The harness imports a team's `submission.py` as `_harness_submission.submission` (contract.py), so a
function of it is pickled by that name. A worker that Python starts afresh unpickles it by importing
the name again: this folder is on the sys.path the worker inherits, and the variable below, set by
`import_submission_module` before the team's code runs, says where the team's files are. Only the
team's own processes import this; no harness process reads what it names.
"""

import os

# An empty __path__ (the variable unset) makes `_harness_submission.submission` a plain ModuleNotFoundError.
__path__ = [os.environ["HARNESS_SUBMISSION_PACKAGE_DIR"]] if os.environ.get("HARNESS_SUBMISSION_PACKAGE_DIR") else []
