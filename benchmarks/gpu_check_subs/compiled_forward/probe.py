"""What an evaluation model process sees, printed as one line into its log (logs/eval-model-rank<R>.log,
logs/eval-check-rank<R>.log) for benchmarks/gpu_check.py to read:

- the GPUs it can reach (harness/scoring/scorer.py `one_visible_device`: its rank's GPU alone);
- whether its logits buffer is page-locked for the copy engine (harness/ranks/models/model_worker.py
  `pin_for_copies`), asked of the CUDA runtime without changing anything, and any CUDA error the
  registration left pending (a refused one would surface at the next kernel launch);
- Inductor's deterministic mode (harness/ranks/process.py MODEL_PROCESS_ENV).

Silent outside evaluation's model processes (no logits buffer): training and the check before the run.
"""

import ctypes
import json
import os
import sys

import torch

BUFFER = "harness-logits"  # the memfd's name (harness/scoring/workers.py _logits_buffer)
CUDA_MEMORY_TYPE_HOST = 1  # cudaPointerAttributes.type of page-locked host memory


def _pinned(maps: list[str], buffer: str) -> dict:
    paths = [line.split()[-1] for line in maps if len(line.split()) >= 6]
    cudart = next((p for p in paths if os.path.basename(p).startswith("libcudart")), None)
    if cudart is None:
        return {"pinned": None, "why": "libcudart is not loaded as a shared library here"}
    lib = ctypes.CDLL(cudart)  # the runtime torch loaded (same file: same handle)
    pending = lib.cudaPeekAtLastError()  # left by the harness's own calls; peeking does not clear it
    attributes = (ctypes.c_int * 16)()  # cudaPointerAttributes, its memory type first
    code = lib.cudaPointerGetAttributes(attributes, ctypes.c_void_p(int(buffer.split("-")[0], 16)))
    if code != 0 and pending == 0:
        lib.cudaGetLastError()  # this query's own error must not fail the model's next kernel launch
    return {"pinned": code == 0 and attributes[0] == CUDA_MEMORY_TYPE_HOST, "memory_type": attributes[0],
            "query_code": code, "pending_error": pending}


def report() -> None:
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    buffer = next((line for line in maps if BUFFER in line), None)
    if buffer is None:
        return
    config = sys.modules.get("torch._inductor.config")
    seen = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "inductor_deterministic_env": os.environ.get("TORCHINDUCTOR_DETERMINISTIC"),
            "inductor_config_deterministic": None if config is None else bool(config.deterministic)}
    if torch.cuda.is_initialized():
        seen.update(cuda_devices=torch.cuda.device_count(), **_pinned(maps, buffer))
    else:
        seen.update(cuda_devices=0, pinned=None, why="no CUDA in this process")
    print("gpu-check-probe " + json.dumps(seen), flush=True)
