"""The all-reduce and DDP-overlap model behind `harness scale`, against published NCCL figures.

Every figure below is an NCCL maintainer's statement of what a system achieves (all_reduce_perf bus
bandwidth at large sizes, nccl-tests' definition: busbw = algbw x 2(n-1)/n, doc/PERFORMANCE.md), with
the systems' link rates from their spec sheets. The efficiencies the model applies (0.8 of an NVLink's
line rate, 0.96 of an InfiniBand NIC's) come from the first two sources; the others check them.

| system | link rates per GPU and direction | published busbw | source |
|---|---|---|---|
| 8 x A100 SXM, one node | NVLink 3: 12 x 25 GB/s = 300 GB/s | ~230 GB/s | @sjeaugey (NCCL team), NVIDIA/nccl-tests#149 (2023-07-05): 25 GB/s per link "converts to ~20GB/s effective ... 240GB/s on A100, but some other bottlenecks on the GPUs limits it to ~230GB/s" |
| 8 x A800, one node | NVLink: 8 x 25 GB/s = 200 GB/s | ~160 GB/s | @sjeaugey, NVIDIA/nccl#412 (2023-04-24): "~160GB/s intra-node and 24GB/s inter-node" |
| A800 nodes with one HDR NIC each | 200 Gb/s = 25 GB/s per node | ~24 GB/s | same comment |
| DGX-A100 nodes, 8 x HDR per node | NVLink 3 300 GB/s; 25 GB/s NIC per GPU | 192 GB/s | @AddyLaddy (NCCL team), NVIDIA/nccl#812 (quoted in #1576): "8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW" |
| H100 nodes, NDR NICs | 400 Gb/s = 50 GB/s per NIC | 46-48 GB/s per NIC | @AddyLaddy, NVIDIA/nccl-tests#290 (2025-03-03): "For NDR @ 400Gbps you should see 46-48GB/s per NIC" |

Latencies are NCCL's own tuner constants (src/graph/tuning.cc, NCCL 2.30.7: ring/Simple, 8.4 us
base, 3.4 us per NVLink step, 14 us per network step).
"""

import math

import pytest

from harness.launcher.scaling.comm_model import (
    BUCKET_BYTES,
    Links,
    allreduce_time,
    allreduce_times,
    buckets,
    bus_bandwidth,
    exposed_comm,
    fit_intra_node,
    predict,
    step_spread_s,
)
from harness.tracks.spec import InterconnectSpec

LARGE = 8 * 2**30  # nccl-tests' -e 8G: large enough that latency is negligible


def links(per_node: int, nvlink_gb_s: float, nic_gb_s_per_gpu: float) -> Links:
    """A system by its link rates, with the track defaults' efficiencies and NCCL's latencies."""
    spec = InterconnectSpec(intra_node_gb_per_s=nvlink_gb_s, inter_node_gb_per_s=nic_gb_s_per_gpu)
    return Links.from_interconnect(spec, per_node)


@pytest.mark.parametrize("system, world, published, tolerance", [
    (links(8, 300, 25), 8, 230, 0.05),  # A100 NVLink, one node
    (links(8, 200, 25 / 8), 8, 160, 0.05),  # A800 NVLink, one node
    (links(8, 200, 25 / 8), 96, 24, 0.05),  # 12 A800 nodes, one HDR NIC per node
    (links(8, 300, 25), 16, 192, 0.05),  # 2 DGX-A100, 8 HDR NICs each
    (links(8, 300, 25), 64, 192, 0.05),  # 8 DGX-A100: the rings' bottleneck is still the NICs
    (links(1, 450, 50), 2, 47, 0.04),  # one H100 per node: one NDR NIC, 46-48 GB/s
])
def test_bus_bandwidth_matches_published_nccl_figures(system, world, published, tolerance):
    busbw = bus_bandwidth(LARGE, world, system) / 1e9
    assert busbw == pytest.approx(published, rel=tolerance)


