"""How long DDP's gradient all-reduce makes a step at N devices: the model behind `harness scale`.

All-reduce time (alpha-beta, as in NCCL's own tuner, src/graph/tuning.cc): a launch latency, a
latency per pipeline step, and bytes over the bottleneck's bus bandwidth. N devices on n nodes
of g devices each, S bytes, B_intra / B_inter the achievable bandwidths per device and
direction (link peak x efficiency), a_intra / a_inter the latencies per step:

  ring (one node)   launch + 2(N-1) a_intra + 2(N-1)/N S / B_intra
  ring (n nodes)    launch + (2(N-1) - 2(n-1)) a_intra + 2(n-1) a_inter + 2(N-1)/N S / min(B_intra, g B_inter)
                    (one ring per NIC: the g devices of a node each send 1/g of the data over their own NIC)
  tree (n nodes)    launch + 2((g-1) a_intra + floor(log2 n) a_inter) + 2 S / (0.92 min(B_intra, g B_inter))
  hierarchical      launch + 2(g-1) a_intra + 2(n-1) a_inter + 2(g-1)/g S / B_intra + 2(n-1)/n (S/g) / B_inter
                    (reduce-scatter inside each node over NVLink, all-reduce of the 1/g shards across nodes
                    over the NICs, all-gather inside)

The fastest of these is taken, as NCCL's tuner does. A one-node measurement never sees the
inter-node terms: beyond one node they come from the track's stated hardware.

DDP (Li et al., "PyTorch Distributed", VLDB 2020) all-reduces gradients in buckets (25 MiB, the
first 1 MiB) as soon as the backward has produced them, one bucket at a time, so communication
overlaps the backward; what is exposed is what has not finished when the backward ends. The
backward produces gradient bytes at a constant rate here (an assumption), gradients are fp32
(4 bytes a parameter), and the backward takes 2/3 of forward + backward (twice the forward's
FLOPs). Weak-scaling efficiency at N = t(1) / (t(1) + exposed(N)).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default (a track's [ddp] default; another value is not modelled)
FIRST_BUCKET_BYTES = 2**20  # torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES
GRAD_BYTES_PER_PARAM = 4  # fp32 gradients: parameters stay fp32 under bf16 autocast
BACKWARD_SHARE = 2 / 3  # of forward + backward: the backward does twice the forward's FLOPs
TREE_BW_FACTOR = 0.92  # NCCL's tuner derates tree bandwidth by 8% (tuning.cc)


@dataclass(frozen=True)
class Links:
    """Achievable bandwidth (bytes/s, per device and direction) and latencies (s) of one node and between nodes."""

    devices_per_node: int
    intra_bytes_per_s: float
    inter_bytes_per_s: float
    intra_latency_s: float
    inter_latency_s: float
    launch_latency_s: float

    @classmethod
    def from_interconnect(cls, spec, devices_per_node: int) -> "Links":
        """From a track's [interconnect] table (harness.tracks.spec.InterconnectSpec)."""
        return cls(devices_per_node=devices_per_node,
                   intra_bytes_per_s=spec.intra_node_gb_per_s * 1e9 * spec.intra_node_efficiency,
                   inter_bytes_per_s=spec.inter_node_gb_per_s * 1e9 * spec.inter_node_efficiency,
                   intra_latency_s=spec.intra_node_latency_us * 1e-6, inter_latency_s=spec.inter_node_latency_us * 1e-6,
                   launch_latency_s=spec.launch_latency_us * 1e-6)

    def describe(self) -> dict:
        d = asdict(self)
        return {"devices_per_node": d["devices_per_node"], "intra_gb_per_s": d["intra_bytes_per_s"] / 1e9,
                "inter_gb_per_s": d["inter_bytes_per_s"] / 1e9, "intra_latency_us": d["intra_latency_s"] * 1e6,
                "inter_latency_us": d["inter_latency_s"] * 1e6, "launch_latency_us": d["launch_latency_s"] * 1e6}


def layout(world_size: int, links: Links) -> tuple[int, int]:
    """(nodes, devices per node) for N devices filling nodes of the track's size."""
    per_node = max(1, min(world_size, links.devices_per_node))
    return math.ceil(world_size / per_node), per_node


