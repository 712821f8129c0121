"""Checks a submission in a throw-away process before any process group starts.

    python -m harness.ranks.preflight <request.json> <report.json>

Imports the submission, checks CONFIG and the hooks, builds the model from CONFIG, runs one
forward and backward at a tiny batch, and checks the outputs. The submission's code never runs
in the launcher process, which writes the records.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def _problem(exc: BaseException) -> dict:
    from harness.submission.contract import SubmissionError

    if isinstance(exc, SubmissionError):
        return {"file": exc.file, "problem": exc.problem, "fix": exc.fix}
    tb = traceback.extract_tb(exc.__traceback__)
    where = next((f"{f.filename}:{f.lineno}" for f in reversed(tb) if "/harness/" not in f.filename), "")
    return {"file": where, "problem": f"{type(exc).__name__}: {exc}", "fix": "",
            "traceback": "".join(traceback.format_exception(exc))}


def check_model(sub, device_kind: str, seed: int, vocab_size: int, eval_seq_len: int | None = None,
                precision: str = "bfloat16") -> dict:
    """Build the model and run one training step's worth of forward and backward at a tiny batch."""
    import torch

    from harness.submission.contract import SubmissionError, check_forward_output

    file = str(sub.file)
    device = torch.device("cuda", 0) if device_kind == "cuda" else torch.device("cpu")
    torch.manual_seed(seed)
    autocast = lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,  # noqa: E731
                                      enabled=precision == "bfloat16")
    model = sub.get_model(dict(sub.config))
    if not isinstance(model, torch.nn.Module):
        raise SubmissionError(file, f"get_model returned a {type(model).__name__}, not a torch.nn.Module.",
                              "return the model instance from get_model(config)")
    model.to(device=device, dtype=torch.float32)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise SubmissionError(file, "the model has no trainable parameters.", "return a model with parameters")
    batch, T, V = 2, sub.seq_len, sub.vocab_out
    idx = torch.randint(0, vocab_size, (batch, T + 1), device=device)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    with autocast():
        out = model(x, y)
    check_forward_output(out, batch, T, V, True, file)
    shapes = {"logits_shape": list(out[0].shape), "logits_dtype": str(out[0].dtype).replace("torch.", ""),
              "loss_dtype": str(out[1].dtype).replace("torch.", "")}
    loss = out[1]
    if not torch.isfinite(loss.detach()).item():
        raise SubmissionError(file, f"the loss of the freshly built model is {loss.item()}.",
                              "check the initialisation and the loss computation")
    loss.backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    if unused:
        shown = ", ".join(unused[:5]) + (" ..." if len(unused) > 5 else "")
        raise SubmissionError(file, f"{len(unused)} trainable parameter(s) get no gradient: {shown}.",
                              "DDP needs every trainable parameter used in forward: remove them or set requires_grad=False")
    model.zero_grad(set_to_none=True)
    with torch.no_grad(), autocast():
        out = model(x)
    check_forward_output(out, batch, T, V, False, file)
    if eval_seq_len and eval_seq_len != T:  # evaluation scores windows of the track's length, not CONFIG's
        long = torch.randint(0, vocab_size, (1, eval_seq_len), device=device)
        try:
            with torch.no_grad(), autocast():
                out = model(long)
        except Exception as exc:
            raise SubmissionError(
                file, f"forward fails on a window of {eval_seq_len} tokens, the track's evaluation length "
                f"({type(exc).__name__}: {exc}).", f"accept sequences up to {eval_seq_len} tokens (size position "
                "tables for the evaluation length, not only CONFIG's seq_len)") from exc
        check_forward_output(out, 1, eval_seq_len, V, False, file)
    from harness.ranks.causality import describe, probe_causality

    causality = probe_causality(model, idx[0, :T].cpu(), vocab_size, device, seed=seed)
    if not causality["causal"]:
        raise SubmissionError(file, describe(causality) + ".", "mask attention (is_causal=True) and never look ahead")
    from harness.ranks.flops import count_training_flops_per_token

    flops = count_training_flops_per_token(lambda: sub.get_model(dict(sub.config)), vocab_size,
                                           sub.micro_batch_size, T, built=model)  # no second build
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "trainable_params": sum(p.numel() for p in trainable),
        "initial_loss": float(loss.item()),
        "causality": causality,
        **shapes,
        **flops,
    }


