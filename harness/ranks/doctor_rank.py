"""One rank of `harness doctor`'s all-reduce benchmark, started by torch elastic, never by hand:

    python -u -m harness.ranks.doctor_rank <doctor_job.json>

It enters the training ranks' sandbox as a training rank does (harness/ranks/training/train.py: the job's
namespaces, its private folder, then Landlock, while it has one thread), so that what it sees is what
a team's ranks will see: files it must not read (the canaries: a file in the runs folder, a
validation shard), the transports NCCL finds from inside (InfiniBand, or its silent fall-back to
sockets: NCCL_DEBUG=INFO goes to this rank's log), the bus bandwidth of an all-reduce measured the
nccl-tests way (busbw = algbw x 2(n-1)/n, algbw = bytes / time, the slowest rank's time), when asked
the same on a gloo group (evaluation's scorers use gloo between nodes on every track), and the ranks'
wall clocks read together after a barrier. No team code runs here. Local rank 0 of each node
writes the node's result (JSON) into the private folder, where the node's `harness doctor` reads it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

from harness.ranks.process import (RankEnv, die_with_launcher, enter_job, init_process_group, perf_counter,
                                   redirect_output, release_and_exit, setup_device)


def canaries_readable(paths: list[str]) -> list[str]:
    """The canaries this process can open: none, in a working sandbox."""
    readable = []
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.read(1)
            readable.append(path)
        except OSError:
            pass
    return readable


def timed_all_reduce(size_bytes: int, warmup: int, iters: int, env: RankEnv, device, group=None) -> tuple[float, bool]:
    """All-reduce `size_bytes` of float32 `iters` times after `warmup` (on `group`, default the world): the
    slowest rank's mean time, and whether a known sum came out right."""
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    x = torch.zeros(max(1, size_bytes // 4), dtype=torch.float32, device=device)  # zeros: no overflow
    for _ in range(warmup):
        dist.all_reduce(x, group=group)
    sync()
    dist.barrier(group=group)
    t0 = perf_counter()
    for _ in range(iters):
        dist.all_reduce(x, group=group)
    sync()
    mine = torch.tensor([(perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=group)  # the collective ends when its slowest rank does
    check = torch.full((8,), float(env.rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(check, group=group)  # a sum that must come out right: a corrupting transport is worse than a slow one
    n = env.world_size
    return float(mine.item()), bool(torch.all(check == n * (n + 1) / 2).item())


def gloo_bench(job: dict, env: RankEnv) -> dict:
    """The same on a gloo group of every rank, on CPU tensors: what evaluation's scorers use between nodes
    whatever the track's backend (harness/scoring/scorer.py). Its failure is said, not raised: the track's
    own measurement stands."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    spec = job["gloo"]
    try:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=job["timeout_s"]))
        time_s, correct = timed_all_reduce(spec["size_bytes"], spec["warmup"], spec["iters"], env,
                                           torch.device("cpu"), group)
    except Exception as exc:  # noqa: BLE001  (the doctor's gloo-nodes line says it)
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {exc}".strip()[:2000]}
    return {"size_bytes": spec["size_bytes"], "time_s": time_s, "correct": correct,
            "busbw_bytes_per_s": busbw(spec["size_bytes"], time_s, env.world_size)}


def busbw(size_bytes: int, time_s: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw x 2(n-1)/n."""
    return size_bytes / time_s * 2 * (n - 1) / n if time_s > 0 and n > 1 else 0.0


def bench(job: dict, env: RankEnv) -> dict:
    """The track's all-reduce (and, when asked, gloo's), then the ranks' clocks read together."""
    import torch
    import torch.distributed as dist

    device = setup_device(job["device"], env, job["threads"])
    init_process_group(job["backend"], device, job["timeout_s"])
    time_s, correct = timed_all_reduce(job["size_bytes"], job["warmup"], job["iters"], env, device)
    gloo = gloo_bench(job, env) if job.get("gloo") else None
    n = env.world_size
    dist.barrier()
    now = time.time()  # read right after the barrier: the ranks' wall clocks at (nearly) one instant
    seen: list = [None] * n
    dist.all_gather_object(seen, {"rank": env.rank, "node": env.group_rank, "host": socket.gethostname(),
                                  "time_unix": now, "data_fingerprint": job.get("data_fingerprint", "")})
    algbw = job["size_bytes"] / time_s if time_s > 0 else 0.0
    out = {"world_size": n, "size_bytes": job["size_bytes"], "iters": job["iters"], "time_s": time_s,
           "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": busbw(job["size_bytes"], time_s, n),
           "correct": correct, "ranks": seen, "device_name": "cpu"}
    if gloo is not None:
        out["gloo"] = gloo
    if device.type == "cuda":
        out["device_name"] = torch.cuda.get_device_name(device)
        try:
            out["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # a build without NCCL says so by leaving it out
            pass
    return out


def main(argv: list[str]) -> None:
    from harness.ranks.confine import cgroup, sandbox

    job = json.loads(Path(argv[1]).read_text())  # plain JSON: nothing that starts threads before the sandbox
    env = RankEnv.from_environ()
    die_with_launcher()
    held = cgroup.join_from_environment()  # first, as a training rank does (harness/ranks/training/train.py)
    job_ns = enter_job(job.get("job_namespace"), job["work_dir"])  # single-threaded, before anything else
    os.chdir(job["work_dir"])
    redirect_output(f"{job['log_dir']}/rank{env.rank}.log")
    box = sandbox.apply(sandbox.Policy.from_dict(job["sandbox_policy"])) if job.get("sandbox_policy") else \
        sandbox.SandboxReport(False, "the track turns the sandbox off")
    box.namespaces, box.cgroup = job_ns, held or {}
    result: dict = {"node": env.group_rank, "sandbox": {**box.to_dict(), "policy": {}},
                    "canaries_readable": canaries_readable(job.get("canaries", []))}
    code = 0
    try:
        result.update(bench(job, env))
    except BaseException as exc:  # the doctor reads it as the check's failure
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}".strip()[:2000]
        code = 1
    if env.local_rank == 0:
        tmp = Path(job["result_path"] + ".tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, job["result_path"])
    release_and_exit(code)


if __name__ == "__main__":
    main(sys.argv)