def allreduce_times(size_bytes: float, world_size: int, links: Links) -> dict[str, float]:
    """Seconds for one all-reduce of `size_bytes` on `world_size` devices, by algorithm."""
    N = world_size
    if N <= 1:
        return {"none": 0.0}
    n, g = layout(N, links)
    S, Bi, Be, ai, ae = size_bytes, links.intra_bytes_per_s, links.inter_bytes_per_s, links.intra_latency_s, links.inter_latency_s
    launch = links.launch_latency_s
    if n == 1:
        return {"ring": launch + 2 * (N - 1) * ai + 2 * (N - 1) / N * S / Bi}
    bus = min(Bi, g * Be)
    return {
        "ring": launch + (2 * (N - 1) - 2 * (n - 1)) * ai + 2 * (n - 1) * ae + 2 * (N - 1) / N * S / bus,
        "tree": launch + 2 * ((g - 1) * ai + int(math.log2(n)) * ae) + 2 * S / (TREE_BW_FACTOR * bus),
        "hierarchical": (launch + 2 * (g - 1) * ai + 2 * (n - 1) * ae + 2 * (g - 1) / g * S / Bi
                         + 2 * (n - 1) / n * (S / g) / Be),
    }


def allreduce_time(size_bytes: float, world_size: int, links: Links) -> tuple[float, str]:
    """The fastest algorithm's time and name (NCCL's tuner picks the fastest the same way)."""
    times = allreduce_times(size_bytes, world_size, links)
    name = min(times, key=times.get)
    return times[name], name


def bus_bandwidth(size_bytes: float, world_size: int, links: Links) -> float:
    """nccl-tests' busbw for the modelled time: algbw x 2(N-1)/N (doc/PERFORMANCE.md), bytes/s."""
    t, _ = allreduce_time(size_bytes, world_size, links)
    return size_bytes / t * 2 * (world_size - 1) / world_size


def buckets(grad_bytes: float) -> list[float]:
    """DDP's buckets in the order the backward fills them: a small first one, then 25 MiB ones."""
    out, left = [], float(grad_bytes)
    first = min(FIRST_BUCKET_BYTES, left)
    if first > 0:
        out.append(first)
        left -= first
    while left > 0:
        out.append(min(BUCKET_BYTES, left))
        left -= out[-1]
    return out


def exposed_comm(grad_bytes: float, backward_s: float, world_size: int, links: Links) -> dict:
    """DDP's bucketed all-reduce against the backward: each bucket starts when the backward has produced it
    and the previous bucket is done; what runs past the end of the backward is exposed."""
    if world_size <= 1 or grad_bytes <= 0:
        return {"exposed_s": 0.0, "comm_s": 0.0, "buckets": 0, "algorithm": "none"}
    sizes = buckets(grad_bytes)
    done_bytes, end, total, algorithms = 0.0, 0.0, 0.0, []
    for size in sizes:
        done_bytes += size
        ready = backward_s * done_bytes / grad_bytes
        t, name = allreduce_time(size, world_size, links)
        end = max(ready, end) + t
        total += t
        algorithms.append(name)
    return {"exposed_s": max(0.0, end - backward_s), "comm_s": total, "buckets": len(sizes),
            "algorithm": max(set(algorithms), key=algorithms.count)}


def weak_scaling_efficiency(step_s: float, exposed_s: float) -> float:
    return step_s / (step_s + exposed_s)


def predict(world_sizes: list[int], *, step_s: float, backward_s: float, grad_bytes: float, links: Links) -> dict:
    """Per world size: the predicted weak-scaling efficiency, the exposed and total communication, and how."""
    out = {}
    for n in sorted(set(world_sizes)):
        comm = exposed_comm(grad_bytes, backward_s, n, links)
        nodes, per_node = layout(n, links)
        out[str(n)] = {"efficiency": weak_scaling_efficiency(step_s, comm["exposed_s"]), "nodes": nodes,
                       "devices_per_node": per_node, **comm}
    return out


