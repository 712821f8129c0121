"""Problems of a team's folder that no test stated before issue 31 (the contract, submission.toml, the open
division's [open] and checkpoint, the check of the model), each triggered in-process and stated: an invalid
run gives them as its reason ("submission.py: <problem> Fix: <fix>"), `harness check` as a rejection."""

from __future__ import annotations

import re
import socket
import sys

import pytest
import torch

from harness.submission.contract import (
    SubmissionError,
    check_forward_output,
    find_submission,
    load_submission,
    read_team,
    submission_files,
)
from harness.submission.open_division import read_open_spec


@pytest.fixture(autouse=True)
def _forget_imported_submissions():
    """Each test imports a team's files into this process, as a check process does once in its life: what they
    leave in sys.modules (the package a submission is imported as, a sibling `model`) must not answer the next
    test's imports (tests/test_contract.py, run after this file in one worker, imports its own `model`)."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith("_harness_submission") or name in ("model", "submission"):
            del sys.modules[name]

BIGRAM = """
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = {"micro_batch_size": 2, "seq_len": 8}


class Bigram(nn.Module):
    def __init__(self, vocab_size):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.table(idx)
        loss = None if targets is None else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def get_model(config):
    return Bigram(config["vocab_size"])
"""


@pytest.fixture
def folder(tmp_path):
    """A submission folder, taken off the import path after the test (its siblings are importable meanwhile)."""
    yield tmp_path
    while str(tmp_path.resolve()) in sys.path:
        sys.path.remove(str(tmp_path.resolve()))


def problem_of_source(folder, source: str) -> str:
    (folder / "submission.py").write_text(source)
    with pytest.raises(SubmissionError) as caught:
        load_submission(folder, 64)
    return caught.value.problem


# ----------------------------------------------------------------------------- the folder and submission.toml


def test_a_folder_without_a_submission_is_told_what_one_holds(tmp_path):
    with pytest.raises(SubmissionError) as caught:
        find_submission(tmp_path)
    assert caught.value.problem == ("not found: a submission is a folder with submission.py (the fixed loop) or "
                                    "train.py and model.py (the open division).")


def test_a_file_given_for_the_folder_is_told_to_be_the_folder(tmp_path):
    (tmp_path / "model.py").write_text("")
    with pytest.raises(SubmissionError) as caught:
        find_submission(tmp_path / "model.py")
    assert caught.value.problem == "is not a folder."


def test_a_folder_too_large_for_a_submission_is_not_copied(tmp_path, monkeypatch):
    from harness.submission import contract

    monkeypatch.setattr(contract, "MAX_SUBMISSION_BYTES", 2 << 20)  # 200 MiB at the event: 2 MiB here, the same rule
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "submission.py").write_text("CONFIG = {}\n")
    (tmp_path / "team" / "weights.bin").write_bytes(b"w" * (3 << 20))
    with pytest.raises(SubmissionError) as caught:
        contract.snapshot_submission(tmp_path / "team", tmp_path / "copy")
    assert caught.value.problem == "holds more than 2 MiB of files."


def test_a_team_file_too_large_to_be_one_is_not_read(tmp_path):
    (tmp_path / "submission.toml").write_text('[team]\nname = "x"\n' + "# padding\n" * 8000)
    with pytest.raises(SubmissionError) as caught:
        read_team(tmp_path)
    assert caught.value.problem == "is larger than 64 KiB."


def test_a_path_too_long_to_copy_on_every_node_is_refused_wherever_it_is_read(tmp_path):
    """Attack of 2026-12-03: a nested file whose path fit node 0's copy of the submission and not node 1's (12 bytes
    deeper) made node 1's launcher fail ("File name too long", `crashed` as a harness error) before its rendezvous.
    A path inside a submission is held to a bound of its own, the same on every node, in check and run alike."""
    from harness.submission import contract
    from harness.submission.files import MAX_REL_PATH_BYTES

    team = tmp_path / "team"
    deep = team / ("d" * 200) / ("e" * 200)
    deep.mkdir(parents=True)
    (team / "submission.py").write_text("CONFIG = {}\n")
    (deep / "f.txt").write_text("x")
    assert contract.submission_sha256(team)  # 403 bytes: within the bound
    (deep / ("g" * (MAX_REL_PATH_BYTES - 400))).write_text("x")
    for read in (lambda: contract.snapshot_submission(team, tmp_path / "copy"), lambda: submission_files(team),
                 lambda: contract.submission_sha256(team)):
        with pytest.raises(SubmissionError) as caught:
            read()
        assert caught.value.problem.startswith(f"is a path longer than {MAX_REL_PATH_BYTES} bytes: the harness "
                                               "copies a submission into folders of its own"), caught.value.problem
        assert caught.value.fix == "shorten the names of its folders and files"


def test_a_link_in_the_folder_is_named_and_never_followed(tmp_path):
    (tmp_path / "submission.py").write_text("CONFIG = {}\n")
    (tmp_path / "data.bin").symlink_to("/etc/hostname")
    with pytest.raises(SubmissionError) as caught:
        submission_files(tmp_path)
    assert caught.value.file == str(tmp_path / "data.bin")
    assert caught.value.problem == ("is a symbolic link to /etc/hostname: the harness copies and imports regular "
                                    "files only, and follows no link out of a submission folder.")


@pytest.mark.parametrize("toml, problem", [
    ('team = 1\n', "`team` must be a table."),
    ('[team]\nnmae = "x"\nrole = "y"\n', "unknown key(s) in [team]: nmae, role."),
    ('[team]\nname = " "\n', "[team] name must be a non-empty string."),
    ('[team]\nname = "x"\nmembers = "ada"\n', "[team] members must be a list of strings."),
])
def test_a_team_file_that_breaks_its_rules_names_the_rule(tmp_path, toml, problem):
    (tmp_path / "submission.toml").write_text(toml)
    with pytest.raises(SubmissionError) as caught:
        read_team(tmp_path)
    assert caught.value.problem == problem


def test_a_team_file_that_is_a_link_is_not_read(tmp_path):
    (tmp_path / "elsewhere.toml").write_text('[team]\nname = "x"\n')
    (tmp_path / "submission.toml").symlink_to(tmp_path / "elsewhere.toml")
    with pytest.raises(SubmissionError) as caught:
        read_team(tmp_path)
    assert caught.value.problem == "is a symbolic link: the harness reads regular files only."


def test_a_team_file_that_cannot_be_opened_says_why(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(tmp_path / "submission.toml"))  # a socket where the file goes: open() refuses it (ENXIO)
    try:
        with pytest.raises(SubmissionError) as caught:
            read_team(tmp_path)
    finally:
        sock.close()
    assert caught.value.problem == "cannot be read (No such device or address)."


# ----------------------------------------------------------------------------- submission.py without running the model


@pytest.mark.parametrize("source, problem", [
    ("def get_model(config):\n    return None\n", "defines no CONFIG."),
    ("CONFIG = [1, 2]\n", "CONFIG must be a dict, got list."),
    ('CONFIG = {"micro_batch_size": 0, "seq_len": 8}\n', "CONFIG['micro_batch_size'] must be a positive int, got 0."),
    ('CONFIG = {"micro_batch_size": 2, "seq_len": 8, "grad_clip": -1.0}\n',
     "CONFIG['grad_clip'] must be a positive number (a max gradient norm), got -1.0."),
    ('CONFIG = {"micro_batch_size": 2, "seq_len": 8}\nget_model = 3\n', "get_model is not callable."),
    ('CONFIG = {"micro_batch_size": 2, "seq_len": 8}\ndef get_model(c):\n    pass\nlr_schedule = 0.5\n',
     "lr_schedule is defined but not callable."),
    ('CONFIG = {"micro_batch_size": 2, "seq_len": 8}\ndef get_model(c):\n    pass\nCOMPILE = "yes"\n',
     "COMPILE must be True or False, got 'yes'."),
    ('CONFIG = {"micro_batch_size": 2, "seq_len": 8, "dims": {1, 2}}\ndef get_model(c):\n    pass\n',
     "CONFIG must hold plain values (it is saved with the checkpoint): Object of type set is not JSON serializable."),
    ('raise ValueError("no GPU here")\n', "raised ValueError while importing: no GPU here."),
])
def test_a_submission_that_breaks_the_contract_is_told_which_rule(folder, source, problem):
    assert problem_of_source(folder, source) == problem


@pytest.mark.parametrize("out, problem", [
    (([torch.zeros(2, 4, 8)], torch.zeros(())), "forward's logits are a list, not a tensor."),
    ((torch.zeros(2, 4, 8), torch.zeros((), dtype=torch.long)), "forward's loss has dtype torch.int64."),
])
def test_a_forward_output_of_the_wrong_kind_is_named(out, problem):
    with pytest.raises(SubmissionError) as caught:
        check_forward_output(out, 2, 4, 8, True, "m.py")
    assert caught.value.problem == problem


# ----------------------------------------------------------------------------- the model, as a run's check checks it


def _problems(folder, source: str, **request) -> list[str]:
    from harness.ranks.models.preflight import run_checks

    (folder / "submission.py").write_text(source)
    report = run_checks({"submission_dir": str(folder), "vocab_size": 64, "device": "cpu", "seed": 0,
                         "precision": "float32", **request})
    assert not report["ok"]
    return [p["problem"] for p in report["problems"]]


def test_get_model_that_returns_no_module_is_named(folder):
    assert _problems(folder, BIGRAM.replace("return Bigram(config[\"vocab_size\"])", "return None")) == [
        "get_model returned a NoneType, not a torch.nn.Module."]


def test_a_model_without_trainable_parameters_is_refused(folder):
    source = BIGRAM.replace("self.table = nn.Embedding(vocab_size, vocab_size)",
                            "self.table = nn.Embedding(vocab_size, vocab_size).requires_grad_(False)")
    assert _problems(folder, source) == ["the model has no trainable parameters."]


def test_a_parameter_that_gets_no_gradient_is_named(folder):
    source = BIGRAM.replace("self.table = nn.Embedding(vocab_size, vocab_size)",
                            "self.table = nn.Embedding(vocab_size, vocab_size)\n        self.spare = nn.Linear(2, 2)")
    assert _problems(folder, source) == ["2 trainable parameter(s) get no gradient: spare.weight, spare.bias."]


def test_a_model_whose_first_loss_is_not_finite_is_refused(folder):
    source = BIGRAM.replace("targets.flatten())", "targets.flatten()) * float('nan')")
    assert _problems(folder, source) == ["the loss of the freshly built model is nan."]


def test_a_model_that_looks_ahead_is_refused_by_the_checks_probe(folder):
    source = BIGRAM.replace("logits = self.table(idx)", "logits = self.table(idx.roll(-1, dims=1))")  # the next token
    (problem,) = _problems(folder, source)
    assert re.fullmatch(r"non-causal: the logits at positions <= (\d+) changed \(by [\d.e+-]+ of their scale\) when only "
                        r"the tokens after position \1 were changed; a model may only use earlier tokens\.", problem), \
        problem


def test_an_open_division_model_file_without_get_model_is_refused_before_training(folder):
    from harness.ranks.models.open_checks import run_open_checks

    (folder / "train.py").write_text("print('training')\n")
    (folder / "model.py").write_text("import torch\n")
    report = run_open_checks({"submission_dir": str(folder), "model_file": "model.py", "vocab_size": 64,
                              "device": "cpu", "seed": 0})
    assert [p["problem"] for p in report["problems"]] == ["defines no get_model(config)."]


# ----------------------------------------------------------------------------- [open] and the open checkpoint


@pytest.mark.parametrize("toml, problem", [
    ('[open]\nscript = "../train.py"\n',
     "[open] script must be a .py file inside the submission folder, got '../train.py'."),
    ('[open]\nmodel = "net.py"\n', "not found: an open-division submission needs its training script and the model "
                                   "file that scores its checkpoint."),
    ('[open.args]\nlayers = [1, 2]\n', "[open.args] layers must be a string, number or boolean, got [1, 2]."),
    ('[open]\ntokens_per_step = 0\n', "[open] tokens_per_step must be a positive int, got 0."),
    ('open = 3\n', "`open` must be a table."),
    ('[open]\nscrip = "train.py"\n', "unknown key(s) in [open]: scrip."),
    ('[open]\nargs = 3\n', "[open] args must be a table."),
])
def test_an_open_table_that_breaks_its_rules_names_the_rule(tmp_path, toml, problem):
    (tmp_path / "train.py").write_text("")
    (tmp_path / "model.py").write_text("")
    (tmp_path / "submission.toml").write_text(toml)
    with pytest.raises(SubmissionError) as caught:
        read_open_spec(tmp_path)
    assert caught.value.problem == problem


@pytest.mark.parametrize("model, error", [
    ({"table.weight": 3}, "the checkpoint's model entry 'table.weight' is a int, not a tensor. Fix: "),
    ({"_orig_mod.table.weight": torch.zeros(2), "table.weight": torch.zeros(2)},
     "two of the checkpoint's model keys are the same once the torch.compile/DDP prefixes are removed. Fix: "),
])
def test_a_checkpoint_the_harness_cannot_score_says_what_to_save(tmp_path, model, error):
    from harness.ranks.checkpoint import CheckpointError, normalize_team_checkpoint

    torch.save({"model": model, "config": {"vocab_size": 2}}, tmp_path / "team.pt")
    with pytest.raises(CheckpointError) as caught:
        normalize_team_checkpoint(tmp_path / "team.pt", tmp_path / "out.pt")
    assert str(caught.value).startswith(error) and not (tmp_path / "out.pt").exists()
