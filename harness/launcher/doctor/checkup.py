"""`harness doctor [--track T]`: is this node ready for the event? One line per check, and an exit code.

What an organiser runs on every event node the day before (on the whole allocation through
`harness slurm --doctor`): each check measures one thing a run depends on and says what to do
when it is not right. The checks, in the order of the table:

- the machine (harness/launcher/doctor/host.py): the GPUs and their model against the track, the
  driver and torch's CUDA, the CPUs this process may use, the locked-memory limit InfiniBand needs;
- the sandbox: the harness's user (never root, owning nothing it reads), the user namespaces the
  training job and evaluation's model processes need (and the distribution's setting that refuses
  them: Ubuntu 24.04's AppArmor default), and, from inside a training rank, Landlock applied with
  the runs folder and a validation shard out of reach;
- evaluation's model process (harness/launcher/doctor/model.py): one started as a scorer starts it (forked
  from the clean template, in its own namespaces and root, Landlock; CUDA and the page-locked logits
  buffer on a GPU track), on a model the doctor writes, fed one batch;
- the files: flock on the runs folder's file system, free disk for the records and for the private
  folders under the scratch root the runs will use, that root itself (mounted exec, as `harness run`
  requires; short enough for the Unix sockets a rank makes there), the track's data found, checked and
  fingerprinted;
- the links (harness/launcher/doctor/comm.py): an all-reduce inside the node, and between the nodes
  when the track has several, through the harness's own launcher and inside the training sandbox,
  its bus bandwidth against the track's declared [interconnect]; between the nodes, a gloo all-reduce
  too (evaluation's scorers use gloo whatever the track's backend); NCCL's transport from inside the
  sandbox (`NET/IB`, not a fall-back to sockets);
- the clocks: the kernel's NTP synchronisation, and the ranks' wall clocks side by side.

A check is `ok`, `warn` (the run goes on, weaker or slower: read it), `fail` (fix it before the
event) or `skipped` (it does not apply here, and the line says why: a CPU machine skips the GPU's).
The exit code is 1 when any check fails, else 0.
"""

from __future__ import annotations

import json
import socket
import time


from harness.launcher.doctor.table import CHECKS, STATUSES, Check, DoctorOptions, DoctorReport  # noqa: F401
from harness.launcher.run.console import NullReporter
from harness.tracks.spec import load_track

def run_doctor(opts: DoctorOptions, reporter=None) -> DoctorReport:
    """Every check of the module docstring that applies here, in the table's order (raises TrackError for a
    track that cannot be loaded: nothing was checked)."""
    from harness.launcher.doctor import comm, model, host

    reporter = reporter or NullReporter()
    t0 = time.monotonic()
    track = load_track(opts.track)
    report = DoctorReport(track=track.name, host=socket.gethostname(), node_rank=opts.node_rank, nnodes=track.nnodes)
    wanted = [name for name in CHECKS if name not in opts.skip]

    def add(found: list[Check]) -> None:
        report.checks.extend(c for c in found if c.name in wanted)

    add(host.machine_checks(track, wanted))
    add(host.sandbox_host_checks(track, opts, wanted))
    runs = host.runs_root_of(opts)
    add(host.file_checks(track, opts, runs, wanted))
    data = None
    if "data" in wanted or "sandbox" in wanted:  # the sandbox's canary is a validation shard
        reporter.info(f"doctor: the data of track {track.name}...")
        data_check, data = host.data_check(track, opts)
        add([data_check])
    if any(name in wanted for name in comm.BENCH_CHECKS):
        add(comm.comm_checks(track, opts, runs, data, wanted, reporter))
    if "eval-model" in wanted:  # after the ranks: nothing else of the doctor's runs beside it (workers.kill_tree)
        reporter.info("doctor: one of evaluation's model processes, as a scorer starts it...")
        add([model.model_process_check(track, runs, data)])
    add(host.clock_checks(opts, wanted))
    order = {name: i for i, name in enumerate(CHECKS)}
    done = {c.name for c in report.checks}
    report.checks.extend(Check(name=name, status="skipped", measured="left out (--skip)" if name in opts.skip else
                               "not measured: what measures it did not run here") for name in CHECKS if name not in done)
    report.checks.sort(key=lambda c: order[c.name])
    report.seconds = time.monotonic() - t0
    return report


def render(report: DoctorReport) -> list[str]:
    """The table: one line per check (name, status, what was measured, what to do), then the verdict."""
    rows = [("CHECK", "STATUS", "MEASURED", "WHAT TO DO")]
    rows += [(c.name, c.status.upper() if c.status in ("warn", "fail") else c.status, c.measured or "-",
              c.fix if c.status in ("warn", "fail") else "") for c in report.checks]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    measured_w = min(72, max(len(r[2]) for r in rows))
    lines = [f"harness doctor: track {report.track} on {report.host} (node {report.node_rank} of {report.nnodes}), "
             f"{report.seconds:.1f} s"]
    for name, status, measured, fix in rows:
        line = f"{name:<{widths[0]}}  {status:<{widths[1]}}  {measured:<{measured_w}}"
        lines.append((f"{line}  {fix}" if fix else line).rstrip())
    counts = {s: sum(c.status == s for c in report.checks) for s in STATUSES}
    verdict = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    if report.failed:
        state = (f"NOT READY ({', '.join(c.name for c in report.failed)} failed: fix them, then run `harness doctor` "
                 "again)")
    else:
        state = "ready, with warnings to read" if counts["warn"] else "ready"
    lines.append(f"{verdict}: {state}")
    return lines


def to_json(report: DoctorReport) -> str:
    return json.dumps(report.to_dict(), indent=2)
