"""How a job ended, decided from what the launcher saw: the ranks' reports, the agent's verdict
and the watchdog's actions. Pure logic, so every case is unit-tested.

Precedence: an abort by signal; then the rank failure that explains the others (a rank's own
error beats a peer's collective error, which is only the echo of it); then a kill by the
watchdog; then ranks that died without a word; then success, which needs every rank's report
(an exit code of 0 alone proves nothing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.launcher.control.channel import Message
from harness.ranks.process import ended_how

# What a rank's error report may say. Reports come from processes that run team code: a forged
# error saying "ok" must not turn a killed or failed job into a score.
# "aborted" (a re-run, not the team's failure) is the launcher's to decide, never a rank's.
FAILURE_STATUSES = ("crashed", "invalid", "diverged")


@dataclass
class Outcome:
    status: str  # ok | timeout | crashed | invalid | diverged | aborted
    reason: str = ""
    failing_rank: int | None = None
    traceback: str | None = None
    cause: str = ""  # own (a rank's own error), collective (a peer's echo), kill, death, launch, infra (the machine's)


def _silent_ranks(messages: list[Message], world_size: int, done_kind: str, local: list[int] | None) -> list[int]:
    """Ranks that said nothing; on several nodes only this node's ranks can be heard from."""
    spoke = {m.body.get("rank") for m in messages if m.kind in ("error", done_kind)}
    if local is not None and len(local) < world_size:
        return [r for r in range(world_size) if r not in spoke and r not in local]  # the remote ranks
    return [r for r in range(world_size) if r not in spoke]


def _died(rank: int, failure: dict, then: str = "") -> Outcome:
    hint = ": by the system, out of memory?" if failure.get("signal") == "SIGKILL" else ""
    return Outcome("crashed", f"rank {rank} died ({ended_how(failure.get('exitcode'))}{hint}) without a report{then}",
                   rank, cause="death")


def classify(
    messages: list[Message],
    *,
    world_size: int,
    done_kind: str,  # "result" for training, "eval_result" for evaluation
    agent_succeeded: bool,
    agent_failures: dict[int, dict],
    agent_error: str | None,
    kill_status: str | None,
    kill_reason: str,
    local_ranks: list[int] | None = None,
    kill_at_s: float | None = None,  # when the launcher ended the job (its monotonic clock, as received_s)
    started: bool = True,  # whether any rank got through the process group (the team's start-up began)
) -> Outcome:
    errors = [m for m in messages if m.kind == "error"]
    if kill_status and kill_at_s is not None and not started:
        # Ended before any rank got past the harness's start-up: no team code ran, and what a rank says after the kill
        # (the agent may still start one, which then finds its job's cgroup gone) is the kill's echo.
        errors = [m for m in errors if m.received_s <= kill_at_s]
    if kill_status == "aborted":
        return Outcome("aborted", kill_reason)

    own = [m for m in errors if m.body.get("cause") != "collective"]
    if own:  # the first rank that failed in its own code explains the rest
        first = min(own, key=lambda m: m.received_s)
        b = first.body
        status = b.get("status") if b.get("status") in FAILURE_STATUSES else "crashed"
        return Outcome(status, f"rank {b.get('rank')}: {b.get('reason', '')}",
                       b.get("rank"), b.get("traceback"), cause="memlock" if b.get("cause") == "memlock" else "own")

    if kill_status:
        return Outcome(kill_status, kill_reason, cause="kill")

    if errors:  # only collective failures: a peer died or hung
        first = min(errors, key=lambda m: m.received_s)
        b = first.body
        silent = _silent_ranks(messages, world_size, done_kind, local_ranks)
        # A silent rank the agent saw exit on its own died first: the peers' errors are its echo. Not one ended
        # by SIGTERM or SIGKILL: the agent tears a job down with them, and a rank that hung (or was killed by
        # the system) is then among its failures too; that one "stopped responding", as below.
        dead = [r for r in silent if r in agent_failures and agent_failures[r].get("signal") not in ("SIGTERM", "SIGKILL")]
        if dead:
            return _died(dead[0], agent_failures[dead[0]], f" (then rank {b.get('rank')} failed in a collective)")
        who = f"rank(s) {', '.join(map(str, silent))} stopped responding; " if silent else ""
        return Outcome("crashed", f"{who}rank {b.get('rank')}: {b.get('reason', '')}",
                       silent[0] if silent else b.get("rank"), b.get("traceback"), cause="collective")

    if agent_failures:
        return _died(*min(agent_failures.items()))

    if agent_error:  # the agent itself failed (a rendezvous that never completed: a node that never joined):
        return Outcome("aborted", f"launch failed: {agent_error}", cause="launch")  # the infrastructure's, re-run

    expected = local_ranks if local_ranks is not None else list(range(world_size))
    reported = {m.body.get("rank") for m in messages if m.kind == done_kind}
    missing = [r for r in expected if r not in reported]
    if missing or not agent_succeeded:
        return Outcome("crashed", f"rank(s) {', '.join(map(str, missing))} exited without reporting a result "
                                  "(did the submission call os._exit or exit early?)", missing[0] if missing else None,
                       cause="death")
    return Outcome("ok", cause="ok")


# A Python error's last line ("PermissionError: [Errno 13] ...", "torch.OutOfMemoryError: ..."), a C++
# abort ("terminate called after ...") or a fatal signal's report from faulthandler.
_ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*|terminate called.*|Fatal Python error.*"
                         r"|.*(Error|error|ERROR)\b.*)$")


def last_error_line(*texts: str) -> str:
    """The line that says why a process died, from the ends of its logs (first text first): the last
    error-looking line of the last 40 lines, else the last line that is not empty; "" when all are empty."""
    for text in texts:
        lines = [line.strip() for line in text.splitlines() if line.strip()][-40:]
        for line in reversed(lines):
            if _ERROR_LINE.match(line):
                return line
        if lines:
            return lines[-1]
    return ""