def test_latency_terms_are_nccls_ring_model():
    """At a size near zero, a ring all-reduce costs NCCL's base latency plus one step latency per pipeline
    step, 2(n-1) of them over the network and the rest over NVLink (tuning.cc)."""
    b300 = links(8, 900, 100)
    nodes, ranks = 4, 32
    expected_us = 8.4 + (2 * (ranks - 1) - 2 * (nodes - 1)) * 3.4 + 2 * (nodes - 1) * 14.0
    assert allreduce_times(4, ranks, b300)["ring"] * 1e6 == pytest.approx(expected_us, abs=0.01)
    single = 8.4 + 2 * 7 * 3.4
    assert allreduce_times(4, 8, b300)["ring"] * 1e6 == pytest.approx(single, abs=0.01)


def test_latency_makes_trees_win_at_scale_and_rings_win_big_messages_on_few_nodes():
    b300 = links(8, 900, 100)
    assert allreduce_time(25 * 2**20, 256, b300)[1] == "tree"  # 32 nodes: the ring's 510 steps cost ~2.4 ms
    assert allreduce_time(LARGE, 16, b300)[1] == "ring"
    assert allreduce_time(4, 8, b300)[1] == "ring"  # one node: NCCL's tree has no latency advantage


def test_one_node_never_sees_the_network():
    """The drop from NVLink to the NICs appears only past one node: a one-node measurement cannot show it."""
    slow_net = links(8, 900, 1)
    fast_net = links(8, 900, 100)
    assert allreduce_time(LARGE, 8, slow_net) == allreduce_time(LARGE, 8, fast_net)
    assert allreduce_time(LARGE, 16, slow_net)[0] > 10 * allreduce_time(LARGE, 16, fast_net)[0]


def test_ddp_buckets_and_overlap_with_the_backward():
    """Buckets of 25 MiB (the first 1 MiB) start as the backward produces them; only what runs past the end
    of the backward is exposed, and the last bucket's all-reduce always is."""
    grad = 4 * 124_000_000
    sizes = buckets(grad)
    assert sizes[0] == 2**20 and all(s == BUCKET_BYTES for s in sizes[1:-1]) and sum(sizes) == grad
    b300 = links(8, 900, 100)
    long_backward = exposed_comm(grad, 1.0, 32, b300)
    last = allreduce_time(sizes[-1], 32, b300)[0]
    assert long_backward["exposed_s"] == pytest.approx(last, rel=1e-9)  # everything else hides
    no_backward = exposed_comm(grad, 0.0, 32, b300)
    assert no_backward["exposed_s"] == pytest.approx(no_backward["comm_s"], rel=1e-9)  # nothing to hide behind
    assert exposed_comm(grad, 1.0, 1, b300)["exposed_s"] == 0.0


def test_prediction_drops_past_one_node_and_says_how():
    """A model step of 2 ms (a small model on a fast GPU) exposes communication once it crosses nodes."""
    slow_net = links(8, 900, 1)
    pred = predict([1, 8, 16, 256], step_s=0.002, backward_s=0.0013, grad_bytes=4 * 100e6, links=slow_net)
    assert pred["1"]["efficiency"] == 1.0
    assert pred["8"]["efficiency"] > 0.5 > pred["16"]["efficiency"]
    assert (pred["256"]["nodes"], pred["256"]["devices_per_node"]) == (32, 8)
    assert pred["256"]["algorithm"] in ("ring", "tree", "hierarchical")


def test_the_fit_recovers_a_known_intra_node_link():
    """Overheads made by the model with a known bandwidth and latency are fitted back."""
    truth = Links(8, 2e9, 1e9, 300e-6, 100e-6, 200e-6)
    grad, backward = 4 * 500_000, 0.004
    points = [{"world_size": n, "overhead_s": exposed_comm(grad, backward, n, truth)["exposed_s"]} for n in (2, 4, 8)]
    guess = Links(8, 50e9, 1e9, 3e-6, 100e-6, 200e-6)
    fit = fit_intra_node(points, backward_s=backward, grad_bytes=grad, links=guess)
    assert fit["links"].intra_bytes_per_s == pytest.approx(2e9, rel=0.1)
    assert fit["links"].intra_latency_s == pytest.approx(300e-6, rel=0.2)
    assert fit["rms_residual_s"] < 0.05 * max(p["overhead_s"] for p in points)


