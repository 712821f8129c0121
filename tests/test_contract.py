"""Contract checks, in-process: each names the file, the wrong piece and the fix."""

import sys

import pytest
import torch

from conftest import FIXTURES
from harness.submission.contract import (
    SubmissionError,
    check_forward_output,
    find_submission,
    load_submission,
    read_team,
    submission_sha256,
    team_slug,
)
from harness.ranks.models.preflight import run_checks


def test_missing_folder_and_missing_file_are_explained(tmp_path):
    with pytest.raises(SubmissionError, match="does not exist"):
        find_submission(tmp_path / "nope")
    with pytest.raises(SubmissionError, match=r"submission\.py: not found.*Fix: add submission\.py"):
        find_submission(tmp_path)


def test_syntax_error_names_the_line_and_shows_it_with_a_caret():
    with pytest.raises(SubmissionError, match=r"syntax_error/submission\.py:5: syntax error") as info:
        load_submission(FIXTURES / "syntax_error", 256)
    lines = str(info.value).splitlines()
    assert lines[0].endswith("syntax error: expected ':'. Fix the line shown:")
    assert lines[1] == "    def get_model(config)"
    assert lines[2] == "    " + " " * len("def get_model(config)") + "^"  # where the ':' is missing


def test_syntax_error_in_an_indented_line_of_a_sibling_module(tmp_path):
    (tmp_path / "submission.py").write_text("from model import get_model\nCONFIG = {}\n")
    (tmp_path / "model.py").write_text("def get_model(config):\n\tx = (1 +\n\treturn x\n")
    with pytest.raises(SubmissionError) as info:
        load_submission(tmp_path, 256)
    message = str(info.value)
    assert "model.py:2" in message and "\n    x = (1 +\n    " in message and message.rstrip().endswith("^")
    sys.path.remove(str(tmp_path))
    sys.modules.pop("model", None)


def test_near_misses_of_the_keys_the_harness_reads_are_warned_about():
    from harness.submission.contract import config_warnings

    warnings = config_warnings({"learnig_rate": 3e-4, "micro_batchsize": 8, "seq_len": 64, "n_layer": 4,
                                "d_model": 128, "lr": 1e-3, "weight_decay": 0.1, "wieght_decay": 0.0})
    assert len(warnings) == 2
    assert "'learnig_rate' is not one the harness reads; did you mean 'learning_rate'?" in warnings[0]
    assert "learning_rate keeps its default (1e-3)" in warnings[0]
    assert "did you mean 'micro_batch_size'?" in warnings[1]  # the resembled key is also there: no warning


@pytest.mark.slow
def test_the_check_process_reports_config_warnings(tmp_path):
    (tmp_path / "submission.py").write_text((FIXTURES / "ok_bigram" / "submission.py").read_text()
                                            .replace('"learning_rate"', '"learnig_rate"', 1))
    report = run_checks({"submission_dir": str(tmp_path), "vocab_size": 64, "device": "cpu", "seed": 0})
    assert report["ok"] and len(report["warnings"]) == 1 and "'learning_rate'" in report["warnings"][0]


def test_paths_into_copies_are_written_relative_to_the_submission(tmp_path):
    from harness.submission.contract import relative_paths

    copy = tmp_path / "runs" / "local" / "t" / "r1" / "submission"
    copy.mkdir(parents=True)
    text = f"{copy.resolve()}/submission.py:5: syntax error; see {copy}/model.py:2 and /elsewhere/x.py"
    assert relative_paths(text, [copy]) == "submission.py:5: syntax error; see model.py:2 and /elsewhere/x.py"


def test_import_error_is_a_contract_error():
    with pytest.raises(SubmissionError, match="import failed: No module named 'definitely_not_installed_package'"):
        load_submission(FIXTURES / "import_error", 256)


def test_missing_get_model_says_how_to_fix():
    with pytest.raises(SubmissionError, match=r"defines no get_model.*Fix: add `def get_model\(config\)"):
        load_submission(FIXTURES / "no_get_model", 256)