# When the measurement cannot support a fit of the link (refused, the track's figures kept):
NOISE_SIGMAS = 2.0  # an overhead within 2 standard deviations of the step-to-step spread is what load alone gives
MAD_TO_STD = 1.4826  # 1 / the normal's 3/4 quantile: the median absolute deviation of normal draws, made a std
PROBE_SHARE_MIN = 0.5  # the probe must find at least half of an overhead as exposed all-reduce to blame the link


def step_spread_s(step_times: list[float]) -> float | None:
    """How far one timed step strays from another at a world size (a point's `step_s_spread`), seconds: a robust
    standard deviation, MAD_TO_STD x the median absolute deviation from the median. Not the plain standard
    deviation: one garbage-collection pause or allocator growth in twenty steps would be most of it, and the
    fit refusal would read that one step as the machine's noise. None with fewer than two step times."""
    if len(step_times) < 2:
        return None
    middle = statistics.median(step_times)
    return MAD_TO_STD * statistics.median(abs(t - middle) for t in step_times)


def step_noise_s(base: dict | None, point: dict) -> float | None:
    """The spread of the difference between a step at 1 device and a step at N: sqrt(s1^2 + sN^2), s being each
    size's step_s_spread (step_spread_s). Not the standard error of their means: t(1) and t(N) are measured one
    after the other, and on a shared machine the load that makes steps jitter also moves the mean between two
    measurements, which averaging more steps does not remove. None where not recorded."""
    s1 = None if base is None else base.get("step_s_spread")
    sn = point.get("step_s_spread")
    return None if s1 is None or sn is None else math.hypot(s1, sn)


def fit_refusal(base: dict | None, usable: list[dict]) -> str | None:
    """Why the measured overheads t(N) - t(1) cannot support a fit of the intra-node link, or None.

    - No size's overhead stands out of the noise of the step times (NOISE_SIGMAS x step_noise_s, from each size's
      robust spread: a single slow step does not make it): the fit would
      be a link made of noise (on a busy CPU, tens of MB/s), then extrapolated to hundreds of devices. Sizes
      inside the noise still enter a supported fit: their overhead is a measurement of "about 0".
    - At a size whose overhead does stand out, the communication probe (synchronised against compute-only steps
      on the same batch, at that size) finds less than PROBE_SHARE_MIN of it as exposed all-reduce: the step grew
      for another reason (ranks competing for cores, memory bandwidth), and the link is not to blame.
    """
    noise = {p["world_size"]: step_noise_s(base, p) for p in usable}
    above = [p for p in usable if noise[p["world_size"]] is None
             or p["overhead_s"] > NOISE_SIGMAS * noise[p["world_size"]]]
    if not above:
        seen = ", ".join(f"{1000 * p['overhead_s']:.2f} ms at {p['world_size']} (noise ±"
                         f"{1000 * NOISE_SIGMAS * noise[p['world_size']]:.2f} ms)" for p in usable)
        # No "more steps" here: they measure how single steps spread more precisely, but do not narrow it.
        return (f"the step-time overheads ({seen}) are within {NOISE_SIGMAS:g} standard deviations of the step "
                "times: the measurement cannot tell the link (a busy machine? measure on a quiet one)")
    for p in above:
        comm = p.get("probe_comm_s")
        if comm is not None and comm < PROBE_SHARE_MIN * p["overhead_s"]:
            return (f"at {p['world_size']} the step grew by {1000 * p['overhead_s']:.2f} ms but the communication "
                    f"probe measured {1000 * comm:.2f} ms of exposed all-reduce: most of the overhead is not the link "
                    "(ranks competing for cores?)")
    return None


