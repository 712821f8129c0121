"""Processes that load a team's model outside training: the check before a run, and evaluation's model processes."""
