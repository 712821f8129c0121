"""The check of a submission before it trains, and the training job started beside it.

The check (harness/ranks/models/preflight.py, or the open division's check of a script) runs in a sandboxed
process of its own; what it says decides whether the run trains. For the fixed loop the ranks start at the same
time and wait for its word (harness/launcher/control/gate.py): the seconds of the check and of the ranks' start-up
(torch elastic, importing torch) overlap instead of adding up. Decided by harness code from the check's pipe and
the files, never from anything team code wrote.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from harness.launcher.control.gate import StartGate
from harness.launcher.run.training import RunRefused
from harness.launcher.run.assemble import flag_run, set_outcome, team_count, team_number
from harness.submission.contract import relative_paths
from harness.submission.portability import split_screen, warning_lines as portability_warnings
from harness.submission.screen import summarize as screen_warnings

BIND_WITHIN_S = 60.0  # ranks say hello a second after launch; one that has not after this is not waited for


class JobBeside:
    """A training job run in a thread while this one checks its submission; its result (or its exception) is
    taken with `result()`, after the gate's word."""

    def __init__(self, start: Callable[[StartGate], Any]) -> None:
        self.gate = StartGate()
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(start,), name="harness-training", daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[StartGate], Any]) -> None:
        try:
            self._value = start(self.gate)
        except BaseException as exc:  # noqa: BLE001  (raised again in the launcher's thread, where it is handled)
            self._error = exc

    def wait_for_ranks(self, ranks: set[int], rendezvous_s: float = 0.0) -> bool:
        """Until every rank of this node holds its connection: only then may team code run (in the check). On
        several nodes the ranks start once every node's agent has joined the rendezvous (`rendezvous_s`)."""
        return self.gate.wait_bound(ranks, rendezvous_s + BIND_WITHIN_S, self._thread.is_alive)

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def report_problem(report) -> str:
    """"" when the check's report has the shape the launcher reads (it comes from report.json, in a folder the
    team's code could write), else what is wrong."""
    if not isinstance(report, dict) or not isinstance(report.get("ok"), bool):
        return "the check's report says neither that the submission passed nor that it failed"
    problems = report.get("problems", [])
    if not isinstance(problems, list) or not all(
            isinstance(p, dict) and all(isinstance(p.get(k, ""), (str, type(None)))
                                        for k in ("file", "problem", "fix", "traceback")) for p in problems):
        return "the check's report lists its problems in another shape than the harness writes"
    if not isinstance(report.get("config", {}), dict):
        return "the check's report has a config that is not an object"
    for key in ("flops_method", "flops_note"):
        if not isinstance(report.get(key, ""), (str, type(None))):
            return f"the check's report has a {key} that is not text"
    if not report["ok"] and not problems:
        return "the check's report says the submission failed and names no problem"
    for key in ("warnings", "screen"):
        if not isinstance(report.get(key, []), list):
            return f"the check's report has {key} that are not a list"
    return ""


def accept_check(record, report: dict, track, reporter, abort, copies: list) -> bool:
    """Takes what the check said into the record; False where the run ends here (its outcome set)."""
    if isinstance(report, dict):  # the launcher's own (from the pipe and the scope): kept whatever the rest says
        record.sandbox["check"] = report.get("sandbox") if isinstance(report.get("sandbox"), dict) else {}
        record.extra.setdefault("containment", {})["check"] = report.get("containment") or {}
    shape = report_problem(report)
    if shape:  # written where the team's code ran: the team's, never a harness error a person would re-run
        set_outcome(record, "invalid", f"{shape} (report.json is written in the check's folder, where the "
                                       "submission's code runs: a submission that rewrites it is refused)")
        return False
    # what a reviewer should read, whatever the outcome; apart, as in `harness check`, the lines the team must fix
    record.extra["screen"], record.extra["portability"] = split_screen(report.get("screen", []))
    if report.get("leftover"):  # what the team made in the check's folder outlives it: a person reads it
        flag_run(record, f"the check process's folder {report['leftover']} could not be removed after the check")
    record.warnings += screen_warnings(record.extra["screen"])
    for warning in [*portability_warnings(record.extra["portability"]), *report.get("warnings", [])]:
        warning = relative_paths(str(warning), copies)  # the team's files as it names them
        record.warnings.append(warning)
        reporter.info(f"warning: {warning}")
    if abort.is_set:
        set_outcome(record, "aborted", f"stopped by {abort.signal_name}")
        return False
    # What the check process itself said over the pipe, before any team code ran (a report that never came,
    # a check killed at its timeout, say, is not a sandbox it could not enter).
    box = record.sandbox["check"]
    if track.sandbox == "required" and box.get("reported") and not box.get("active"):
        # The machine's, not the team's: as a training rank without the sandbox, the run is aborted (re-run).
        set_outcome(record, "aborted", "the track requires the sandbox and the check process could not enter it on "
                                       f"this machine ({box.get('why') or 'no reason given'}); no team code ran")
        return False
    if not report["ok"]:
        record.extra["problems"] = report["problems"]
        first = report["problems"][0]
        set_outcome(record, "invalid", f"{first.get('file', '')}: {first.get('problem', '')}"
                     + (f" Fix: {first['fix']}" if first.get("fix") else ""), tb=first.get("traceback"))
        return False
    record.params, record.config = team_count(report.get("params")), report.get("config", {})
    record.flops_per_token = team_number(report.get("flops_per_token"))  # report.json: team code ran beside it
    for key in ("flops_method", "flops_note"):
        if report.get(key):
            record.extra[key] = report[key]
    return True


