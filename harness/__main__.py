"""`python -m harness` is the same as the `harness` console script."""

from harness.cli import entry

if __name__ == "__main__":
    entry()
