"""Is this node ready for the event: `harness doctor`'s table of checks (checkup.py runs them)."""
