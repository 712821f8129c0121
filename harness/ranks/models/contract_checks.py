"""The checks the check process makes of a team's model (harness/ranks/models/preflight.py for the fixed loop,
open_checks.py for the open division's model file): the contract's outputs, parameters and FLOPs on the meta
device, one tiny forward and backward for real, the evaluation length, the quick causality probe, and how a
problem is named (the team's file and line, and the fix). Runs beside the team's code, in that process.
"""

from __future__ import annotations

import traceback
from pathlib import Path

# Tokens the quick causality probe runs on: enough for a missing mask to show at every probed cut,
# an eighth of a Paris 2026 window. Evaluation checks causality again on the full scoring windows.
CAUSALITY_WINDOW = 128
# On a CPU, the most float32 weights and gradients the real pass may hold: past it (about 134M parameters,
# 8 bytes each), a team's laptop checks the model by its shapes alone, in seconds and well under 2 GiB at
# 1B parameters (issue 31), and the values are first seen by the run. A GPU check has the device's memory
# and makes the real pass always.
VALUES_MAX_GIB_ON_CPU = 1.0


def problem_of(exc: BaseException, team_dir: str, sandboxed: bool = True) -> dict:
    """One problem, named at the team's innermost file:line where the team's code is on its traceback
    (a shape error in model.py:63 is model.py's, even when the check of submission.py found it).
    `sandboxed`: whether the process is (an access it was refused is then the sandbox's, and the fix says so)."""
    from harness.ranks.process import team_site
    from harness.submission.contract import SubmissionError

    site = team_site(exc, team_dir)
    if isinstance(exc, SubmissionError):
        return {"file": site or exc.file, "problem": exc.problem, "fix": exc.fix,
                **({"traceback": "".join(traceback.format_exception(exc))} if site else {})}
    tb = traceback.extract_tb(exc.__traceback__)
    where = site or next((f"{f.filename}:{f.lineno}" for f in reversed(tb) if "/harness/" not in f.filename), "")
    return {"file": where, "problem": f"{type(exc).__name__}: {exc}", "fix": refused_fix(exc, tb, sandboxed),
            "traceback": "".join(traceback.format_exception(exc))}


def refused_fix(exc: BaseException, tb: list, sandboxed: bool = True) -> str:
    """What to do about what the sandbox refused: the check runs the team's code as evaluation's model processes
    do (no socket, no network, writes in its own folders only), so what fails here would fail there, after the
    training. Python's multiprocessing needs a socket for a forkserver pool and for a Manager's server."""
    def through(module: str) -> bool:
        return any(f.filename.replace("\\", "/").endswith(f"multiprocessing/{module}") for f in tb)

    if through("managers.py") and isinstance(exc, (EOFError, OSError)):  # the server was refused its socket
        return ("a multiprocessing Manager serves its objects over a socket, and the check, as evaluation, may make "
                "none: share through multiprocessing's Queue, Value or Array instead")
    if not isinstance(exc, PermissionError):
        return ""
    if through("forkserver.py"):
        return ("a multiprocessing pool here needs the 'spawn' start method (multiprocessing.get_context('spawn')): "
                "'forkserver', Python 3.14's default, listens on a socket, and the check, as evaluation, may make none")
    if not sandboxed:
        return ""
    return ("the check runs your code sandboxed, as evaluation does: it may write only its working folder (HOME, "
            "TMPDIR) and /dev/shm, and may make no socket nor reach the network (docs/submission.md)")


def check_forward_signature(model, file: str) -> None:
    """forward must take (idx, targets) and (idx) alone: a wrong signature otherwise raises inside torch's
    Module.__call__, with no frame of the team's, and was reported at torch's module.py by absolute path.
    Named here at the team's `def forward` line, with the fix."""
    import inspect

    from harness.submission.contract import SubmissionError

    forward = getattr(model, "forward", None)
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):  # a builtin or an odd callable: its calls below say what is wrong
        return
    wrong = []
    for call, args in (("forward(idx, targets)", (None, None)), ("forward(idx)", (None,))):
        try:
            signature.bind(*args)
        except TypeError as exc:
            wrong.append(f"{call} ({exc})")
    if not wrong:
        return
    where = file
    try:
        code = inspect.unwrap(getattr(type(model), "forward", forward))
        where = f"{inspect.getsourcefile(code)}:{inspect.getsourcelines(code)[1]}"
    except (TypeError, OSError):
        pass
    raise SubmissionError(where, f"{type(model).__name__}.forward{signature} cannot be called as "
                          + " nor as ".join(wrong) + ": training calls forward(idx, targets), evaluation forward(idx).",
                          "define forward(self, idx, targets=None) and return (logits, loss), loss None without targets")


