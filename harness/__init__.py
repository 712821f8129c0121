"""speedrun-harness: the benchmark harness for time-budgeted training competitions.

The library imports without click; `harness.cli` is a thin layer over it.
"""

__version__ = "0.1.0"
