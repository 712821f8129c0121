"""One run, phase by phase, in the launcher: resolve, check, train, take the checkpoint, evaluate, assemble the record."""
