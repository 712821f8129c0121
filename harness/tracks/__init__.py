"""Tracks: the fixed setup of an event as TOML (the built-in ones are the .toml files in this
folder) and their typed, validated form (spec.py).
"""
