"""`harness doctor`'s checks from inside a training rank: the sandbox as a rank sees it, the all-reduce's bus
bandwidth inside the node and between the nodes (and gloo's between the nodes: evaluation's scorers use it on
every track), NCCL's transport, the ranks' clocks.

The ranks are harness/ranks/doctor_rank.py, started as training ranks are: torch elastic's agent in this
process (harness/launcher/control/elastic.py), a private folder (harness/launcher/control/workarea.py), the job's namespaces
(harness/launcher/control/job_namespace.py) and the training sandbox's policy, the allow-listed environment. No team
code runs in them: the result local rank 0 writes into the private folder is read as it is.

Bus bandwidth is nccl-tests' (doc/PERFORMANCE.md): algbw = bytes / time (the slowest rank's mean over the
timed iterations), busbw = algbw x 2(n-1)/n, comparable with a link's bandwidth whatever n. The track's
figure at the same size and rank count is harness/launcher/scaling/comm_model.py's (`bus_bandwidth`, latency terms
included), from the track's [interconnect].
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.launcher.scaling import comm_model
from harness.launcher.doctor.table import Check, DoctorOptions
from harness.launcher.control.team_files import read_tail
from harness.results.records import read_record_json
from harness.tracks.spec import Track

# (bytes, warm-up iterations, timed iterations, seconds the whole job may take) per device: a few MB on CPUs,
# enough on GPUs for the bandwidth term to dominate NCCL's latency (nccl-tests' plateau starts near 100 MB).
BENCH = {"cpu": (4 << 20, 3, 10, 90.0), "cuda": (256 << 20, 5, 20, 300.0)}
# busbw / the track's figure: below OK_SHARE a warning, below FAIL_SHARE a failure. A CPU track's figures
# describe a laptop or a busy VM (gloo over loopback, shared cores): only far below them is worth a warning.
OK_SHARE, FAIL_SHARE, CPU_OK_SHARE = 0.7, 0.4, 0.25
SKEW_WARN_S = 0.5
LANDLOCK_SIGNAL_ABI = 6  # Landlock scopes signals to the sandbox's own processes from this ABI on
BENCH_CHECKS = ("sandbox", "allreduce-node", "allreduce-nodes", "gloo-nodes", "data-nodes", "infiniband", "clock-skew")
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
LOG_TAIL_BYTES = 1 << 20


@dataclass
class Bench:
    """What one all-reduce job gave: local rank 0's result (None when there is none), why not, the ranks' logs."""

    result: dict | None
    why: str
    logs: str
    job_namespace: dict


def run_bench(track: Track, *, nproc: int, nnodes: int, node_rank: int = 0, rdzv_endpoint: str = "",
              canaries: list[str] = (), data_fingerprint: str = "", gloo: bool = False) -> Bench:
    """One all-reduce job on this node's `nproc` ranks (of `nnodes` nodes), inside the training sandbox; with
    `gloo`, a gloo all-reduce of CPU tensors too, in the same job (one rendezvous, not two)."""
    from harness.launcher.control.elastic import ElasticJob, LaunchSpec
    from harness.launcher.control.job_namespace import JobNamespace
    from harness.launcher.run.training import threads_per_rank
    from harness.launcher.control.workarea import WorkArea

    size, warmup, iters, _ = BENCH[track.device]
    timeout_s = bench_timeout_s(track, nnodes)
    empty = Path(tempfile.mkdtemp(prefix="harness-doctor-"))
    area = WorkArea(empty)  # a private folder as a training job's, with an empty submission
    namespace = None
    try:
        policy = area.sandbox_policy([], gpu=track.device == "cuda") if track.sandbox != "off" else None
        if policy is not None:
            namespace = JobNamespace(writable=str(area.dir))
        job = {"log_dir": str(area.logs), "work_dir": str(area.dir), "result_path": str(area.dir / "result.json"),
               "job_namespace": namespace.socket_path if namespace is not None and namespace.active else "",
               "sandbox_policy": policy.to_dict() if policy is not None else {}, "canaries": list(canaries),
               "backend": track.backend, "device": track.device, "size_bytes": size, "warmup": warmup, "iters": iters,
               "timeout_s": min(track.collective_timeout_s, timeout_s), "threads": threads_per_rank(track, nproc),
               "data_fingerprint": data_fingerprint,
               "gloo": dict(zip(("size_bytes", "warmup", "iters"), BENCH["cpu"][:3])) if gloo else None}
        job_file = area.dir / "doctor_job.json"
        job_file.write_text(json.dumps(job))
        env = {**area.rank_environment(), "HARNESS_LAUNCHER_PID": str(os.getpid()),
               **(NCCL_ENV if track.backend == "nccl" else {})}
        launch = LaunchSpec(module="harness.ranks.doctor_rank", args=[str(job_file)], nproc_per_node=nproc, nnodes=nnodes,
                            node_rank=node_rank, rdzv_endpoint=rdzv_endpoint, rdzv_id="harness-doctor",
                            rendezvous_timeout_s=track.rendezvous_timeout_s, shutdown_timeout_s=track.shutdown_timeout_s,
                            threads_per_rank=job["threads"], env=env)
        elastic = ElasticJob(launch, area.logs / "launcher.log")
        with area.hidden_environment():
            elastic.start()
            finished = elastic.wait(timeout_s)
            if not finished:
                elastic.kill()
            elastic.close(wait_s=5.0)
        why = "" if finished else f"not done within {timeout_s:.0f} s"
        if elastic.error is not None:
            why = f"{type(elastic.error).__name__}: {elastic.error}"
        result = _read_json(area.dir / "result.json")
        if result is not None and result.get("error"):
            why = why or result["error"]
        logs = "".join(read_tail(p, LOG_TAIL_BYTES) for p in sorted(area.logs.glob("rank*.log")))
        if result is None:
            from harness.launcher.run.outcome import last_error_line

            last = last_error_line(logs, "".join(elastic.early_output.values()))
            why = why or "no result: " + (", ".join(f"rank {r} exited {f.get('exitcode')}" for r, f in
                                                  elastic.failures.items()) or "the ranks said nothing")
            why += f" (the ranks' logs end: {last[:300]})" if last else ""
        return Bench(result, why, logs, namespace.report() if namespace is not None else {"active": False, "why": "off"})
    finally:
        if namespace is not None:
            namespace.close()
        area.cleanup()
        empty.rmdir()


def bench_timeout_s(track: Track, nnodes: int) -> float:
    """The longest one all-reduce job may take, start-up included (and the rendezvous, between nodes)."""
    return BENCH[track.device][3] + (track.rendezvous_timeout_s if nnodes > 1 else 0.0)


def _read_json(path: Path) -> dict | None:
    """The rank's result.json, written in its private folder: bounded, a regular file, an object."""
    try:
        return read_record_json(path)
    except (OSError, ValueError):
        return None


