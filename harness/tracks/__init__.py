"""Tracks: the fixed setup of an event as TOML (the built-in ones are the .toml files in this
folder), their typed, validated form (spec.py), and the precision a track's dtype means on this
machine (precision.py).
"""