def check_then_say(check: Callable[[], dict], accept: Callable[[dict], bool], beside: JobBeside | None,
                   ranks: set[int], record, nnodes: int = 1, rendezvous_s: float = 0.0,
                   abort=None) -> tuple[bool, JobBeside | None]:
    """Runs the check, takes its report, and tells the job beside it go or stop: (whether the run trains, the job
    beside it that holds the training, or None where it is still to be started). Whatever happens here, the job
    beside it hears a word (a job left waiting would never end: no deadline runs while it waits).

    The check (started before the job, held before team code: harness/launcher/run/check_process.py) is released
    once every rank of the job beside it holds its connection; at its release its own process scope, which ends what
    appeared while it was open, keeps only the check's tree, and the ranks (which start nothing before the word:
    harness code only) outlive it. On one node, a job whose ranks did not all come (a rank that failed in start-up)
    is told stop and waited for, and the check runs alone, the training after it; on several, the other nodes'
    ranks are in the same rendezvous, which a second launch of this node's cannot join: the run is aborted, the
    infrastructure's."""
    if beside is None:
        return _checked(check, accept, record), None
    try:
        if not beside.wait_for_ranks(ranks, rendezvous_s):
            beside.gate.stop("the ranks did not all start; the job is ended")
            kept = _record_state(record)
            phase = None
            try:
                phase = beside.result()
            except RunRefused as exc:  # before any rank: the machine lacks what the track requires, or the files
                set_outcome(record, exc.status, str(exc))
                return False, None
            except BaseException:  # noqa: BLE001  (started again below, where what failed fails again and is recorded)
                pass
            _restore_state(record, kept)  # the job ended unused: what it added to the record is not the run's
            if abort is not None and abort.is_set:
                set_outcome(record, "aborted", f"stopped by {abort.signal_name}")
                return False, None
            if nnodes > 1 and phase is not None and phase.watch.ended_by:  # another node ended the run first
                # with its status (a refusal there is the team's `invalid`) and its traceback
                set_outcome(record, *phase.watch.ended_by, tb=phase.watch.ended_traceback)
                # ended by another's account: this node's own (a third node's) must not read as a node that ended
                # before training of itself (nodes.py), were it seen before the account it came from
                record.extra["cause"] = "kill"
                return False, None
            if nnodes > 1:  # with what ended the job, where it said
                said = phase.outcome.reason if phase is not None and phase.outcome.status == "aborted" else ""
                said = "" if said == beside.gate.why else said  # our own stop's kill says nothing new
                set_outcome(record, "aborted", "this node's ranks did not all start (a node that never joined the "
                                               f"rendezvous?){': ' + said if said else ''}; no team code ran")
                return False, None
            return _checked(check, accept, record), None
        passed = _checked(check, accept, record)
        if passed:
            beside.gate.go()
        return passed, beside
    finally:
        if beside.gate.verdict is None:  # an error here, or a check that did not pass
            beside.gate.stop(record.reason or "the check of the submission did not pass")


def _checked(check: Callable[[], dict], accept: Callable[[dict], bool], record) -> bool:
    t_begin = time.monotonic()
    report = check()
    record.timings["preflight_s"] = time.monotonic() - t_begin
    return accept(report)


def _record_state(record) -> tuple:
    return dict(record.timings), len(record.notes), len(record.warnings), dict(record.extra)


def _restore_state(record, kept: tuple) -> None:
    timings, notes, warnings, extra = kept
    record.timings = timings
    del record.notes[notes:]
    del record.warnings[warnings:]
    record.extra.clear()
    record.extra.update(extra)