def test_config_errors(tmp_path):
    with pytest.raises(SubmissionError, match="CONFIG has no `seq_len`"):
        load_submission(FIXTURES / "bad_config", 256)
    (tmp_path / "submission.py").write_text(
        'CONFIG = {"micro_batch_size": 2, "seq_len": 8, "vocab_size": 10}\ndef get_model(c):\n    return None\n')
    with pytest.raises(SubmissionError, match="vocab_size'\\] = 10 is smaller than the track's vocabulary of 256"):
        load_submission(tmp_path, 256)


def test_vocab_is_filled_in_and_a_padded_vocab_is_kept(tmp_path):
    sub = load_submission(FIXTURES / "ok_bigram", 256)
    assert sub.config["vocab_size"] == 256 and sub.grad_accum_steps == 1
    (tmp_path / "submission.py").write_text(
        'CONFIG = {"micro_batch_size": 2, "seq_len": 8, "vocab_size": 320}\ndef get_model(c):\n    return None\n')
    assert load_submission(tmp_path, 256).config["vocab_size"] == 320


def test_relative_and_sibling_imports_both_work(tmp_path):
    for style, line in (("rel", "from .model import get_model"), ("plain", "from model import get_model")):
        folder = tmp_path / style
        folder.mkdir()
        (folder / "model.py").write_text("def get_model(config):\n    return 'built'\n")
        (folder / "submission.py").write_text(f'{line}\nCONFIG = {{"micro_batch_size": 1, "seq_len": 4}}\n')
        sys.modules.pop("model", None)
        assert load_submission(folder, 16).get_model({}) == "built"
        sys.path.remove(str(folder))


POOLS = """
import multiprocessing, sys
from pathlib import Path
from harness.submission.contract import import_submission_module
module = import_submission_module(Path(sys.argv[1]))
for method in ("spawn", "forkserver"):
    with multiprocessing.get_context(method).Pool(1) as pool:
        print(method, pool.map_async(module.twice, [1, 2]).get(timeout=60), flush=True)  # a broken pool waits forever
"""


@pytest.mark.parametrize("relative", [False, True])
def test_a_function_of_submission_py_runs_in_a_pool_started_afresh(tmp_path, relative):
    """Python's spawn and forkserver workers (forkserver: 3.14's default start method) unpickle a function by
    its module's name, `_harness_submission.submission`, importing it again: it must be importable there,
    with the siblings it imports either way, or the worker fails and the pool waits forever."""
    import subprocess

    (tmp_path / "helper.py").write_text("def double(x):\n    return 2 * x\n")
    line = "from .helper import double" if relative else "from helper import double"
    (tmp_path / "submission.py").write_text(f"{line}\ndef twice(x):\n    return double(x)\n")
    ran = subprocess.run([sys.executable, "-c", POOLS, str(tmp_path)], capture_output=True, text=True, timeout=180,
                         cwd=tmp_path.parent)
    assert ran.returncode == 0 and ran.stdout.split("\n")[:2] == ["spawn [2, 4]", "forkserver [2, 4]"], ran.stderr


@pytest.mark.parametrize("out, message", [
    (torch.zeros(2, 4, 8), r"forward returned a Tensor, not a pair \(logits, loss\)\."),
    ((torch.zeros(2, 8), torch.zeros(())),
     r"forward's logits have shape \(2, 8\), expected \(2, 4, 8\) \[batch, seq_len, vocab_size\]\."),
    ((torch.zeros(2, 4, 8, dtype=torch.long), torch.zeros(())),
     r"forward's logits have dtype torch.int64, not a float type\."),
    ((torch.zeros(2, 4, 8), torch.zeros(2, 4)), r"forward's loss is shape \(2, 4\), not a scalar tensor\."),
    ((torch.zeros(2, 4, 8), None), r"forward's loss is NoneType, not a scalar tensor\."),
])
def test_forward_output_checks(out, message):
    with pytest.raises(SubmissionError, match=message):
        check_forward_output(out, 2, 4, 8, True, "m.py")