def test_the_fit_says_when_the_measurement_cannot_tell():
    guess = Links(8, 50e9, 1e9, 3e-6, 100e-6, 200e-6)
    flat = [{"world_size": 2, "overhead_s": -0.0001}]
    assert fit_intra_node(flat, backward_s=0.01, grad_bytes=4e6, links=guess)["links"] is None
    assert "nothing to fit" in fit_intra_node([{"world_size": 1, "overhead_s": 0.0}], backward_s=0.01,
                                              grad_bytes=4e6, links=guess)["note"]


def test_track_defaults_are_an_hgx_b300():
    spec = InterconnectSpec()
    assert (spec.intra_node_gb_per_s, spec.inter_node_gb_per_s) == (900.0, 100.0)  # 1.8 TB/s NVLink 5, 800 Gb/s
    b300 = Links.from_interconnect(spec, 8)
    assert bus_bandwidth(LARGE, 8, b300) / 1e9 == pytest.approx(720, rel=0.01)
    assert bus_bandwidth(LARGE, 32, b300) / 1e9 == pytest.approx(720, rel=0.02)  # 8 x 96 GB/s of NICs > NVLink
    assert math.isclose(b300.inter_bytes_per_s, 96e9)


# A busy 2-core CPU, the local track's links (gloo, 2 ranks a node) and the baseline's 425,984 parameters.
BUSY_GRAD_BYTES, BUSY_STEP_S = 4 * 425_984, 0.05


def busy_points(overhead_s: float, spread_s: float | None, probe_comm_s: float | None = None) -> list[dict]:
    return [{"world_size": 1, "overhead_s": 0.0, "step_s": BUSY_STEP_S, "step_s_spread": spread_s},
            {"world_size": 2, "overhead_s": overhead_s, "step_s": BUSY_STEP_S + overhead_s, "step_s_spread": spread_s,
             "probe_comm_s": probe_comm_s}]


def local_links() -> Links:
    from harness.tracks.spec import load_track

    return Links.from_interconnect(load_track("local").interconnect, 2)


def test_a_link_fitted_from_noise_is_refused():
    """A 40 ms overhead at 2 ranks is a 35 MB/s link when nothing says how noisy the steps were; when the steps
    themselves spread by 25 ms at each size, that overhead is inside the noise and no link is fitted from it."""
    fit_kw = {"backward_s": 2 / 3 * BUSY_STEP_S, "grad_bytes": BUSY_GRAD_BYTES, "links": local_links()}
    unknown = fit_intra_node(busy_points(0.040, None), **fit_kw)
    assert unknown["links"].intra_bytes_per_s == pytest.approx(35e6, rel=0.1)  # what a noisy set used to give
    noisy = fit_intra_node(busy_points(0.040, 0.025, probe_comm_s=0.030), **fit_kw)
    assert noisy["links"] is None
    assert noisy["refused"] == ("the step-time overheads (40.00 ms at 2 (noise ±70.71 ms)) are within 2 standard "
                                "deviations of the step times: the measurement cannot tell the link (a busy machine? "
                                "measure on a quiet one)")
    assert noisy["inputs"] == [{"world_size": 2, "overhead_s": 0.040, "noise_s": pytest.approx(0.025 * 2**0.5),
                                "probe_comm_s": 0.030}]


def test_an_overhead_the_probe_does_not_find_is_not_blamed_on_the_link():
    """Above the noise, but the probe (synchronised against compute-only steps at 2 ranks) finds 4 ms of the
    40 ms as exposed all-reduce: the rest is the ranks competing for the cores, not a 35 MB/s link."""
    fit = fit_intra_node(busy_points(0.040, 0.002, probe_comm_s=0.004), backward_s=2 / 3 * BUSY_STEP_S,
                         grad_bytes=BUSY_GRAD_BYTES, links=local_links())
    assert fit["links"] is None
    assert fit["refused"].startswith("at 2 the step grew by 40.00 ms but the communication probe measured 4.00 ms")


