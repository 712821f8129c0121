"""Checks a submission in a throw-away process before any process group starts.

    python -m harness.ranks.models.preflight <request.json> <report.json> [<sandbox report fd> [<hold fd>]]

Imports the submission, checks CONFIG and the hooks, builds the model from CONFIG, runs one
forward and backward at a tiny batch, and checks the outputs. The submission's code never runs
in the launcher process, which writes the records.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from harness.ranks.models.contract_checks import CAUSALITY_WINDOW, capped, check_model, problem_of, screen_of  # noqa: F401


def run_checks(request: dict) -> dict:
    """Every problem found, at once where they are independent; the static screen always."""
    from harness.submission.contract import config_warnings, import_submission_module, inspect_submission

    folder = Path(request["submission_dir"])
    report: dict = {"ok": False, "problems": [], "warnings": [], "screen": request.get("screen") or screen_of(request)}
    try:
        module = import_submission_module(folder)
        if isinstance(getattr(module, "CONFIG", None), dict):
            report["warnings"] = config_warnings(module.CONFIG)
        sub, problems = inspect_submission(module, folder, request["vocab_size"])
        report["problems"] += [problem_of(p, request["submission_dir"], request.get("sandboxed", True)) for p in problems]
        if sub is not None:
            report["config"] = sub.config
            report["compile"] = sub.compile
            found = check_model(sub, request["device"], request["seed"], request["vocab_size"],
                                request.get("eval_seq_len"), request.get("precision", "bfloat16"))
            report["warnings"] += found.pop("model_warnings", [])
            report.update(found)
            report["compile"] = bool(sub.compile or report["compiled_by_get_model"])
    except BaseException as exc:  # the model's problems depend on each other: the first one is reported
        report["problems"].append(problem_of(exc, request["submission_dir"], request.get("sandboxed", True)))
    report["ok"] = not report["problems"]
    return report


def _import_torch(compiles: bool):
    """torch, and its compiler only where the submission's files mention compiling (the ranks' rule:
    harness/submission/screen.py `mentions_compile`), where it is imported now, before team code, as the ranks do.
    Elsewhere the meta device's reference operations, the FLOP counter and every optimizer's constructor would import
    it on their first call, 0.9 CPU-seconds that a check never compiling has no use for
    (harness/ranks/models/lazy_dynamo.py). The FLOP counter first: torch wraps each dispatch mode's class as it is
    made, and only the wrappers made by then are spared the import."""
    import torch
    import torch.utils.flop_counter  # noqa: F401

    if compiles:
        import torch._dynamo  # noqa: F401
    else:
        from harness.ranks.models.lazy_dynamo import defer_dynamo

        defer_dynamo()
    return torch


def held_until_released(hold_fd: int, compiles: bool) -> bool:
    """Started before the training job beside it (harness/launcher/run/check_process.py): the harness's own imports
    first, torch (and its compiler where `compiles`), while the launcher and the ranks start; then no team code until
    the launcher's word on `hold_fd`. False where the launcher closed it without a word."""
    _import_torch(compiles)

    try:
        word = os.read(hold_fd, 2)
    finally:
        os.close(hold_fd)
    return bool(word)


def main(argv: list[str]) -> None:
    from harness.ranks.process import die_with_launcher, show_native_crashes

    die_with_launcher()  # a launcher killed outright takes its check with it, held or running, as its ranks
    show_native_crashes()  # its stderr is preflight.log
    from harness.ranks.confine import cgroup

    held = cgroup.join_from_environment()  # first: all it starts is born in the check's cgroup, ended with it
    request = json.loads(Path(argv[1]).read_text())
    request["report_path"] = argv[2]  # where an interim report goes (harness/ranks/models/open_checks.py)
    from harness.ranks.confine import sandbox

    # As evaluation's model processes (harness/ranks/models/model_worker.py): it needs no network either.
    policy = sandbox.Policy.from_dict(request["policy"]) if request.get("policy") else None
    box = sandbox.enter(policy, "no sandbox was asked for")
    request["sandboxed"] = box.active  # a refused access is the sandbox's only where there is one (problem_of)
    box.cgroup = held or {}
    if held and not held["active"]:  # the launcher made it and it could not be joined: the machine's, as a sandbox
        box.active, box.why = False, held["why"]
    # Over the launcher's pipe, one line each, before any team code can change either: the sandbox report
    # at once (the team's files decide how long the screen takes, and a report that never came must not
    # read as a sandbox that could not be entered), then the static screen, which reads the team's files
    # and runs none of them.
    pipe = os.fdopen(int(argv[3]), "wb", buffering=0) if len(argv) > 3 else None
    if pipe is not None:
        pipe.write(json.dumps({"sandbox": box.to_dict()}).encode() + b"\n")
    request["screen"] = capped(screen_of(request))
    if pipe is not None:
        with pipe:
            pipe.write(json.dumps({"screen": request["screen"]}).encode() + b"\n")
    from harness.submission.screen import mentions_compile

    compiles = mentions_compile(Path(request["submission_dir"]))  # the team's files read as bytes, none run
    if len(argv) > 4 and not held_until_released(int(argv[4]), compiles):
        return  # never released: the launcher wants no check (its run ended first); no team code ran
    try:
        if not box.active and request.get("sandbox") == "required":
            raise RuntimeError(f"the track requires the sandbox and it is not available here: {box.why}")
        torch = _import_torch(compiles)
        from harness.ranks.process import deterministic_compile

        deterministic_compile()  # as evaluation's model processes compile (harness/ranks/process.py)
        torch.set_num_threads(max(1, int(request.get("threads", 1))))
        if request.get("division") == "open":
            from harness.ranks.models.open_checks import run_open_checks

            report = run_open_checks(request)
        else:
            report = run_checks(request)
    except BaseException as exc:
        report = {"ok": False, "problems": [problem_of(exc, request.get("submission_dir", ""), request.get("sandboxed", True))]}
    try:  # the log says what the report says, with the traceback where there is one
        for problem in report["problems"]:
            print(f"{problem.get('file')}: {problem.get('problem')}", problem.get("traceback", ""), sep="\n",
                  file=sys.stderr, flush=True)
    except OSError:  # a log at its cap ("File too large", what a flooding model causes): the report still goes
        pass
    report["sandbox"] = box.to_dict()  # the launcher takes the pipe's copy; this one is for a reader of the file
    Path(argv[2]).write_text(json.dumps(report, indent=1, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    # Leave as a rank does (release_and_exit: flushed, then os._exit), without the interpreter's
    # teardown: with torch, its compiler stack and the submission loaded, freeing every module's objects
    # costs more than a CPU-second on a small CPU. Team code's atexit handlers are skipped on every
    # path; that narrows what it can do after the report, nothing more: report.json is in its folder,
    # and only what went over the launcher's pipe before any team code ran is trusted.
    from harness.ranks.process import release_and_exit

    code = 1
    try:
        main(sys.argv)
        code = 0
    except BaseException:  # noqa: BLE001  (the launcher reads "died before reporting" and this log)
        traceback.print_exc()
    release_and_exit(code)
