"""The checkpoint: what crosses from training to evaluation, and its checksum.

Rank 0 saves {config, model, step, tokens} (the plain module's state dict) into its staging
folder; the launcher takes it into the record and hashes it; evaluation checks the hash and
rebuilds the model with the submission's get_model from the saved config alone.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def unwrap(module):
    """The plain module under torch.compile's and DDP's wrappers: its state dict has no `_orig_mod.`
    or `module.` prefixes and loads into what get_model(config) returns. Only those two wrapper
    types are opened (a team's own attribute called `module` is left alone)."""
    from torch._dynamo.eval_frame import OptimizedModule
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if isinstance(module, OptimizedModule):
            module = module._orig_mod
        elif isinstance(module, DistributedDataParallel):
            module = module.module
        else:
            return module


def save_checkpoint(path: str | Path, module, config: dict, step: int, tokens: int) -> dict:
    """Written beside, then renamed: the launcher never takes a half-written file. Returns the state saved."""
    import torch

    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    tmp = f"{path}.tmp"
    torch.save({"config": config, "model": state, "step": step, "tokens": tokens}, tmp)
    os.replace(tmp, path)
    return state