def call_forward(model, args: tuple, file: str):
    """model(*args); a TypeError it raises is named at the team's `def forward` where the signature explains it
    (check_forward_signature), and is otherwise the team's own, as raised. Diagnosed only after a call failed:
    a forward that runs (behind a decorator, a pre-hook, an own __call__) is never judged by its signature."""
    from harness.submission.contract import SubmissionError

    try:
        return model(*args)
    except TypeError as exc:
        try:
            check_forward_signature(model, file)
        except SubmissionError as named:
            raise named from exc
        raise


def _shapes_on_meta(sub, eval_seq_len: int, file: str, sizes: dict) -> dict:
    """The contract's shapes at full size with no arithmetic: the model built on the meta device (no
    memory, no values), one training forward and backward at the run's own micro-batch under the FLOP
    counter, a forward without targets, and one at the evaluation length. A SubmissionError here is
    the submission's; any other error means the model needs real values (the caller falls back)."""
    import torch

    from harness.ranks.flops import flop_counter
    from harness.submission.contract import check_forward_output

    from harness.ranks.checkpoint import unwrap

    B, T, V = sub.micro_batch_size, sub.seq_len, int(sub.config["vocab_size"])
    with torch.device("meta"):
        built = sub.get_model(dict(sub.config))
    model = unwrap(built)  # shapes need no compiler
    if not isinstance(model, torch.nn.Module) or not any(p.requires_grad for p in model.parameters()):
        return {}  # reported by the real build, with its message
    sizes.update(_parameters(model))  # the caller's, even where the forward below needs real values (not a lazy one)
    model.to(device="meta", dtype=torch.float32).train()  # buffers a model builds on an explicit device too
    idx = torch.empty(B, T, dtype=torch.long, device="meta")
    with flop_counter() as counter:
        out = call_forward(model, (idx, idx), file)
        check_forward_output(out, B, T, V, True, file)
        out[1].backward()
    shapes = {"logits_shape": list(out[0].shape), "flops_per_token": counter.get_total_flops() / (B * T),
              "flops_method": "meta", "compiled_by_get_model": model is not built}
    sizes.update(_parameters(model))  # again: a lazy model's is known only now that its first forward shaped it
    shapes.update(sizes)
    # A gradient for every parameter, as far as the meta device shows it: a parameter only a real device's
    # branch uses looks unused here, so it only warns, where no real backward runs (check_model).
    shapes["meta_unused"] = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        check_forward_output(call_forward(model, (idx,), file), B, T, V, False, file)
        long = torch.empty(2, eval_seq_len, dtype=torch.long, device="meta")
        check_forward_output(model(long), 2, eval_seq_len, V, False, file)
    return shapes


def _parameters(model) -> dict:
    from torch.nn.parameter import is_lazy

    if any(is_lazy(p) for p in model.parameters()):  # shaped by the first forward: counted after it
        return {}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return {"params": sum(p.numel() for p in model.parameters()), "values_gib": _float32_gib(model),
            "param_names": [name for name, _ in model.named_parameters()],  # open division: counted by the launcher
            "trainable_params": sum(p.numel() for p in trainable)}


def _float32_gib(model) -> float:
    """What the real pass would hold: each distinct storage of the parameters in float32 (a tied or expanded
    weight counts once, as allocated), and a float32 gradient of every trainable parameter's shape."""
    storages: dict[int, int] = {}
    for p in model.parameters():
        storage = p.untyped_storage()
        storages[storage._cdata] = storage.nbytes() // max(1, p.element_size()) * 4
    grads = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    return (sum(storages.values()) + grads) / 2**30


def unused_error(model, file: str) -> None:
    """DDP needs a gradient for every trainable parameter: raised naming the first five that got none."""
    from harness.submission.contract import SubmissionError

    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if unused:
        shown = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
        raise SubmissionError(file, f"{len(unused)} trainable parameter(s) get no gradient: {shown}.",
                              "DDP needs every trainable parameter used in forward: remove them or set requires_grad=False")


def values_unchecked(sizes: dict, device_kind: str, meta_why: str = "") -> str:
    """Why the real pass is not made ("" where it is): on a CPU, a model whose float32 weights and gradients
    are past VALUES_MAX_GIB_ON_CPU is checked on the meta device alone; `meta_why`: why its forward could not
    run there either (its build alone was then checked)."""
    need_gib = sizes.get("values_gib")
    if need_gib is None or device_kind == "cuda" or need_gib <= VALUES_MAX_GIB_ON_CPU:
        return ""
    past = (f"{sizes['params']:,} parameters hold {need_gib:.1f} GiB of float32 weights and gradients, past the "
            f"check's {VALUES_MAX_GIB_ON_CPU} GiB on a CPU")
    if meta_why:
        return (f"{past}, and its forward cannot run on the meta device ({meta_why}): only its build was checked, "
                "not its shapes nor its values (a finite first loss, causality)")
    return f"{past}: its shapes and FLOPs were checked on the meta device, not its values (a finite first loss, causality)"