def test_an_honest_measurement_is_still_fitted():
    """Overheads made by a known link, steps that spread by 1% of the smallest overhead, and a probe that finds
    the overhead as communication: fitted, and the link recovered."""
    truth = Links(8, 2e9, 1e9, 300e-6, 100e-6, 200e-6)
    grad, backward = 4 * 500_000, 0.004
    points = [{"world_size": 1, "overhead_s": 0.0, "step_s": 0.006, "step_s_spread": 0.0}]
    for n in (2, 4, 8):
        exposed = exposed_comm(grad, backward, n, truth)["exposed_s"]
        points.append({"world_size": n, "overhead_s": exposed, "step_s_spread": 0.0, "probe_comm_s": 0.9 * exposed})
    smallest = min(p["overhead_s"] for p in points[1:])
    for p in points:
        p["step_s_spread"] = 0.01 * smallest
    fit = fit_intra_node(points, backward_s=backward, grad_bytes=grad, links=Links(8, 50e9, 1e9, 3e-6, 100e-6, 200e-6))
    assert "refused" not in fit
    assert fit["links"].intra_bytes_per_s == pytest.approx(2e9, rel=0.1)
    assert fit["links"].intra_latency_s == pytest.approx(300e-6, rel=0.2)


def test_one_slow_step_does_not_refuse_an_honest_fit():
    """A garbage-collection pause or the allocator growing makes one step of twenty 50 ms slow. The standard
    deviation of those step times is that one step's (11 ms, several times every overhead), and at one device it
    enters every size's noise: an honest measurement was refused. The spread the refusal reads is robust (the
    median absolute deviation): the other nineteen steps say how steps stray, and the link is fitted."""
    truth = Links(8, 2e9, 1e9, 300e-6, 100e-6, 200e-6)
    grad, backward, step_s = 4 * 500_000, 0.004, 0.006
    overheads = {n: exposed_comm(grad, backward, n, truth)["exposed_s"] for n in (2, 4, 8)}
    jitter = 0.01 * min(overheads.values())

    def step_times(mean_s: float, pause_s: float = 0.0) -> list[float]:
        times = [mean_s + (jitter if i % 2 else -jitter) for i in range(20)]
        times[7] += pause_s
        return times

    points = [{"world_size": 1, "overhead_s": 0.0, "step_s": step_s,
               "step_s_spread": step_spread_s(step_times(step_s, pause_s=0.050))}]
    for n, overhead in overheads.items():
        points.append({"world_size": n, "overhead_s": overhead, "step_s": step_s + overhead,
                       "step_s_spread": step_spread_s(step_times(step_s + overhead)), "probe_comm_s": 0.9 * overhead})
    fit = fit_intra_node(points, backward_s=backward, grad_bytes=grad, links=Links(8, 50e9, 1e9, 3e-6, 100e-6, 200e-6))
    assert "refused" not in fit, fit["refused"]
    assert fit["links"].intra_bytes_per_s == pytest.approx(2e9, rel=0.1)
    assert points[0]["step_s_spread"] == pytest.approx(1.4826 * jitter, rel=1e-6)  # the pause is not in it


def test_the_refusal_does_not_ask_for_more_steps():
    """The noise is how single steps spread, which more steps measure better but do not narrow: the refusal
    asks for a quiet machine, not for more --steps."""
    fit = fit_intra_node(busy_points(0.040, 0.025, probe_comm_s=0.030), backward_s=2 / 3 * BUSY_STEP_S,
                         grad_bytes=BUSY_GRAD_BYTES, links=local_links())
    assert "quiet" in fit["refused"] and "more --steps" not in fit["refused"], fit["refused"]