def fit_intra_node(points: list[dict], *, backward_s: float, grad_bytes: float, links: Links) -> dict:
    """The intra-node bandwidth and latency per step that make the model's exposed communication match the
    measured step overheads t(N) - t(1) of one node (with one size measured, only the term that dominates
    there); a grid search in log space.

    Returns the fitted Links and how well they fit, or a note saying why the measurement cannot tell; a fit
    the measurement cannot support (fit_refusal) is not made, and `refused` says why.
    """
    usable = [p for p in points if p["world_size"] > 1 and not p.get("oversubscribed")
              and p["world_size"] <= links.devices_per_node]
    if not usable:
        return {"links": None, "note": "no world size above 1 on one node was measured: nothing to fit"}
    if max(p["overhead_s"] for p in usable) <= 0:
        return {"links": None, "note": "no step overhead was measured at any size (communication hidden or below "
                                       "the noise): the intra-node figures are the track's"}
    base = next((p for p in points if p["world_size"] == 1), None)
    inputs = [{"world_size": p["world_size"], "overhead_s": p["overhead_s"], "noise_s": step_noise_s(base, p),
               "probe_comm_s": p.get("probe_comm_s")} for p in usable]
    refused = fit_refusal(base, usable)
    if refused:
        return {"links": None, "refused": refused, "inputs": inputs,
                "note": f"refused: {refused}; the intra-node figures are the track's"}
    sizes = sorted({p["world_size"] for p in usable})
    # Two or more sizes: bandwidth and latency per step both. One size is one equation: the term that dominates
    # there (by the track's own figures) is fitted, the other kept.
    n = sizes[0]
    bucket = min(grad_bytes, BUCKET_BYTES)
    latency_part = 2 * (n - 1) * links.intra_latency_s
    bandwidth_part = 2 * (n - 1) / n * bucket / links.intra_bytes_per_s
    fit_bw = len(sizes) >= 2 or bandwidth_part >= latency_part
    fit_lat = len(sizes) >= 2 or not fit_bw

    def error(bw: float, lat: float) -> float:
        trial = Links(links.devices_per_node, bw, links.inter_bytes_per_s, lat, links.inter_latency_s,
                      links.launch_latency_s)
        return sum((exposed_comm(grad_bytes, backward_s, p["world_size"], trial)["exposed_s"] - p["overhead_s"]) ** 2
                   for p in usable)

    fixed_bw, fixed_lat = math.log10(links.intra_bytes_per_s), math.log10(max(links.intra_latency_s, 1e-9))
    lo_bw, hi_bw = (6.0, 13.0) if fit_bw else (fixed_bw, fixed_bw)  # log10 bytes/s: 1 MB/s .. 10 TB/s
    lo_lat, hi_lat = (-7.0, -1.0) if fit_lat else (fixed_lat, fixed_lat)  # log10 s: 0.1 us .. 100 ms
    best = (float("inf"), fixed_bw, fixed_lat)
    for _ in range(3):  # a coarse grid, then two finer ones around the best point
        steps = 40
        for i in range(steps + 1 if fit_bw else 1):
            bw = lo_bw + (hi_bw - lo_bw) * i / steps
            for j in range(steps + 1 if fit_lat else 1):
                lat = lo_lat + (hi_lat - lo_lat) * j / steps
                e = error(10**bw, 10**lat)
                if e < best[0]:
                    best = (e, bw, lat)
        span_bw, span_lat = (hi_bw - lo_bw) / 8, (hi_lat - lo_lat) / 8
        lo_bw, hi_bw = best[1] - span_bw, best[1] + span_bw
        lo_lat, hi_lat = best[2] - span_lat, best[2] + span_lat
    err, bw, lat = best
    fitted = Links(links.devices_per_node, 10**bw, links.inter_bytes_per_s, 10**lat, links.inter_latency_s,
                   links.launch_latency_s)
    rms = math.sqrt(err / len(usable))
    note = ("" if fit_bw and fit_lat else
            f"one size above 1 on one node: the {'bandwidth' if fit_bw else 'latency per step'} fitted (it dominates "
            f"there), the {'latency per step' if fit_bw else 'bandwidth'} the track's")
    if fit_bw and bw >= 12.9:
        return {"links": None, "note": "the measured overheads are what latency alone gives: the bandwidth cannot be "
                                       "told from them, so the intra-node figures are the track's"}
    return {"links": fitted, "rms_residual_s": rms, "fitted": [k for k, on in (("bandwidth", fit_bw),
                                                                      ("latency", fit_lat)) if on], "note": note,
            "inputs": inputs}