def run_checks(request: dict) -> dict:
    """Every problem found, at once where they are independent; the static screen always."""
    from harness.submission.contract import config_warnings, import_submission_module, inspect_submission
    from harness.submission.screen import screen_folder

    folder = Path(request["submission_dir"])
    report: dict = {"ok": False, "problems": [], "warnings": [], "screen": screen_folder(folder)}
    try:
        module = import_submission_module(folder)
        if isinstance(getattr(module, "CONFIG", None), dict):
            report["warnings"] = config_warnings(module.CONFIG)
        sub, problems = inspect_submission(module, folder, request["vocab_size"])
        report["problems"] += [_problem(p) for p in problems]
        if sub is not None:
            report["config"] = sub.config
            report["compile"] = sub.compile
            report.update(check_model(sub, request["device"], request["seed"], request["vocab_size"],
                                      request.get("eval_seq_len"), request.get("precision", "bfloat16")))
    except BaseException as exc:  # the model's problems depend on each other: the first one is reported
        report["problems"].append(_problem(exc))
    report["ok"] = not report["problems"]
    return report


@dataclass
class OpenModel:
    """An open-division model as check_model sees it: model.py's get_model and the checkpoint's config."""

    folder: Path
    file: Path
    config: dict
    get_model: Any
    seq_len: int
    vocab_out: int
    micro_batch_size: int = 1  # FLOPs per token hardly depend on it; the script's batch is not known here


def run_open_checks(request: dict) -> dict:
    """Before training: the files compile and model.py defines get_model. After it (with the script's
    checkpoint, already in the harness's form): the model rebuilt from its config, the weights loaded
    strictly, and the model checked like a fixed-loop submission's (shapes, gradients, evaluation
    length, causality, FLOPs)."""
    from harness.ranks.checkpoint import unwrap
    from harness.submission.contract import SubmissionError, import_submission_module
    from harness.submission.screen import screen_folder

    folder = Path(request["submission_dir"])
    model_file = request["model_file"]
    report: dict = {"ok": False, "problems": [], "screen": screen_folder(folder, script=request.get("script"))}
    try:
        for path in sorted(folder.rglob("*.py")):
            source = path.read_text(errors="replace")
            compile(source, str(path), "exec")  # a syntax error is found now, not after the budget
        module = import_submission_module(folder, model_file)
        get_model = getattr(module, "get_model", None)
        if not callable(get_model):
            raise SubmissionError(folder / model_file, "defines no get_model(config).",
                                  "define get_model(config) returning the model your checkpoint's state dict loads into")
        if request.get("checkpoint"):  # normalised by harness code, hashed; this process may only read it
            import torch

            saved = torch.load(request["checkpoint"], map_location="cpu", weights_only=True)
            config = saved["config"]
            try:  # the weights must be those of get_model(config): evaluation loads them the same way
                unwrap(get_model(dict(config))).load_state_dict(saved["model"], strict=True)
            except Exception as exc:
                raise SubmissionError(folder / model_file, "the checkpoint does not load into get_model(checkpoint"
                                      f"['config']): {type(exc).__name__}: {str(exc)[:600]}",
                                      "save the state dict of the model get_model(config) builds, with that config")
            del saved
            seq_len = int(config.get("seq_len") or config.get("block_size") or request["eval_seq_len"])
            model = OpenModel(folder=folder, file=folder / model_file, config=config, get_model=get_model,
                              seq_len=seq_len, vocab_out=int(config.get("vocab_size") or request["vocab_size"]))
            report.update(check_model(model, request["device"], request["seed"], request["vocab_size"],
                                      request.get("eval_seq_len"), request.get("precision", "bfloat16")))
    except SyntaxError as exc:
        report["problems"].append({"file": f"{exc.filename}:{exc.lineno}", "problem": f"syntax error: {exc.msg}.",
                                   "fix": "fix the line shown", "line": (exc.text or "").rstrip("\n")})
    except BaseException as exc:
        report["problems"].append(_problem(exc))
    report["ok"] = not report["problems"]
    return report


def main(argv: list[str]) -> None:
    request = json.loads(Path(argv[1]).read_text())
    from harness.ranks import sandbox

    box = sandbox.apply(sandbox.Policy.from_dict(request["policy"])) if request.get("policy") else \
        sandbox.SandboxReport(False, "no sandbox was asked for")
    try:
        if not box.active and request.get("sandbox") == "required":
            raise RuntimeError(f"the track requires the sandbox and it is not available here: {box.why}")
        import torch

        torch.set_num_threads(max(1, int(request.get("threads", 1))))
        report = run_open_checks(request) if request.get("division") == "open" else run_checks(request)
    except BaseException as exc:
        report = {"ok": False, "problems": [_problem(exc)]}
    report["sandbox"] = box.to_dict()
    Path(argv[2]).write_text(json.dumps(report, indent=1, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
