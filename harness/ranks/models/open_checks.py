"""The open division's model checks, in the check process (harness/ranks/models/preflight.py's main):
before training, model.py's model with the config the team declared or its arguments suggest;
after, the model rebuilt from the checkpoint's config with its weights loaded. Runs team code:
only ever inside the sandboxed check process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.ranks.models.contract_checks import check_model, problem_of, screen_of


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
    from harness.ranks.checkpoint import load_module_state, unwrap
    from harness.submission.contract import SubmissionError, import_submission_module

    folder = Path(request["submission_dir"])
    model_file = request["model_file"]
    report: dict = {"ok": False, "problems": [], "warnings": [], "screen": request.get("screen") or screen_of(request)}
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
                load_module_state(unwrap(get_model(dict(config))), saved["model"])
            except Exception as exc:
                raise SubmissionError(folder / model_file, "the checkpoint does not load into get_model(checkpoint"
                                      f"['config']): {type(exc).__name__}: {str(exc)[:600]}",
                                      "save the state dict of the model get_model(config) builds, with that config")
            del saved
            seq_len = int(config.get("seq_len") or config.get("block_size") or request["eval_seq_len"])
            model = OpenModel(folder=folder, file=folder / model_file, config=config, get_model=get_model,
                              seq_len=seq_len, vocab_out=int(config.get("vocab_size") or request["vocab_size"]))
            found = check_model(model, request["device"], request["seed"], request["vocab_size"],
                                request.get("eval_seq_len"), request.get("precision", "bfloat16"))
            report["warnings"] = [*report.get("warnings", []), *found.pop("model_warnings", [])]
            report.update(found)
        elif request.get("config") is not None:
            # Strict: the team declared the config and it is checked where it will run (a check on this CPU
            # of a model for a GPU track may fail on GPU-only code, and then warns).
            strict = bool(request.get("config_declared")) and request.get("track_device", request["device"]) == \
                request["device"]
            if not strict and request.get("report_path"):
                _write_interim(request["report_path"], report)
            report["before_training"] = _before_training(folder, model_file, get_model, request)
            if not report["before_training"]["ok"]:
                problem = report["before_training"]["problem"]
                if strict:
                    report["problems"].append(problem)
                elif report["before_training"]["declared"]:
                    report["warnings"].append(
                        f"{problem['file']}: {problem['problem']} (checked on this {request['device']} with your "
                        f"[open.config]; the run checks it on the track's {request['track_device']} before training, "
                        "where a failure is invalid)")
                else:
                    report["warnings"].append(
                        f"{problem['file']}: {problem['problem']} (checked before training with the config your "
                        f"script's arguments suggest, {report['before_training']['config']}: if that is the config "
                        "train.py saves, the run will be invalid after training. Declare the config it saves as "
                        "[open.config] in submission.toml to have this checked strictly)")
    except SyntaxError as exc:
        report["problems"].append({"file": f"{exc.filename}:{exc.lineno}", "problem": f"syntax error: {exc.msg}.",
                                   "fix": "fix the line shown", "line": (exc.text or "").rstrip("\n")})
    except BaseException as exc:
        report["problems"].append(problem_of(exc, request["submission_dir"], request.get("sandboxed", True)))
    report["ok"] = not report["problems"]
    return report


def _write_interim(path: str, report: dict) -> None:
    """The report as it stands, before the check with a config the harness guessed: that check never
    rejects, so if it hangs or kills the process, the launcher keeps this and warns (check_process.CheckProcess)."""
    import json

    interim = {**report, "ok": not report["problems"], "interim": "model.py's check before training"}
    Path(path).write_text(json.dumps(interim, default=str))


def _unexpected_keyword(exc: TypeError, config: dict) -> str | None:
    """The config key a constructor refused ("got an unexpected keyword argument 'batch_size'"): a guessed
    config holds every argument of the script, and a dataclass built with **config takes only its own."""
    import re

    found = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
    return found.group(1) if found and found.group(1) in config else None


def _before_training(folder: Path, model_file: str, get_model, request: dict) -> dict:
    """model.py's model checked as it will be after training (shapes, the evaluation length, causality),
    with the config the team declared or the one its arguments suggest; never raises: the caller decides
    whether a failure rejects (declared) or warns (guessed)."""
    import torch

    config, declared = dict(request["config"]), bool(request.get("config_declared"))
    try:
        while not declared:  # drop the script's own arguments the model does not take (batch_size, lr ...)
            try:
                with torch.device("meta"):
                    get_model(dict(config))
                break
            except TypeError as exc:
                key = _unexpected_keyword(exc, config)
                if key is None:
                    raise
                del config[key]
            except Exception:  # noqa: BLE001  (a model that needs real values to build: the real build decides)
                break
        seq_len = int(config.get("seq_len") or config.get("block_size") or request["eval_seq_len"])
        model = OpenModel(folder=folder, file=folder / model_file, config=config, get_model=get_model,
                          seq_len=seq_len, vocab_out=int(config.get("vocab_size") or request["vocab_size"]))
        found = check_model(model, request["device"], request["seed"], request["vocab_size"],
                            request.get("eval_seq_len"), request.get("precision", "bfloat16"))
        return {"ok": True, "declared": declared, "config": config, "params": found.get("params"),
                "values_checked": found.get("values_checked"), "logits_shape": found.get("logits_shape"),
                "warnings": found.get("model_warnings", [])}
    except BaseException as exc:  # noqa: BLE001  (reported: a rejection or a warning, by the caller)
        return {"ok": False, "declared": declared, "config": config,
                "problem": problem_of(exc, request["submission_dir"], request.get("sandboxed", True))}
