"""The causality check's three verdicts: a model that cannot reproduce its own log-probabilities is not
called non-causal (a GPU's atomics or autotuned kernels make honest models do that), it is flagged for
a person; and the determinism settings the model processes hold are in force at every forward.

Two runs (track `tiny`, one rank, 20 steps), read by every test below: `noisy_logits` (causal, with
fresh noise in every evaluation forward, and a get_model that turns the determinism settings off) and
`noisy_peek` (looks ahead behind the same noise: caught all the same, its look-ahead being far larger than its noise). Looking ahead deterministically stays `invalid`:
tests/test_evaluation_security.py (assert_caught_looking_ahead).
"""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import FIXTURES, HARNESS_SCRIPT, ROOT, quick_track, run_dirs


@pytest.fixture(scope="module")
def noisy_runs(tmp_path_factory, cache_dir):
    """{fixture name: (run folder, record)}, both runs in one runs tree (one leaderboard reads both)."""
    work = tmp_path_factory.mktemp("noisy")
    track = quick_track(work)
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache_dir), "HARNESS_RUNS_DIR": str(work / "runs")}
    runs = {}
    for name in ("noisy_logits", "noisy_peek"):
        proc = subprocess.run([str(HARNESS_SCRIPT), "run", str(FIXTURES / name), "--track", str(track),
                               "--no-leaderboard"], capture_output=True, text=True, env=env, cwd=work, timeout=600)
        (run_dir,) = [d for d in run_dirs(work / "runs") if d.parent.name == name]
        runs[name] = run_dir, json.loads((run_dir / "run.json").read_text())
        # noisy_logits `ok` (scored, flagged); noisy_peek `invalid` (its peek is nats, its noise hundredths)
        assert proc.returncode == (0 if name == "noisy_logits" else 1), proc.stdout + proc.stderr[-3000:]
    runs["root"] = work / "runs"
    return runs


def assert_inconclusive(record):
    c = record["eval"]["causality"]
    assert c["verdict"] == "inconclusive" and c["causal"] is False, c
    assert c["worst_deviation"] > c["tolerance"] and c["reproduction_deviation"] > c["tolerance"], c
    assert c["reproduced_batches"] == 1 and c["checked_batches"] >= 2
    assert record["status"] == "ok" and record["val_loss"] is not None, record["reason"]
    assert record["flagged"] and "causality inconclusive" in record["flag_reason"], record["flag_reason"]
    assert "harness eval" in record["flag_reason"] and f"harness unflag {record['run_id']}" in record["flag_reason"]
    return c


@pytest.mark.slow
def test_a_causal_model_that_does_not_reproduce_itself_is_flagged_not_invalid(noisy_runs):
    """Noise larger than the tolerance in every forward: the perturbed batches deviate, and so does the
    unchanged one the check process re-ran. Not `invalid` (before the reproduction batch it was): scored,
    and hidden from the ranking with a reason that says what was seen and what to do."""
    _, record = noisy_runs["noisy_logits"]
    c = assert_inconclusive(record)
    assert c["reproduction_deviation"] < 1.0  # noise of 0.05 nats: no look-ahead's tens of nats
    assert record["val_loss"] > record["loss_floor"]