def check_model(sub, device_kind: str, seed: int, vocab_size: int, eval_seq_len: int | None = None,
                precision: str = "bfloat16") -> dict:
    """The model's contract at the submission's real size, in as little arithmetic as honesty allows.

    Shapes at the run's micro-batch, parameter count and FLOPs on the meta device (free at any size);
    then for real, once each: the model built, one forward and backward at batch 1 and the training
    length (a finite loss, a gradient for every parameter), one forward at the evaluation length where
    it differs from the training length, and the causality probe on a short window. On a CPU this is
    float32 (bf16 there may be emulated, ~45x slower), and a model whose float32 weights and gradients
    pass VALUES_MAX_GIB_ON_CPU gets the meta pass alone (values_unchecked says why; a parameter with no
    gradient there is a warning, `model_warnings`). benchmarks/check_size.py times it at the Paris 2026
    sizes. A model that cannot run on the meta device (it needs real values) is checked for real at
    batch 2, with FLOPs counted as flops.py does.
    """
    import time

    import torch

    from harness.ranks.checkpoint import unwrap
    from harness.submission.contract import SubmissionError, check_forward_output

    file = str(sub.file)
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    T, V = sub.seq_len, sub.vocab_out
    eval_len = eval_seq_len or T
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    sizes: dict = {}
    try:
        with torch.random.fork_rng(devices=[]):  # a forward that draws (layer drop) gives one verdict, not a coin's
            torch.manual_seed(seed)
            meta = _shapes_on_meta(sub, eval_len, file, sizes)
        meta_why = ""
    except SubmissionError:
        raise
    except Exception as exc:  # noqa: BLE001  (data-dependent code: shapes are checked for real below)
        meta, meta_why = {}, f"{type(exc).__name__} on the meta device"
    timings["meta_s"] = time.perf_counter() - t0
    skipped = values_unchecked(meta or sizes, device_kind, meta_why)
    unused_on_meta = meta.pop("meta_unused", [])
    if skipped:
        found = {"compiled_by_get_model": None, "logits_shape": None, "flops_per_token": None, **sizes, **meta,
                 "initial_loss": None, "causality": None, "values_checked": skipped, "check_timings_s": timings,
                 "shapes_on": "meta" if meta else f"not checked ({meta_why})", "real_batch": None,
                 "logits_dtype": None, "loss_dtype": None}
        if unused_on_meta:  # the meta device's word alone: a real device's branch may use them (not a rejection)
            shown = ", ".join(unused_on_meta[:5]) + (" ..." if len(unused_on_meta) > 5 else "")
            found["model_warnings"] = [f"{len(unused_on_meta)} trainable parameter(s) got no gradient on the meta device: "
                                 f"{shown}; DDP needs every trainable parameter used in forward, or the run's first "
                                 "step fails"]
        return found

    torch.manual_seed(seed)
    autocast = lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,  # noqa: E731
                                      enabled=precision == "bfloat16")
    t0 = time.perf_counter()
    model = sub.get_model(dict(sub.config))
    if not isinstance(model, torch.nn.Module):
        raise SubmissionError(file, f"get_model returned a {type(model).__name__}, not a torch.nn.Module.",
                              "return the model instance from get_model(config)")
    # A torch.compile'd module is checked as evaluation runs it, eagerly: compiling it here would cost
    # minutes at the several shapes below. That it compiles is said: its first training step will.
    plain = unwrap(model)
    compiled_by_get_model, model = plain is not model, plain
    model.to(device=device, dtype=torch.float32)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise SubmissionError(file, "the model has no trainable parameters.", "return a model with parameters")
    timings["build_s"] = time.perf_counter() - t0

    # Batch 1 when the meta pass saw the real micro-batch's shapes; 2 otherwise, so that a batch
    # dimension mixed up with another is still caught. At the training length, as training calls it.
    t0 = time.perf_counter()
    batch = 1 if meta else 2
    idx = torch.randint(0, vocab_size, (batch, T + 1), device=device)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    with autocast():
        out = call_forward(model, (x, y), file)
    check_forward_output(out, batch, T, V, True, file)
    shapes = {"logits_dtype": str(out[0].dtype).replace("torch.", ""), "loss_dtype": str(out[1].dtype).replace("torch.", ""),
              "logits_shape": meta.get("logits_shape", list(out[0].shape)), "real_batch": batch,
              "shapes_on": "meta" if meta else f"cpu ({meta_why})"}
    loss = out[1]
    if not torch.isfinite(loss.detach()).item():
        raise SubmissionError(file, f"the loss of the freshly built model is {loss.item()}.",
                              "check the initialisation and the loss computation")
    loss.backward()
    unused_error(model, file)
    model.zero_grad(set_to_none=True)
    if not meta:  # the shapes without targets, for real
        with torch.no_grad(), autocast():
            check_forward_output(model(x), batch, T, V, False, file)
    timings["step_s"] = time.perf_counter() - t0

    # The evaluation length, for real, once: a position table too short shows only on real values. At
    # the training length the step above was that check.
    t0 = time.perf_counter()
    if eval_len != T:
        model.eval()
        with torch.inference_mode(), autocast():
            check_forward_output(_at_eval_length(model, vocab_size, eval_len, device, file), 1, eval_len, V, False, file)
        model.train()
    timings["eval_length_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    causality = _probe(model, vocab_size, eval_len, device, seed, file)
    timings["causality_s"] = time.perf_counter() - t0

    if meta:
        flops = {"flops_per_token": meta["flops_per_token"], "flops_method": meta["flops_method"]}
    else:
        from harness.ranks.flops import count_training_flops_per_token

        flops = count_training_flops_per_token(lambda: unwrap(sub.get_model(dict(sub.config))), vocab_size,
                                               sub.micro_batch_size, T)
    return {
        "compiled_by_get_model": compiled_by_get_model,
        **_parameters(model),
        "initial_loss": float(loss.item()),
        "causality": causality,
        "check_timings_s": timings,
        **shapes,
        **flops,
    }


def _probe(model, vocab_size: int, eval_len: int, device, seed: int, file: str) -> dict:
    """The quick causality probe on the first CAUSALITY_WINDOW tokens of an evaluation window (five
    forwards; at 1024 tokens they cost a 124M model more than the training step). A model that refuses
    the shorter window is probed at the full length."""
    import torch

    from harness.ranks.models.causality import describe, probe_causality
    from harness.submission.contract import SubmissionError

    window = torch.randint(0, vocab_size, (eval_len,), generator=torch.Generator().manual_seed(seed))
    try:
        causality = probe_causality(model, window[:CAUSALITY_WINDOW], vocab_size, device, seed=seed)
    except Exception:  # noqa: BLE001  (a model built for exactly its lengths: probe at the full one)
        try:
            causality = probe_causality(model, window, vocab_size, device, seed=seed)
        except Exception as exc:
            raise _eval_length_error(file, eval_len, exc) from exc
    if not causality["causal"]:
        raise SubmissionError(file, describe(causality) + ".", "mask attention (is_causal=True) and never look ahead")
    return causality


def _eval_length_error(file: str, eval_len: int, exc: BaseException):
    from harness.submission.contract import SubmissionError

    return SubmissionError(
        file, f"forward fails on a window of {eval_len} tokens, the track's evaluation length "
        f"({type(exc).__name__}: {exc}).", f"accept sequences up to {eval_len} tokens (size position "
        "tables for the evaluation length, not only CONFIG's seq_len)")


def _at_eval_length(model, vocab_size: int, eval_len: int, device, file: str):
    import torch

    try:
        return model(torch.randint(0, vocab_size, (1, eval_len), device=device))
    except Exception as exc:
        raise _eval_length_error(file, eval_len, exc) from exc


def screen_of(request: dict) -> list[dict]:
    """The static screen of the submission's files (it reads them and runs none)."""
    from harness.submission.screen import screen_folder

    try:
        return screen_folder(Path(request["submission_dir"]),
                             script=request.get("script") if request.get("division") == "open" else None,
                             target=request.get("target_track"))  # the track's device: `harness check` runs on a CPU
    except Exception as exc:  # noqa: BLE001  (an unreadable file: the checks report it with its name)
        return [{"file": ".", "line": 0, "category": "screen failed", "what": f"{type(exc).__name__}: {exc}",
                 "code": ""}]


SCREEN_MAX_FINDINGS = 500  # a reviewer reads the first hundreds; the count says how many more there were


def capped(findings: list[dict]) -> list[dict]:
    if len(findings) <= SCREEN_MAX_FINDINGS:
        return findings
    more = len(findings) - SCREEN_MAX_FINDINGS
    return [*findings[:SCREEN_MAX_FINDINGS], {"file": ".", "line": 0, "category": "screen truncated",
                                              "what": f"{more} more finding(s) not listed", "code": ""}]
