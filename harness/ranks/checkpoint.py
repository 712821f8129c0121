"""The checkpoint: what crosses from training to evaluation, and its checksum.

Rank 0 saves {config, model, step, tokens} into its staging folder and says so on the channel;
the launcher takes the file into the record and hashes it at that moment (whatever happens in
staging afterwards is not scored); evaluation checks the hash and rebuilds the model with the
submission's get_model from the saved config alone.

`model` is built by harness code, never by the team's: `module_state` walks the module tree's own
dictionaries (parameters and persistent buffers, keyed as `state_dict` keys them) without calling
a method of the team's (`state_dict`, `get_extra_state`, hooks, `__getattr__`), on the weights as
they were at the last agreement point of the loop: nothing of the submission runs between the clock
and the copy. `load_module_state` puts them back in evaluation (`harness eval` included) and the check
process, through the model's own `load_state_dict` (they run the team's code anyway; its load hooks
rebuild what they derive, lazy modules materialise), strictly: the same keys and shapes, or the
checkpoint is not scorable. `_extra_state` (what `get_extra_state` would add: Transformer Engine's FP8
scaling history, say) is not saved, and a team's own checkpoint's is not required: evaluation runs in
bf16 autocast, where it plays no part.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
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
    types are opened (a team's own attribute called `module` is left alone).

    torch._dynamo is not imported for this: it costs seconds of CPU (twice per evaluation, once in
    each model process), and a module torch.compile wrapped exists only once torch.compile has
    imported it, so a process where it was never loaded holds no such wrapper."""
    from torch.nn.parallel import DistributedDataParallel

    compiled: type | tuple = ()
    if "torch._dynamo" in sys.modules:  # free once loaded; fails loudly if torch moves the class
        from torch._dynamo.eval_frame import OptimizedModule as compiled

    while True:
        if isinstance(module, compiled):
            module = module._orig_mod
        elif isinstance(module, DistributedDataParallel):
            module = module.module
        else:
            return module


_get = object.__getattribute__  # bound now: the module tree is read without any attribute hook of the team's


def module_tensors(module, buffers: bool = True) -> list[tuple[str, object]]:
    """(key, live tensor) of every parameter and persistent buffer (or parameters only), in state_dict's
    order and with its keys (a tied tensor under each name it has), found through the modules' own
    dictionaries."""
    out: list[tuple[str, object]] = []
    stack = [("", module)]
    while stack:
        prefix, m = stack.pop()
        for name, p in _get(m, "_parameters").items():
            if p is not None:
                out.append((prefix + name, p))
        skip = _get(m, "_non_persistent_buffers_set")
        for name, b in (_get(m, "_buffers").items() if buffers else ()):
            if b is not None and name not in skip:
                out.append((prefix + name, b))
        children = [(prefix + name + ".", c) for name, c in _get(m, "_modules").items() if c is not None]
        stack.extend(reversed(children))  # depth first, children in order: state_dict's order
    return out


def module_state(module) -> dict:
    """A copy, on the CPU, of every parameter and persistent buffer (module_tensors): the weights as they
    are now, whatever the module's own methods would say."""
    import torch

    with torch.no_grad():
        return {key: t.detach().to("cpu", copy=True) for key, t in module_tensors(module)}


EXTRA_STATE = "_extra_state"


def load_module_state(module, state: dict) -> None:
    """Put a saved state into a module built by get_model, through its own load_state_dict. Strict on every
    parameter and buffer (a key missing or unexpected, or a shape that differs, raises ValueError saying
    which); `_extra_state` entries are neither required nor passed on (module docstring)."""
    state = {k: v for k, v in state.items() if not str(k).endswith(EXTRA_STATE)}
    try:
        missing, unexpected = module.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shapes that differ, an uninitialised module's own complaint
        raise ValueError(str(exc)[:600]) from None
    missing = [k for k in missing if not k.endswith(EXTRA_STATE)]
    if missing or unexpected:
        raise ValueError(f"missing keys {missing[:8]}{'...' if len(missing) > 8 else ''}, unexpected keys "
                         f"{list(unexpected)[:8]}{'...' if len(unexpected) > 8 else ''}")


