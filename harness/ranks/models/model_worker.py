"""Evaluation's model process: runs the submission's model, and nothing else, for one scorer.

    python -u -m harness.ranks.models.model_worker <requests fd> <replies fd> <logits fd> <logits bytes>

Started by a scorer (harness/scoring/scorer.py), which holds the validation tokens and computes
the score: as a fork of the scorer's clean template (harness/ranks/models/model_template.py calls `main`),
or, where there is none, as the command above. This process never holds a target: it gets the inputs of one batch at a time over a
pipe, runs forward, writes the logits into a shared buffer and says so. Before it imports
anything of the submission it enters the sandbox (no validation data, no runs tree, no TCP;
it never runs at the same time as the other model process of its scorer: the
scoring one is killed, with all it started, before the check one starts), and it is told nothing about which
batch is which: a batch that is scored and a batch that checks causality look the same. It holds the
scorer's determinism settings (`hold_determinism`) before the model is built and before every forward,
so that both model processes give the same numbers for the same inputs on a GPU too.

The messages are harness/ranks/models/wire.py's.
"""

from __future__ import annotations

import json
import mmap
import os
import sys
import traceback
from pathlib import Path

from harness.ranks.models.wire import DTYPES, ERROR, LOGITS, QUIT, READY, SANDBOX, SETUP, receive, send

_team_dir: str | None = None  # the submission this process runs: a failure's reason names its file:line


def load_model(checkpoint: str, submission_dir: str, device, model_file: str = "submission.py"):
    """The trained model, rebuilt by the submission's get_model from the checkpoint's config alone,
    unwrapped (a get_model that returns torch.compile(model) is evaluated as the plain module:
    evaluation speed is not scored, and compiling again could outlast the evaluation timeout)."""
    import torch

    from harness.ranks.checkpoint import load_module_state, unwrap
    from harness.submission.contract import SubmissionError, import_submission_module

    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    module = import_submission_module(Path(submission_dir), model_file)
    get_model = getattr(module, "get_model", None)
    if not callable(get_model):
        raise SubmissionError(Path(submission_dir) / model_file, "defines no get_model.", "see docs/submission.md")
    model = unwrap(get_model(dict(ckpt["config"])))
    try:  # the model's own load_state_dict (team code runs here anyway), strict on parameters and buffers
        load_module_state(model, ckpt["model"])
    except ValueError as exc:  # the team's checkpoint and its get_model(config) disagree: not scorable
        raise SubmissionError(Path(submission_dir) / model_file, "the checkpoint does not load into "
                              f"get_model(checkpoint['config']): {str(exc)[:600]}",
                              "save the state dict of the model get_model(config) builds, with the config it was "
                              "built from") from None
    model.to(device=device, dtype=torch.float32)
    model.eval()
    return model


def eager():
    """Compiled code of the team's (torch.compile in get_model or at import: a block, flex attention) runs
    eagerly here, as the unwrapped model does: compiling in a fresh process's empty cache would take the
    first batch tens of seconds (and flag the run as work that is not a forward pass), and evaluation's
    speed is not scored. torch._dynamo is not loaded for it where the submission never loaded it."""
    import contextlib

    if "torch._dynamo" not in sys.modules:
        return contextlib.nullcontext()
    import torch

    return torch.compiler.set_stance("force_eager")


def hold_determinism(spec: dict) -> None:
    """Put in force what makes the same inputs give the same numbers in the scoring and the check process
    (the scorer's DETERMINISM, harness/scoring/scorer.py): called before the team's model is built and
    again right before every forward, because team code may flip any of it (`cudnn.benchmark = True` in
    get_model). Inductor's config is set only where something already loaded it (importing it costs a
    second and loads dynamo); the environment covers a later import. Where a setting still differs, or
    team code changes it during a forward, the check's reproduction batch shows it ("inconclusive")."""
    import torch

    os.environ.update(spec.get("env", {}))  # cuBLAS reads its workspace when it makes a handle; Inductor at import
    if spec.get("deterministic_algorithms"):
        warn_only = spec["deterministic_algorithms"] == "warn_only"
        # What torch.use_deterministic_algorithms does but for setting Inductor's config, which it imports
        # (and with it Inductor and dynamo: 1.7 s of CPU in every model process, a model that never compiles
        # included). Inductor's flag is set below where it is loaded; the environment covers a later import.
        try:
            torch._C._set_deterministic_algorithms(True, warn_only=warn_only)
        except (AttributeError, TypeError):  # another torch: the public call, import and all
            torch.use_deterministic_algorithms(True, warn_only=warn_only)
        # ...which also fills every torch.empty with NaN: a model that reads a buffer it only partly wrote (and
        # masks the rest) would score NaN in evaluation alone. Kernels' determinism is what is wanted, not this.
        # Imported here: nothing else loads the module now that Inductor is not imported.
        try:
            import torch.utils.deterministic as utils
        except ImportError:  # a torch without the setting: nothing to turn off
            utils = None
        if utils is not None and hasattr(utils, "fill_uninitialized_memory"):
            utils.fill_uninitialized_memory = False
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and spec.get("env", {}).get("TORCH_COMPILE_DISABLE") == "1":
        dynamo.config.disable = True  # loaded before the environment was set (get_model's compile): the same
    if "cudnn_benchmark" in spec:
        torch.backends.cudnn.benchmark = bool(spec["cudnn_benchmark"])
    if "cudnn_deterministic" in spec:
        torch.backends.cudnn.deterministic = bool(spec["cudnn_deterministic"])
    config = sys.modules.get("torch._inductor.config")
    if config is not None:
        for name, value in spec.get("inductor", {}).items():
            *path, leaf = name.split(".")
            target = config
            for part in path:
                target = getattr(target, part, None)
            if target is not None and hasattr(target, leaf):  # another torch may lack one: the others still hold
                setattr(target, leaf, value)


