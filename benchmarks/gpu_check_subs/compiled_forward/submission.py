"""scripts/gpu-check's submission with compiled code in its forward (benchmarks/gpu_check.py).

A small GPT (causal attention, no position embedding) whose MLP calls `relu_square`, a function
torch.compile'd at import, as a team's fused kernel or flex attention is: not a compiled module
the harness can unwrap, so evaluation's model processes run compiled code too (eagerly there:
harness/ranks/models/model_worker.py `eager`). get_model also prints into an evaluation model process's
log what that process sees (probe.py): its GPUs, its logits buffer, Inductor's deterministic mode.

CONFIG is rewritten by benchmarks/gpu_check.py: Inductor on a GPU, dynamo's eager backend in the CPU
smoke (Inductor's C++ compile alone would take the smoke's minute).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .probe import report

CONFIG = {"n_layer": 2, "n_head": 4, "d_model": 128, "seq_len": 256, "micro_batch_size": 8, "learning_rate": 3e-3,
          "compile_backend": "inductor"}


def _relu_square(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


relu_square = torch.compile(_relu_square, backend=CONFIG["compile_backend"])


class Block(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.up, self.down = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(relu_square(self.up(self.ln2(x))))  # the compiled function, in every forward


class GPT(nn.Module):
    def __init__(self, vocab_size: int, n_layer: int, n_head: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def get_model(config: dict) -> nn.Module:
    report()  # evaluation's model processes only (it says nothing elsewhere)
    return GPT(config["vocab_size"], config["n_layer"], config["n_head"], config["d_model"])