def test_the_determinism_settings_hold_at_every_forward_whatever_get_model_set(noisy_runs):
    """get_model turns on cuDNN's benchmark and Inductor's autotuning and turns deterministic algorithms
    off; what the model's first forward finds in force, in both model processes, is what the record says
    the harness set (harness/scoring/scorer.py: DETERMINISM)."""
    run_dir, record = noisy_runs["noisy_logits"]
    wanted = record["eval"]["causality"]["determinism"]
    assert wanted["cudnn_benchmark"] is False and wanted["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert wanted["inductor"]["deterministic"] is True and wanted["inductor"]["max_autotune"] is False
    for log in ("eval-model-rank0.log", "eval-check-rank0.log"):
        text = (run_dir / "logs" / log).read_text(errors="replace")
        found = re.findall(r"^NOISY-LOGITS settings (.*)$", text, re.M)
        assert len(found) == 1, (log, text[-2000:])
        seen = json.loads(found[0])
        for key in ("deterministic_algorithms", "cudnn_benchmark", "cudnn_deterministic"):
            assert seen[key] == wanted[key], (log, key, seen[key])
        assert {k: seen["env"].get(k) for k in wanted["env"]} == wanted["env"], log
        assert {k: seen["inductor"].get(k) for k in wanted["inductor"]} == wanted["inductor"], log


def test_looking_ahead_behind_noise_is_caught_and_never_ranked(noisy_runs):
    """A model that looks ahead and adds noise so that it cannot be reproduced gains nothing: its look-ahead
    moves the log-probabilities by tens of nats, its noise by hundredths, and a deviation more than ten
    times the model's own noise is non-causal: `invalid` (a noise as large as its look-ahead would leave it
    `inconclusive`, flagged, and ruin its figure). Neither noisy run is ranked."""
    import pandas as pd

    from harness.results.leaderboard import build_table, load_rows

    _, record = noisy_runs["noisy_peek"]
    c = record["eval"]["causality"]
    assert c["verdict"] == "non-causal" and record["status"] == "invalid", (c, record["reason"])
    assert c["worst_deviation"] > 10.0 > 0.1 > c["reproduction_deviation"] > c["tolerance"]  # 30 nats, 0.05
    table = build_table(load_rows(noisy_runs["root"], "tiny"))
    entries = {row["team"]: row for row in table.to_dict("records")}
    assert set(entries) == {"noisy_logits", "noisy_peek"}, entries
    assert entries["noisy_logits"]["status"] == "flagged" and "causality inconclusive" in entries["noisy_logits"]["reason"]
    assert entries["noisy_peek"]["status"] == "invalid"
    assert all(pd.isna(entry["rank"]) for entry in entries.values()), entries  # neither is ranked


def test_the_reproduction_batch_is_one_per_rank_and_never_a_checked_one():
    """Re-running a checked batch unchanged would hand the check process that batch's own tokens after each
    cut: what a look-ahead needs to answer the perturbed copy as the scoring process did. So each scorer
    rank's reproduction batch is its own and never a checked one, drawn after the checks, which are drawn
    exactly as without it (issue 29 review: drawn first, it left no batch to check at 8 batches on 8 ranks);
    its place among the check process's batches is secret."""
    from harness.scoring import plan

    for seed in range(30):
        for n_batches, world in ((8, 1), (8, 3), (16, 2), (3, 4), (8, 8), (2, 2)):
            checks = plan.choose_checks(n_batches, 0.1, seed, rows=[16] * n_batches)
            assert len(checks) == min(2, n_batches)  # the check's power does not depend on the reproduction
            again = plan.reproduction_batches(n_batches, world, seed, checks)
            assert not checks & set(again.values())
            assert set(again) == {r for r in range(world)
                                  if set(plan.batches_for_rank(n_batches, r, world)) - checks}
            assert all(b in plan.batches_for_rank(n_batches, r, world) for r, b in again.items())
    orders = {tuple(plan.check_order(3, seed, 0)) for seed in range(30)}
    assert len(orders) > 1 and all(sorted(o) == [0, 1, 2] for o in orders)


@pytest.mark.parametrize("worst, reproduction, verdict", [
    (0.0, 0.0, "causal"), (0.0, 0.5, "causal"), (5.0, 0.0, "non-causal"), (5.0, None, "non-causal"),
    (5.0, 0.5, "inconclusive"), (float("inf"), float("inf"), "inconclusive"),
    # issue 29 review: a model whose own noise is just under the tolerance is not called a cheat for a
    # deviation just over it; a look-ahead (nats) over an honest noise (hundredths) still is
    (1.1e-3, 9e-4, "inconclusive"), (30.0, 0.05, "non-causal")])
def test_the_verdict(worst, reproduction, verdict):
    """Agreement on the perturbed batches is causal whatever else; a deviation is non-causal only from a
    model that reproduced itself (or where nothing was reproduced: the old check)."""
    from harness.launcher.run.evaluation import causality_verdict
    from harness.scoring.plan import causality_verdict as plan_verdict

    assert plan_verdict(worst, reproduction, 1e-3) == verdict
    # a record from before the verdict existed has only `causal`
    assert causality_verdict({"causal": worst <= 1e-3}) == ("causal" if worst <= 1e-3 else "non-causal")
    assert causality_verdict({"verdict": verdict, "causal": verdict == "causal"}) == verdict


@pytest.mark.slow
def test_the_determinism_settings_never_fill_a_models_buffers_with_nan():
    """Issue 29 review: torch.use_deterministic_algorithms also fills every torch.empty with NaN, and a model
    that reads a partly written buffer through a mask would score NaN in evaluation alone. Filled, every element
    of every new buffer is NaN; unfilled, they hold whatever the memory held. (One buffer's garbage read through
    a mask was flaky: it can hold a NaN's bits.)"""
    code = ("import torch, torch.utils.deterministic as d; from harness.ranks.models.model_worker import hold_determinism; "
            "from harness.scoring.scorer import DETERMINISM; hold_determinism(DETERMINISM); "
            "xs = [torch.empty(n) for n in (10, 1000, 100000, 1000000)]; "
            "print(d.fill_uninitialized_memory, all(bool(torch.isnan(x).all()) for x in xs))")
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"], out.stdout  # not filled, by the setting and in fact


def test_the_determinism_settings_cost_a_model_process_no_compiler_import():
    """torch.use_deterministic_algorithms imports Inductor's config, and with it Inductor and dynamo: 1.7 s of
    CPU in each of evaluation's model processes, one after the other (evaluation took 7 s on `tiny` for
    0.2 s of forwards). The settings hold all the same, and Inductor's are set where a model loads it."""
    import subprocess
    import sys

    code = """
import json, sys, torch
from harness.ranks.models.model_worker import hold_determinism
from harness.scoring.scorer import DETERMINISM
hold_determinism(DETERMINISM)
before = {"on": torch.are_deterministic_algorithms_enabled(),
          "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
          "inductor_loaded": "torch._inductor.config" in sys.modules}
import torch._inductor.config as config  # what a model that compiles loads: the flags follow
config.deterministic = False
config.max_autotune = True
hold_determinism(DETERMINISM)
print(json.dumps({**before, "deterministic": config.deterministic, "max_autotune": config.max_autotune}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"on": True, "warn_only": True, "inductor_loaded": False,
                                      "deterministic": True, "max_autotune": False}


def test_a_model_that_compiles_lazily_in_evaluation_compiles_nothing():
    """Evaluation runs a team's model eagerly. With dynamo no longer loaded by the determinism settings, a forward
    that calls torch.compile on its first call would have compiled for real in each model process (the scoring
    and the check process each on its own first batch): nothing compiles, whenever dynamo is first loaded."""
    code = """
import json, torch
from harness.ranks.models.model_worker import eager, hold_determinism
from harness.scoring.scorer import DETERMINISM
hold_determinism(DETERMINISM)
graphs = []
def backend(gm, example_inputs):
    graphs.append(1)
    return gm.forward
class Lazy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fn = None
    def forward(self, x):
        if self.fn is None:
            self.fn = torch.compile(lambda t: t * 2 + 1, backend=backend)
        return self.fn(x)
model = Lazy()
for _ in range(3):
    hold_determinism(DETERMINISM)
    with torch.inference_mode(), eager():
        out = model(torch.ones(4))
print(json.dumps({"graphs": len(graphs), "out": out.tolist()}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"graphs": 0, "out": [3.0, 3.0, 3.0, 3.0]}