def comm_checks(track: Track, opts: DoctorOptions, runs: Path, data, wanted: list[str], reporter) -> list[Check]:
    """sandbox, allreduce-node, infiniband, clock-skew from this node's ranks; allreduce-nodes and data-nodes
    from every node's, when the track has several and node 0's endpoint is given."""
    from harness.launcher.run.runner import resolve_nproc

    try:
        nproc = resolve_nproc(track)
    except RuntimeError as exc:  # a GPU track on a machine without GPUs: the gpus check says it
        return [Check(name=name, status="skipped", measured=f"no ranks to start ({exc})") for name in BENCH_CHECKS]
    canaries, cleanup = _canaries(runs, data)
    try:
        reporter.info(f"doctor: an all-reduce on this node's {nproc} rank(s), inside the training sandbox...")
        node = run_bench(track, nproc=nproc, nnodes=1, canaries=canaries,
                         data_fingerprint=data.fingerprint if data else "")
        checks = [sandbox_check(track, node, canaries), bandwidth_check("allreduce-node", track, node, nproc, 1)]
        nodes = None
        between = ("allreduce-nodes", "gloo-nodes", "data-nodes")
        if track.nnodes > 1 and opts.rdzv_endpoint and any(n in wanted for n in between):
            gloo_too = track.backend != "gloo" and "gloo-nodes" in wanted  # else the track's is gloo's measurement
            reporter.info(f"doctor: an all-reduce on {track.nnodes} nodes x {nproc} rank(s), through "
                          f"{opts.rdzv_endpoint}{' (and one of gloo)' if gloo_too else ''}...")
            nodes = run_bench(track, nproc=nproc, nnodes=track.nnodes, node_rank=opts.node_rank,
                              rdzv_endpoint=opts.rdzv_endpoint, data_fingerprint=data.fingerprint if data else "",
                              gloo=gloo_too)
            checks += [bandwidth_check("allreduce-nodes", track, nodes, nproc, track.nnodes),
                       gloo_nodes_check(track, nodes), data_nodes_check(nodes)]
        elif track.nnodes > 1:
            one = (f"track {track.name} has {track.nnodes} nodes and this doctor runs on one (no --rdzv-endpoint): "
                   "`harness slurm --doctor` runs it on the allocation")
            checks += [Check(name=n, status="skipped", measured=one) for n in between]
        else:
            checks += [Check(name=n, status="skipped", measured=f"track {track.name} runs on one node")
                       for n in ("allreduce-nodes", "data-nodes")]
            checks.append(Check(name="gloo-nodes", status="skipped",
                                measured=f"track {track.name} runs on one node: evaluation's scorers meet no other node"))
        checks += [infiniband_check(track, node, nodes), skew_check(nodes or node)]
        return checks
    finally:
        cleanup()