def test_forward_without_targets_may_return_no_loss():
    check_forward_output((torch.zeros(2, 4, 8), None), 2, 4, 8, False, "m.py")


@pytest.mark.parametrize("fixture, message", [
    ("forward_not_pair", "not a pair"),
    ("wrong_logits_shape", "logits have shape"),
    ("nonscalar_loss", "not a scalar"),
    ("int_logits", "not a float type"),
])
def test_preflight_runs_the_model_and_reports_the_problem(fixture, message):
    report = run_checks({"submission_dir": str(FIXTURES / fixture), "vocab_size": 64, "device": "cpu", "seed": 0})
    assert not report["ok"]
    assert message in report["problems"][0]["problem"] and report["problems"][0]["file"].endswith("submission.py")


def test_a_forward_with_the_wrong_signature_is_named_at_its_def_line_with_the_fix():
    """Once reported at torch's module.py:1789 by absolute path, with no fix."""
    report = run_checks({"submission_dir": str(FIXTURES / "forward_wrong_signature"), "vocab_size": 64,
                         "device": "cpu", "seed": 0})
    (problem,) = report["problems"]
    assert problem["file"] == f"{FIXTURES / 'forward_wrong_signature' / 'submission.py'}:14"
    assert "Bigram.forward(idx) cannot be called as forward(idx, targets)" in problem["problem"]
    assert problem["fix"].startswith("define forward(self, idx, targets=None)")


def test_a_forward_that_runs_is_never_judged_by_its_signature(tmp_path):
    """The signature is read only to explain a call that failed: a forward behind a functools.wraps decorator
    (whose signature is the inner function's, with a parameter more) or one whose targets come from a
    pre-hook runs, and is accepted."""
    (tmp_path / "submission.py").write_text(
        "import functools\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
        "CONFIG = {'micro_batch_size': 2, 'seq_len': 8}\n"
        "def keeps_signature(fn):\n"
        "    @functools.wraps(fn)\n"
        "    def wrapper(self, idx, targets=None):\n"
        "        return fn(self, idx, targets, None)\n"
        "    return wrapper\n"
        "class Bigram(nn.Module):\n"
        "    def __init__(self, v):\n"
        "        super().__init__()\n"
        "        self.table = nn.Embedding(v, v)\n"
        "    @keeps_signature\n"
        "    def forward(self, idx, targets, mask):\n"
        "        logits = self.table(idx)\n"
        "        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())\n"
        "        return logits, loss\n"
        "def get_model(config):\n"
        "    return Bigram(config['vocab_size'])\n")
    report = run_checks({"submission_dir": str(tmp_path), "vocab_size": 64, "device": "cpu", "seed": 0})
    assert report["ok"] and report["problems"] == [], report["problems"]


def test_preflight_accepts_a_good_submission():
    report = run_checks({"submission_dir": str(FIXTURES / "ok_bigram"), "vocab_size": 64, "device": "cpu", "seed": 0})
    assert report["ok"] and report["params"] == 64 * 64 and report["problems"] == []


def test_team_file(tmp_path):
    assert read_team(FIXTURES / "ok_bigram").name == "ok_bigram"
    (tmp_path / "submission.toml").write_text('[team]\nname = "Les Rapides"\nmembers = ["a", "b"]\n')
    team = read_team(tmp_path)
    assert team.name == "Les Rapides" and team.members == ["a", "b"] and team_slug(team.name) == "Les-Rapides"
    (tmp_path / "submission.toml").write_text('[team]\nnmae = "x"\n')
    with pytest.raises(SubmissionError, match="unknown key"):
        read_team(tmp_path)


def test_hash_covers_names_and_contents_but_not_caches(tmp_path):
    (tmp_path / "submission.py").write_text("A = 1\n")
    h = submission_sha256(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"junk")
    assert submission_sha256(tmp_path) == h
    (tmp_path / "model.py").write_text("")
    assert submission_sha256(tmp_path) != h