def _die_with_parent() -> None:
    """If the scorer dies, so does this process (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG


def pin_for_copies(buffer: mmap.mmap, device) -> str:
    """Page-lock the shared buffer for the GPU's copy engine: the logits' copy out of the device then runs
    at the bus's speed, without the driver's staging through its own pinned pages. Through the driver API
    (cuMemHostRegister), not the runtime's cudaHostRegister: a refusal there would stay the runtime's
    "last error" and surface at the next kernel launch (torch checks it after each) as the team's crash.
    Refused (a limit on locked memory), the copy still works, pageable. Returns which it is."""
    import ctypes

    import torch

    torch.zeros(1, device=device)  # the device's primary context, current on this thread, before any team code
    try:
        register = ctypes.CDLL("libcuda.so.1").cuMemHostRegister_v2
    except (OSError, AttributeError) as exc:
        return f"pageable (no cuMemHostRegister: {exc})"
    register.argtypes, register.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint], ctypes.c_int
    code = register(torch.frombuffer(buffer, dtype=torch.uint8).data_ptr(), len(buffer), 0x01)  # PORTABLE
    return "page-locked" if code == 0 else f"pageable (cuMemHostRegister error {code})"


def serve(requests: int, replies: int, buffer: mmap.mmap) -> None:
    kind, *_, payload = receive(requests)
    if kind != SETUP:
        raise ValueError("expected setup first")
    setup = json.loads(payload)
    global _team_dir
    _team_dir = setup.get("submission_dir")
    from harness.ranks.confine import sandbox

    # All before the submission, on one thread (sandbox.enter); torch is loaded below, or already (the template's).
    policy = sandbox.Policy.from_dict(setup["policy"]) if setup.get("policy") else None
    report = sandbox.enter(policy, "the track turns the sandbox off")
    # The report leaves as bytes now, before any team code runs: nothing it does later (frames, gc) can
    # change what the scorer records.
    send(replies, SANDBOX, payload=json.dumps(report.to_dict()).encode())
    if not report.active and setup.get("sandbox") == "required":
        raise RuntimeError(f"the track requires the sandbox and it is not available here: {report.why}")

    import torch

    from harness.submission.contract import check_forward_output

    from harness.ranks.process import deterministic_compile

    deterministic_compile()  # the scoring and the check process pick the same kernels (harness/ranks/process.py)
    determinism = setup.get("determinism") or {}
    hold_determinism(determinism)  # before CUDA starts and before the model is built
    torch.set_num_threads(max(1, int(setup["threads"])))
    device = torch.device(setup["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
        logits_buffer = pin_for_copies(buffer, device)
    else:
        logits_buffer = "host memory (no device)"
    model_file = setup.get("model_file", "submission.py")
    model = load_model(setup["checkpoint"], setup["submission_dir"], device, model_file)
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=setup["precision"] == "bfloat16")
    vocab_out, file = int(setup["vocab_out"]), os.path.join(setup["submission_dir"], model_file)
    del report
    send(replies, READY, payload=json.dumps({"params": sum(p.numel() for p in model.parameters()),
                                             "logits_buffer": logits_buffer}).encode())
    codes = {v: k for k, v in DTYPES.items()}
    while True:
        kind, rows, seq_len, _, payload = receive(requests)
        if kind == QUIT:
            return
        idx = torch.frombuffer(bytearray(payload), dtype=torch.int64).view(rows, seq_len).to(device)
        hold_determinism(determinism)  # again: get_model or an earlier forward may have flipped it
        with torch.inference_mode(), autocast, eager():
            out = model(idx)
        check_forward_output(out, rows, seq_len, vocab_out, False, file)
        logits = out[0].detach()
        if str(logits.dtype).replace("torch.", "") not in codes:
            logits = logits.float()  # float64 and other float types are scored in float32
        name = str(logits.dtype).replace("torch.", "")
        n = logits.numel()
        if n * logits.element_size() > len(buffer):
            raise RuntimeError(f"the logits of a batch ({n} values) do not fit the shared buffer")
        shared = torch.frombuffer(buffer, dtype=logits.dtype, count=n).view(logits.shape)
        shared.copy_(logits)  # from a GPU: one device-to-host copy, straight into the shared buffer
        send(replies, LOGITS, rows, seq_len, codes[name])


def main(argv: list[str]) -> None:
    requests, replies, buffer_fd, size = int(argv[1]), int(argv[2]), int(argv[3]), int(argv[4])
    _die_with_parent()
    from harness.ranks.process import show_native_crashes

    show_native_crashes()  # its stderr is its log
    buffer = mmap.mmap(buffer_fd, size)
    code = 0
    try:
        serve(requests, replies, buffer)
    except EOFError:  # the scorer went away: nothing to report to
        code = 1
    except BaseException as exc:  # every failure becomes a report the scorer turns into a status
        from harness.ranks.process import describe_failure, team_site

        report = describe_failure(exc, _team_dir)
        # What the scorer keeps of a failure once batches came (workers.withheld_reason): these two, checked there.
        report.update(site=team_site(exc, _team_dir), exception=type(exc).__name__)
        print(report["traceback"], file=sys.stderr, flush=True)
        try:
            send(replies, ERROR, payload=json.dumps(report, default=str).encode())
        except OSError:
            pass
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except BaseException:
        traceback.print_exc()
        os._exit(1)