def _canaries(runs: Path, data) -> tuple[list[str], object]:
    """Files no training rank may read: one made in the runs folder (removed afterwards), a validation shard."""
    made: list[Path] = []
    try:
        path = runs / f".doctor-canary-{os.getpid()}"
        path.write_text("a training rank must not read this\n")
        made.append(path)
    except OSError:
        pass
    found = [str(p) for p in made] + ([data.val[0].path] if data is not None and data.val else [])
    return found, lambda: [p.unlink(missing_ok=True) for p in made]


def sandbox_check(track: Track, bench: Bench, canaries: list[str]) -> Check:
    if track.sandbox == "off":
        return Check(name="sandbox", status="skipped", measured=f"track {track.name} turns the sandbox off")
    result = bench.result or {}
    box = result.get("sandbox")
    if not box:
        return Check(name="sandbox", status="fail", measured=f"the rank said nothing of its sandbox ({bench.why})",
                     fix="read the rank's error above; `harness run` on this node would fail the same way")
    if not box.get("active"):
        return Check(name="sandbox", status="fail", measured=f"no Landlock in a training rank: {box.get('why')}",
                     fix="a kernel with Landlock (5.13 or newer, `landlock` in /sys/kernel/security/lsm, or the boot "
                         "parameter lsm=...,landlock) and the py-landlock package: docs/organizer.md, Without Landlock")
    readable = result.get("canaries_readable") or []
    if readable:
        return Check(name="sandbox", status="fail", measured=f"a training rank could read {', '.join(readable)}",
                     fix="keep the runs folder and the validation shards out of the folders the sandbox allows "
                         "(the Python installation, /usr, /etc, ...): docs/organizer.md")
    ns = box.get("namespaces") or {}
    inside = "in its job's namespaces" if ns.get("active") else f"WITHOUT its job's namespaces ({ns.get('why')})"
    status = "ok" if ns.get("active") else "warn"
    fix = "see the namespaces check" if status != "ok" else ""
    abi = box.get("abi")
    if isinstance(abi, int) and abi < LANDLOCK_SIGNAL_ABI:  # ranks may signal the node's launcher
        status = "warn"
        fix = (f"Landlock ABI {abi} does not scope signals (ABI {LANDLOCK_SIGNAL_ABI}, Linux 6.12, does): a rank could "
               "stop its node's launcher, and a node whose launcher stops is the infrastructure's; use a newer kernel")
    return Check(name="sandbox", status=status,
                 measured=f"{box.get('why')} in a training rank {inside}; {len(canaries)} protected file(s) unreadable",
                 fix=fix, value=abi)


def expected_busbw(track: Track, size_bytes: float, world_size: int, nproc: int) -> float:
    """The track's declared links' bus bandwidth for this all-reduce, bytes/s (comm_model, latencies included)."""
    return comm_model.bus_bandwidth(size_bytes, world_size, comm_model.Links.from_interconnect(track.interconnect, nproc))


