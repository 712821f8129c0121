"""The event's commands over many runs: the queue, the SLURM job array, finalize, the one-machine cluster, the rehearsal."""
