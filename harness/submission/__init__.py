"""The submission contract: what a team's folder must define, how it is found, copied, hashed,
imported and checked, what the harness uses when it leaves a piece out, and the static screen
of its source.
"""
