"""The baseline: a small modern GPT, the harness's default AdamW and time-based schedule.

Sized for the `local` track (CPU, 2 ranks, 30 s). For a GPU track, scale CONFIG up.
The model accepts windows longer than `seq_len` (evaluation uses the track's eval.seq_len).
"""

from .model import get_model  # noqa: F401  (the contract: get_model(config) -> nn.Module)

CONFIG = {
    "n_layer": 2,  # on the local track, 2 layers take 2.5x the steps of 4 in 30 s, and win
    "n_head": 4,
    "d_model": 128,
    "seq_len": 256,
    "micro_batch_size": 8,
    "grad_accum_steps": 1,
    "learning_rate": 3e-3,
    "weight_decay": 0.1,
}
