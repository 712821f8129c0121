"""DDP's settings are the track's (its [ddp] table): a real gloo run under settings that are not the defaults,
and the DDP object of every rank holds them. The table's parsing and validation: tests/test_track.py."""

import pytest
import json

from conftest import TINY_TRACK, only_record

pytestmark = pytest.mark.slow  # most tests here run the harness for real: not in the fast tier (docs/testing.md)

# A bigram table trained with two micro-batches a step: the static graph's first step synchronises both.
ACCUM_BIGRAM = '''
import torch, torch.nn as nn, torch.nn.functional as F

CONFIG = {"micro_batch_size": 4, "seq_len": 32, "grad_accum_steps": 2, "learning_rate": 0.05}


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
'''

DDP_TABLE = """
[ddp]
bucket_cap_mb = 0.125
static_graph = true
gradient_as_bucket_view = false
comm_hook = "none"
"""


def test_a_tracks_ddp_settings_reach_the_ddp_object_of_every_rank_and_the_record(cli, tmp_path):
    """Non-default settings on 2 gloo ranks, 2 micro-batches a step: the run ends ok with identical replicas
    (the static graph's first step synchronised every micro-step), and the record holds the settings as
    rank 0's DDP object had them, beside the track's table."""
    sub = tmp_path / "accum"
    sub.mkdir()
    (sub / "submission.py").write_text(ACCUM_BIGRAM)
    track = tmp_path / "tiny.toml"
    track.write_text(TINY_TRACK.read_text() + DDP_TABLE)
    result = cli("run", str(sub), "--track", str(track), "--max-steps", "6")
    assert result.code == 0, result.text[-3000:]
    _, record = only_record(tmp_path / "runs")
    assert record["status"] == "ok" and record["steps"] == 6 and record["replicas_identical"] is True
    assert record["track"]["ddp"] == {"bucket_cap_mb": 0.125, "static_graph": True, "gradient_as_bucket_view": False,
                                      "comm_hook": "none"}
    assert record["ddp"] == {"bucket_cap_mb": 0.125, "first_bucket_default": False, "static_graph": True,
                             "gradient_as_bucket_view": False, "comm_hooks": []}, json.dumps(record["ddp"])