class _HashingWriter(io.RawIOBase):
    """A file that hashes what is written to it, as it is written (torch.save writes in order)."""

    def __init__(self, fh) -> None:
        self.fh, self.digest, self.size = fh, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data)
        self.digest.update(view)
        self.fh.write(view)
        self.size += len(view)
        return len(view)


def save_checkpoint(path: str | Path, state: dict, config: dict, step: int, tokens: int) -> tuple[str, int]:
    """Written beside, then renamed: nobody takes a half-written file. `state` is module_state's copy.
    Returns (sha256, bytes) of what was written, hashed on the way (not read back: what is in the file
    by the time it is read back may be another process's)."""
    import torch

    tmp = f"{path}.tmp"
    with open(tmp, "wb") as fh:
        writer = _HashingWriter(fh)
        torch.save({"config": config, "model": state, "step": step, "tokens": tokens}, writer)
    os.replace(tmp, path)
    return writer.digest.hexdigest(), writer.size


WRAPPER_PREFIXES = ("_orig_mod.", "module.")  # torch.compile's and DDP's, in either order


def plain_key(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix):], True
    return key


class CheckpointError(ValueError):
    """A team's own checkpoint that the harness cannot score; the message says what to save instead."""


def normalize_team_checkpoint(src: str | Path, dst: str | Path) -> dict:
    """An open-division script's checkpoint, {"model": state_dict, "config": dict, "step"?}, in the
    harness's form: loaded with weights_only=True (no code in a pickle runs), the wrapper prefixes of
    torch.compile and DDP stripped, tensors on the CPU, written atomically. Returns what it found."""
    import torch

    fix = 'save {"model": raw_model.state_dict(), "config": config_dict, "step": step} with torch.save on rank 0'
    try:
        raw = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"the checkpoint does not load with torch.load(weights_only=True): "
                              f"{type(exc).__name__}: {str(exc)[:300]}. Fix: {fix}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict) or not isinstance(raw.get("config"), dict):
        keys = sorted(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"the checkpoint must be a dict with a 'model' state dict and a 'config' dict, got {keys}. "
                              f"Fix: {fix}")
    state = {}
    for key, value in raw["model"].items():
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"the checkpoint's model entry {key!r} is a {type(value).__name__}, not a tensor. "
                                  f"Fix: {fix}")
        state[plain_key(str(key))] = value.detach().cpu()
    if len(state) != len(raw["model"]):
        raise CheckpointError(f"two of the checkpoint's model keys are the same once the torch.compile/DDP prefixes "
                              f"are removed. Fix: {fix}")
    step = raw.get("step")
    step = int(step) if isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= 2**62 else None
    tmp = f"{dst}.tmp"
    torch.save({"config": raw["config"], "model": state, "step": step, "tokens": None}, tmp)
    os.replace(tmp, dst)
    tensors = distinct_tensors(state)
    return {"step": step, "params": sum(dict(tensors.values()).values()), "tensors": tensors,
            "config": raw["config"], "prefixes_removed": any(plain_key(str(k)) != str(k) for k in raw["model"])}


def distinct_tensors(state: dict) -> dict[str, list[int]]:
    """Each key of a state dict -> [which distinct tensor it is, its element count]. Tied weights (one
    Parameter under two names: GPT-2's wte and lm_head) are one tensor, here as in the model: the
    launcher counts parameters over the names the model calls parameters, each tensor once, and a
    count can never exceed what the checkpoint really holds, whatever those names are."""
    index: dict[tuple, int] = {}
    out: dict[str, list[int]] = {}
    for key, tensor in state.items():
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        out[key] = [index.setdefault(ident, len(index)), int(tensor.numel())]
    return out


def main(argv: list[str]) -> None:
    """python -m harness.ranks.checkpoint SRC DST: normalise, print one JSON line (or {"error": ...})."""
    import json

    try:
        found = normalize_team_checkpoint(argv[1], argv[2])
        print(json.dumps(found, default=str))
    except CheckpointError as exc:
        print(json.dumps({"error": str(exc)}))


if __name__ == "__main__":
    main(sys.argv)
