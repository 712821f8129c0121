"""Several nodes, one run: where each node's files go, and how node 0 learns what happened elsewhere.

Every node's launcher checks its own copy of the submission and starts its ranks (static
rendezvous: node R hosts global ranks R*nproc .. R*nproc + nproc - 1, so node 0 hosts rank 0).
Node 0 writes the record, evaluates and refreshes the leaderboard. Node R > 0 writes its
logs (rank logs carry global ranks; its launcher and preflight logs carry `-node<R>`) and
`nodes/node<R>.json`: its status, reason and the failing rank's traceback. When the job fails
and node 0 only saw the echo of it (a collective error), node 0 waits briefly for the other
nodes' accounts and takes the cause from there.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from harness.launcher.run.assemble import flag_run, team_number
from harness.launcher.run.outcome import Outcome
from harness.results.records import RunRecord, read_record_json, utc_now, write_atomic

WAIT_FOR_NODES_S = 8.0  # for an account of a failure
WAIT_FOR_NODES_OK_S = 8.0  # for the accounts of a run that went well (their flags count too)


class NodePaths:
    def __init__(self, run_dir: Path, node_rank: int):
        self.run_dir, self.node_rank = run_dir, node_rank

    @property
    def lead(self) -> bool:
        return self.node_rank == 0

    @property
    def snapshot(self) -> Path:
        return self.run_dir / "submission" if self.lead else self.run_dir / "nodes" / f"node{self.node_rank}" / "submission"

    def log(self, name: str) -> Path:
        if self.lead:
            return self.run_dir / "logs" / name
        stem, dot, suffix = name.partition(".")
        return self.run_dir / "logs" / f"{stem}-node{self.node_rank}{dot}{suffix}"

    @property
    def report_path(self) -> Path:
        return self.run_dir / "nodes" / f"node{self.node_rank}.json"

    def save_report(self, record: RunRecord) -> None:
        report = {
            "node_rank": self.node_rank, "hostname": record.hostname, "status": record.status,
            "reason": record.reason, "failing_rank": record.failing_rank, "traceback": record.traceback,
            # No training outcome and `invalid`: refused before training (its check, its submission.toml), the
            # team's own end, which node 0 takes over its own view of peers that never came (merge_node_reports).
            "cause": record.extra.get("cause") or ("own" if record.status == "invalid" else ""),
            "before_training": "cause" not in record.extra,  # no training outcome: the run ended before its job did
            "started_at": record.started_at,
            "submission_sha256": record.submission_sha256,
            "killed_pids": record.killed_pids, "timings": record.timings, "ended_at": utc_now(),
            # What this node saw that node 0 must carry into the record: flags, refusals, the sandbox.
            "flagged": record.flagged, "flag_reason": record.flag_reason, "warnings": record.warnings,
            "refused_reports": record.extra.get("refused_reports", []), "sandbox": record.sandbox,
            "beat": record.extra.get("beat") or {},  # its heartbeat's slowest write: a stall of its file system?
        }
        write_atomic(self.report_path, json.dumps(report, indent=2) + "\n")


def account_text(value) -> str | None:
    """A traceback from another node's account as the record holds one: text, or none (an account on a machine
    without the sandbox may be forged: a dict there stopped the record from being written at all)."""
    return value if isinstance(value, str) else None


def account_rank(value) -> int | None:
    return value if type(value) is int else None


def read_node_reports(run_dir: Path) -> dict[int, dict]:
    out = {}
    for path in sorted((run_dir / "nodes").glob("node*.json")):
        if not re.fullmatch(r"node\d+\.json", path.name):  # not an evaluation's handshake or account
            continue
        try:
            report = read_record_json(path)  # bounded, a regular file, an object
            out[int(report["node_rank"])] = report
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def merge_node_reports(record: RunRecord, node: NodePaths, outcome: Outcome, nnodes: int,
                       silent_after_s: float = WAIT_FOR_NODES_S, heartbeat=None) -> None:
    """Put the other nodes' accounts in the record; take the cause from them when node 0 saw only its echo.

    A node is only called lost (the infrastructure's, `aborted`) after `silent_after_s` without its account:
    long enough for a healthy node to notice the job's end (its peers' collective errors, or its heartbeat's
    silence from node 0, `lost_after_s`), tear its ranks down (`shutdown_timeout_s`) and write it. Sooner, a
    team whose ranks made their own node slow to answer (a rank that hangs, peers that ignore SIGTERM)
    would have its crash charged to the infrastructure, and run again. And only when the node's heartbeat
    (written by its launcher alone, harness/launcher/control/heartbeat.py) has stopped too: a node whose launcher
    still beats is alive, and its missing account is not the infrastructure's."""
    waiting = outcome.status != "ok" and outcome.cause != "own"
    start = time.monotonic()
    least = WAIT_FOR_NODES_S if outcome.status != "ok" else WAIT_FOR_NODES_OK_S
    # A run that went well waits as long as a failed one for a node whose launcher still beats: its account
    # (its flags, its refusals) is on its way, behind a slow teardown of its ranks.
    most = silent_after_s if waiting or heartbeat is not None else least
    reports = read_node_reports(node.run_dir)
    while len(reports) < nnodes - 1:
        now = time.monotonic()
        missing = [r for r in range(1, nnodes) if r not in reports]
        if now - start > most or (now - start > least and (heartbeat is None or heartbeat.silent(missing) == missing)):
            break
        time.sleep(0.25)
        reports = read_node_reports(node.run_dir)
    record.extra["nodes"] = {str(r): {k: rep.get(k) for k in ("status", "reason", "failing_rank", "hostname",
                                                                "submission_sha256")}
                             for r, rep in reports.items()}
    for r, rep in sorted(reports.items()):
        if rep.get("submission_sha256") and rep["submission_sha256"] != record.submission_sha256:
            record.notes.append(f"node {r} ran a submission with another sha256 ({rep['submission_sha256'][:12]})")
        if rep.get("flagged"):
            flag_run(record, f"node {r}: {rep.get('flag_reason', '')}")
        record.warnings += [f"node {r}: {w}" for w in rep.get("warnings", []) if f"node {r}: {w}" not in record.warnings]
        if rep.get("refused_reports"):
            record.extra.setdefault("refused_reports", []).extend(f"node {r}: {x}" for x in rep["refused_reports"])
        if rep.get("sandbox"):
            record.sandbox[f"node{r}"] = rep["sandbox"]
    missing = [r for r in range(1, nnodes) if r not in reports]
    if missing and outcome.status == "ok":
        record.notes.append(f"node(s) {', '.join(map(str, missing))} gave no account within "
                            f"{time.monotonic() - start:.0f} s: their flags, if any, are not in this record")
    lost = [int(r) for r in record.extra.get("lost_nodes") or []]  # by the heartbeat (harness/launcher/control/heartbeat.py)
    if outcome.cause == "own" or outcome.status == "ok" or (outcome.cause == "kill" and not lost):
        return
    # a node's own failure first; else a node whose job the machine ended under it (its PID namespace lost): not
    # the team's, whatever the other nodes' ranks then saw of it
    remote = [rep for rep in reports.values() if rep.get("cause") == "own"] or \
        [rep for rep in reports.values() if rep.get("cause") == "infra" and rep.get("status") == "aborted"]
    answered = [r for r in lost if r in reports]
    unaccounted = [r for r in (lost or missing) if r not in reports]
    silent = unaccounted if heartbeat is None else heartbeat.silent(unaccounted)
    beating = [r for r in unaccounted if r not in silent]
    if remote:
        rep = min(remote, key=lambda x: x["node_rank"])
        record.status, record.failing_rank = rep["status"], account_rank(rep.get("failing_rank"))
        record.reason = f"node {rep['node_rank']}: {rep['reason']}"
        record.traceback = account_text(rep.get("traceback"))
    elif silent:  # a node that neither answered the heartbeat nor gave an account: gone, the infrastructure's
        record.status, record.failing_rank, record.traceback = "aborted", None, None
        heard = "stopped its heartbeat and " if heartbeat is not None else ""
        record.reason = (f"node(s) {', '.join(map(str, silent))} lost: {heard}gave no account within "
                         f"{silent_after_s:.0f} s (the infrastructure's failure, not the team's: run it again); "
                         f"node 0 saw: {outcome.reason}")
    elif beating:  # its launcher still beats and says nothing: alive, so the run ended as node 0 saw it
        record.status = "crashed" if record.status == "aborted" else record.status
        record.reason = (f"node(s) {', '.join(map(str, beating))} still beat but gave no account within "
                         f"{silent_after_s:.0f} s; node 0 saw: {outcome.reason}")
    elif answered:  # silent on the heartbeat, yet its launcher wrote an account: alive all along
        r = answered[0]
        rep = reports[r]
        beat = rep.get("beat") if isinstance(rep.get("beat"), dict) else {}
        blocked = team_number(beat.get("longest_write_s")) or 0.0
        stall = team_number(beat.get("stall_s")) or float("inf")
        if blocked >= stall:  # its own writes to the shared file system stalled: the infrastructure's, run again
            record.status, record.failing_rank, record.traceback = "aborted", None, None
            record.reason = (f"node {r} was called lost: its launcher's writes to the shared file system blocked for "
                             f"{blocked:.0f} s (a stall of the file system, the infrastructure's failure, not the "
                             f"team's: run it again); its account: {rep.get('status')}: {rep.get('reason') or 'no reason'}")
        else:  # its launcher was alive and did not write in time: starved by its own node's ranks, say
            record.status = "crashed"
            record.reason = (f"node {r} stopped its heartbeat, yet its launcher gave an account (its writes never "
                             f"blocked for long: its launcher was late, not its file system): "
                             f"{rep.get('status')}: {rep.get('reason') or 'no reason'}")