def bandwidth_check(name: str, track: Track, bench: Bench, nproc: int, nnodes: int) -> Check:
    result = bench.result or {}
    if "busbw_bytes_per_s" not in result:
        return Check(name=name, status="fail", measured=f"the all-reduce did not run: {bench.why or 'no result'}",
                     fix="read the ranks' error; rendezvous between nodes needs node 0's port open (under `harness slurm`, "
                         "29500 + the job id mod 1000: open 29500-30499) and the "
                         "same harness and track on every node")
    n = result["world_size"]
    if n < 2:
        return Check(name=name, status="skipped", measured="one rank: nothing to all-reduce")
    busbw = result["busbw_bytes_per_s"]
    want = expected_busbw(track, result["size_bytes"], n, nproc)
    share = busbw / want if want > 0 else 0.0
    where = "inside the node" if nnodes == 1 else f"over {nnodes} nodes"
    measured = (f"busbw {busbw / 1e9:.3g} GB/s {where} ({n} x {result.get('device_name')}, "
                f"{result['size_bytes'] / 2**20:.0f} MiB, {result['time_s'] * 1e3:.3g} ms); the track's "
                f"[interconnect] gives {want / 1e9:.3g} GB/s at this size ({share:.0%})")
    if not result.get("correct", True):
        return Check(name=name, status="fail", measured=f"{measured}; WRONG SUMS", value=busbw / 1e9, unit="GB/s",
                     fix="a transport corrupts data: take the node out (GPU, NIC or cable)")
    link = "intra_node" if nnodes == 1 else "inter_node"
    fix = (f"below the track's figure: check the links ({'NVLink: nvidia-smi topo -m' if nnodes == 1 else 'the NICs: NET/IB, ibstat'}) "
           f"and NCCL's log, or correct the track's [interconnect] {link}_gb_per_s")
    if share >= (CPU_OK_SHARE if track.device == "cpu" else OK_SHARE):
        return Check(name=name, status="ok", measured=measured, value=busbw / 1e9, unit="GB/s")
    if track.device == "cpu":  # gloo on a laptop or a busy VM: a figure, not a verdict on the event's links
        return Check(name=name, status="warn", measured=measured, value=busbw / 1e9, unit="GB/s",
                     fix="a CPU track's figures are the machine's: `harness scale` fits them, or correct [interconnect]")
    return Check(name=name, status="fail" if share < FAIL_SHARE else "warn", measured=measured, fix=fix,
                 value=busbw / 1e9, unit="GB/s")


GLOO_FIX = ("evaluation's scorers all-reduce over gloo (TCP) between the nodes on every track: the nodes must reach "
            "each other on any TCP port (gloo's connections listen on ephemeral ports), each node's hostname resolving "
            "to an address the others reach (not 127.0.1.1 in /etc/hosts), else GLOO_SOCKET_IFNAME set to that "
            "interface where the launchers run (docs/organizer.md)")


def gloo_nodes_check(track: Track, bench: Bench) -> Check:
    """Evaluation's transport between the nodes: it must work and add right; its speed is the track's business
    only on a gloo track (allreduce-nodes judges it there), the scorers' own traffic being a few sums."""
    result = bench.result or {}
    if track.backend == "gloo":
        gloo, same = result, " (the allreduce-nodes job: the track's backend is gloo, so it is not run twice)"
    else:
        gloo, same = result.get("gloo") or {}, ""
    if "busbw_bytes_per_s" not in gloo:
        why = gloo.get("error") or bench.why or "no result"
        return Check(name="gloo-nodes", status="fail", measured=f"no gloo all-reduce between the nodes: {why}{same}",
                     fix=GLOO_FIX)
    n = result.get("world_size", 0)
    measured = (f"busbw {gloo['busbw_bytes_per_s'] / 1e9:.3g} GB/s over {track.nnodes} nodes ({n} ranks, CPU tensors, "
                f"{gloo['size_bytes'] / 2**20:.0f} MiB, {gloo['time_s'] * 1e3:.3g} ms){same}")
    if not gloo.get("correct", True):
        return Check(name="gloo-nodes", status="fail", measured=f"{measured}; WRONG SUMS", fix="a transport corrupts "
                     "data: take the node out (NIC or cable)", value=gloo["busbw_bytes_per_s"] / 1e9, unit="GB/s")
    return Check(name="gloo-nodes", status="ok", measured=measured, value=gloo["busbw_bytes_per_s"] / 1e9, unit="GB/s")


