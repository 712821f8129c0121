"""harness/ranks/models/lazy_dynamo.py: the check process runs torch's eager paths without importing its compiler, and the
first import of the compiler, whoever asks for it, leaves torch exactly as it ships. Each case in a fresh
interpreter: the test process has loaded dynamo long ago."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # each case imports torch in a process of its own


def _run(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_eager_training_and_the_flop_counter_never_import_the_compiler_and_compute_what_they_would_with_it():
    out = _run("""
        import json, sys
        import torch, torch.utils.flop_counter
        from harness.ranks.models.lazy_dynamo import defer_dynamo, marked

        n = defer_dynamo()

        class Seen:  # a finder after ours: it must still be asked for dynamo (a finder removed mid-import skips the next)
            asked = []
            def find_spec(self, name, path, target=None):
                self.asked.append(name)
                return None
        sys.meta_path.insert(1, Seen())

        def train():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
            opts = [torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.SGD(model.parameters(), lr=1e-2)]
            grads = []
            for _ in range(3):  # what the check does with a team's optimizers: builds them, never steps them (a
                # step imports dynamo whatever this module does: torch/optim/optimizer.py's _use_grad)
                loss = torch.nn.functional.cross_entropy(model(torch.randn(4, 8)), torch.tensor([1, 2, 3, 4]))
                loss.backward()
                grads.append([p.grad.sum().item() for p in model.parameters()])
                for opt in opts:
                    opt.zero_grad()
            state = opts[0].state_dict()
            opts[0].load_state_dict(state)
            with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
                torch.nn.Linear(64, 32, device="meta")(torch.empty(4, 64, device="meta")).sum()
            return grads, counter.get_total_flops()

        deferred = train()
        loaded_while_deferred = "torch._dynamo" in sys.modules
        import torch._dynamo  # what a team's torch.compile does first
        fn = torch.optim.Optimizer.zero_grad.__wrapped__
        mark_left = "__dynamo_disable" in fn.__dict__
        stock = train()
        cached = fn.__dict__.get("__dynamo_disable")
        print(json.dumps({"n": n, "loaded_while_deferred": loaded_while_deferred, "deferred": deferred, "stock": stock,
                          "mark_left": mark_left, "marked_after": marked(), "seen": "torch._dynamo" in Seen.asked,
                          "stock_cache": cached is not fn and getattr(cached, "_torchdynamo_disable", False)}))
    """)
    assert out["n"] > 100  # the optimizers', DDP's, the reference operations' and the dispatch modes' wrappers
    assert out["loaded_while_deferred"] is False
    assert out["deferred"] == out["stock"]  # the same weights and the same FLOPs, with and without the compiler loaded
    assert out["mark_left"] is False and out["marked_after"] == 0  # the import took every mark away
    assert out["stock_cache"] is True  # and torch then caches its own disabled function, as it ships
    assert out["seen"] is True


def test_a_compile_after_the_marks_runs_as_torch_ships_and_torchs_wrapper_of_another_shape_is_left_alone():
    out = _run("""
        import json
        import torch
        from harness.ranks.models.lazy_dynamo import defer_dynamo

        class Team:  # a class wrapped as torch wraps functions: only plain functions are marked (a class's
            pass     # attributes cannot be cleared through its __dict__, and the compiler's import would fail)
        held = torch._disable_dynamo(Team)
        n = defer_dynamo()
        class_marked = "__dynamo_disable" in Team.__dict__
        again = defer_dynamo()  # once is enough: a second call marks nothing
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x):  # torch.compile'd: the disabled optimizer call is a graph break, as in stock torch
            y = model(x).sum()
            opt.zero_grad()
            return y

        compiled = torch.compile(step, backend="eager")
        x = torch.ones(2, 4)
        same = compiled(x).item() == step(x).item()
        from torch._dynamo.utils import counters
        breaks = sum(counters["graph_break"].values())
        print(json.dumps({"n": n, "again": again, "same": same, "breaks": breaks, "class_marked": class_marked}))
    """)
    assert out["n"] > 100 and out["again"] == 0 and out["same"] is True and out["class_marked"] is False
    assert out["breaks"] >= 1  # zero_grad stayed disabled for dynamo: it was not traced into

    other = _run("""
        import json, functools
        import torch
        def _disable_dynamo(fn=None, recursive=True):  # another torch: a wrapper that caches nothing
            @functools.wraps(fn)
            def inner(*a, **k):
                return fn(*a, **k)
            return inner
        torch._disable_dynamo = _disable_dynamo
        def team_function():
            return 1
        live = torch._disable_dynamo(team_function)  # a live wrapper of that shape: never marked
        from harness.ranks.models.lazy_dynamo import defer_dynamo
        print(json.dumps({"n": defer_dynamo(), "marked": "__dynamo_disable" in team_function.__dict__}))
    """)
    assert other == {"n": 0, "marked": False}

    loaded = _run("""
        import json
        import torch, torch._dynamo
        from harness.ranks.models.lazy_dynamo import defer_dynamo
        print(json.dumps({"n": defer_dynamo(), "marked": "__dynamo_disable" in torch.optim.Optimizer.zero_grad.__wrapped__.__dict__}))
    """)
    assert loaded == {"n": 0, "marked": False}  # the compiler already loaded: nothing to spare, nothing marked


PROBE = '''
import os as _os, sys as _sys
_SEEN = _os.path.join(_os.path.dirname(__file__), "..", "seen")
def _note(where):
    with open(_SEEN, "a") as f:
        f.write(f"{where} {'torch._dynamo' in _sys.modules}\\n")
_note("import")
_forward = Bigram.forward
def _probed(self, *args, **kwargs):
    _note("forward")
    return _forward(self, *args, **kwargs)
Bigram.forward = _probed
'''


@pytest.mark.parametrize("mention", [False, True], ids=["eager", "mentions-compile"])
def test_the_check_process_runs_team_code_without_the_compiler_unless_its_files_mention_compiling(tmp_path, mention):
    """The check process's own entry (harness/ranks/models/preflight.py), as the launcher starts it: team code that
    never mentions compiling finds the compiler not loaded, in its import and in every forward the check runs (the
    meta device's shapes and FLOPs included); files that mention it find it loaded before their first line, as the
    training ranks import it, so that its import is never taken from the team's time after the release."""
    from conftest import FIXTURES

    team = tmp_path / "team"
    team.mkdir()
    source = (FIXTURES / "ok_bigram" / "submission.py").read_text() + PROBE
    if mention:
        source += "\n# torch.compile(model) on the GPU track\n"
    (team / "submission.py").write_text(source)
    request = {"submission_dir": str(team), "vocab_size": 64, "device": "cpu", "seed": 0, "eval_seq_len": 32}
    (tmp_path / "request.json").write_text(json.dumps(request))
    proc = subprocess.run([sys.executable, "-m", "harness.ranks.models.preflight", str(tmp_path / "request.json"),
                           str(tmp_path / "report.json")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"], report["problems"]
    seen = (tmp_path / "seen").read_text().split("\n")[:-1]
    assert seen[0].startswith("import ") and any(line.startswith("forward ") for line in seen), seen
    assert {line.split()[1] for line in seen} == {str(mention)}, seen
