"""FLOPs per token, counted as executed: a hand count for a small model with a depthwise convolution."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.ranks.flops import count_training_flops_per_token

C, K, V, T, B = 64, 4, 256, 32, 2


class DepthwiseLM(nn.Module):
    """An embedding, one depthwise causal convolution, and the tied output matmul."""

    def __init__(self, groups: int = C):
        super().__init__()
        self.emb = nn.Embedding(V, C)
        self.conv = nn.Conv1d(C, C, K, groups=groups, padding=K - 1, bias=False)

    def forward(self, idx, targets=None):
        x = self.emb(idx).transpose(1, 2)
        x = self.conv(x)[..., : idx.size(1)].transpose(1, 2)
        logits = x @ self.emb.weight.t()
        return logits, F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def hand_count(groups: int) -> float:
    """Multiply-adds x 2, forward + backward (input and weight gradients), per token."""
    length = T + K - 1  # the padded convolution's output
    conv = 2 * B * length * C * (C // groups) * K  # each output channel meets C / groups inputs
    head = 2 * B * T * C * V
    return 3 * (conv + head) / (B * T)  # backward: one product for each input gradient, one for the weight


def test_a_depthwise_convolution_counts_what_it_executes():
    got = count_training_flops_per_token(DepthwiseLM, V, B, T)
    assert got["flops_method"] == "meta"
    assert got["flops_per_token"] == hand_count(groups=C)


def test_a_dense_convolution_is_unchanged():
    from torch.utils.flop_counter import FlopCounterMode

    got = count_training_flops_per_token(lambda: DepthwiseLM(groups=1), V, B, T)
    assert got["flops_per_token"] == hand_count(groups=1)
    with torch.device("meta"):
        model = DepthwiseLM(groups=1)
    idx = torch.empty(B, T, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as torch_own:  # torch's formula is right when groups = 1
        model(idx, idx)[1].backward()
    assert torch_own.get_total_flops() / (B * T) == got["flops_per_token"]


class ComputesAtBuild(DepthwiseLM):
    """A model that reads real values while it is built: the meta device cannot build it."""

    def __init__(self):
        super().__init__()
        if self.emb.weight.abs().sum().item() < 0:  # .item() on a meta tensor raises
            raise AssertionError


def test_a_model_that_cannot_be_built_on_meta_is_counted_on_the_cpu_and_says_why():
    meta = count_training_flops_per_token(DepthwiseLM, V, B, T)
    assert meta["flops_method"] == "meta" and "meta device" in meta["flops_note"]
    cpu = count_training_flops_per_token(ComputesAtBuild, V, B, T)
    assert cpu["flops_method"] == f"cpu batch 1 x {B}"
    note = cpu["flops_note"]
    assert note.startswith("the model could not be counted on the meta device (") and "Error" in note
    assert f"counted on the CPU at batch 1 and scaled by the micro-batch ({B})" in note
    assert abs(cpu["flops_per_token"] - meta["flops_per_token"]) / meta["flops_per_token"] < 1e-9