def data_nodes_check(bench: Bench) -> Check:
    ranks = (bench.result or {}).get("ranks") or []
    prints = {r.get("node"): r.get("data_fingerprint") for r in ranks if isinstance(r, dict)}
    if not prints:
        return Check(name="data-nodes", status="fail", measured=f"no node's fingerprint came back ({bench.why})",
                     fix="see allreduce-nodes")
    if len(set(prints.values())) > 1:
        return Check(name="data-nodes", status="fail",
                     measured="nodes disagree: " + ", ".join(f"node {n} {fp or 'none'}" for n, fp in sorted(prints.items())),
                     fix="stage the same data on every node (or one shared copy): a run stops when they disagree")
    return Check(name="data-nodes", status="ok", measured=f"{len(prints)} nodes, one fingerprint {next(iter(prints.values()))}")


NET_USING = re.compile(r"NET/(\w+) ?: ?Using (.*)")
NET_CHOSEN = re.compile(r"Using network (\w+)")
NET_VIA = re.compile(r"via NET/(\w+)")


def nccl_transports(log: str) -> dict:
    """What NCCL's INFO log says of the network: the transports it set up (`NET/IB : Using [0]mlx5_0:1/IB ...`),
    the one it chose (`Using network IB`, NCCL 2.19 and later), and those channels between nodes went
    through (`... via NET/IB/0`)."""
    using = {m.group(1): m.group(2).strip() for m in NET_USING.finditer(log)}
    return {"using": using, "chosen": sorted(set(NET_CHOSEN.findall(log))), "via": sorted(set(NET_VIA.findall(log))),
            "said_anything": "NCCL INFO" in log}


def infiniband_check(track: Track, node: Bench, nodes: Bench | None) -> Check:
    if track.backend != "nccl":
        return Check(name="infiniband", status="skipped", measured=f"track {track.name} runs {track.backend} on "
                                                                   f"{track.device}: no NCCL, no InfiniBand")
    seen = nccl_transports(node.logs + (nodes.logs if nodes is not None else ""))
    host_ib = sorted(os.listdir("/dev/infiniband")) if os.path.isdir("/dev/infiniband") else []
    fix = ("let the training sandbox reach /dev/infiniband (GPU tracks do), `ulimit -l unlimited`, check `ibstat` and "
           "NCCL_IB_HCA; docs/organizer.md")
    if not seen["said_anything"]:
        return Check(name="infiniband", status="warn", measured=f"NCCL said nothing with NCCL_DEBUG=INFO ({node.why})",
                     fix="read the ranks' error: the all-reduce did not get as far as NCCL's start")
    sockets = "Socket" in seen["via"] or (seen["chosen"] and "IB" not in seen["chosen"])
    if sockets and track.nnodes > 1:
        return Check(name="infiniband", status="fail", measured="NCCL chose TCP sockets between nodes (NET/Socket) "
                                                                "from inside the sandbox", fix=fix)
    if "IB" in seen["using"] or "IB" in seen["chosen"]:
        how = f", between nodes via NET/{'/'.join(seen['via'])}" if seen["via"] else ""
        return Check(name="infiniband", status="ok",
                     measured=f"NET/IB from inside the sandbox: {seen['using'].get('IB', 'chosen')[:200]}{how}")
    measured = ("NCCL found no InfiniBand device from inside the sandbox" +
                (f" (the host has /dev/infiniband: {', '.join(host_ib[:6])})" if host_ib else " (nor has the host)"))
    if track.nnodes == 1:
        return Check(name="infiniband", status="skipped", measured=f"{measured}; track {track.name} runs on one node")
    return Check(name="infiniband", status="fail", measured=measured, fix=fix)


def skew_check(bench: Bench) -> Check:
    ranks = [r for r in (bench.result or {}).get("ranks") or [] if isinstance(r, dict) and "time_unix" in r]
    if not ranks:
        return Check(name="clock-skew", status="skipped", measured=f"no ranks' clocks came back ({bench.why or 'none'})")
    times = [r["time_unix"] for r in ranks]
    skew = max(times) - min(times)
    hosts = sorted({str(r.get("host")) for r in ranks})
    shown = f"{skew * 1e6:.3g} us" if skew < 1e-3 else f"{skew * 1e3:.1f} ms" if skew < 1 else f"{skew:.2f} s"
    measured = f"{shown} between {len(ranks)} ranks on {len(hosts)} host(s), read after a barrier"
    if skew > SKEW_WARN_S:
        return Check(name="clock-skew", status="warn", measured=measured, value=skew, unit="s",
                     fix="synchronise the nodes' clocks (chrony): records and logs from different nodes disagree")
    return Check(name="clock-skew", status="ok", measured=measured, value=skew, unit="s")
