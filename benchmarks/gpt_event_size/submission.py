"""A GPT-2 small shape (12 layers x 768, 12 heads) at the Paris 2026 event's sizes: vocabulary 32,768
(32,000 padded to a multiple of 128), seq_len 1024. What benchmarks/check_size.py checks against
`paris2026`: the size of a real team's model (theirs: 119.6M parameters), written plainly.

Learned positions, pre-LayerNorm blocks, tied embeddings (as GPT-2), scaled-dot-product attention.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIG = {"n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 32768, "seq_len": 1024,
          "micro_batch_size": 16, "grad_accum_steps": 1, "learning_rate": 6e-4}


class Block(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        d = config["n_embd"]
        self.wte = nn.Embedding(config["vocab_size"], d)
        self.wpe = nn.Embedding(config["seq_len"], d)
        self.blocks = nn.ModuleList(Block(d, config["n_head"]) for _ in range(config["n_layer"]))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, config["vocab_size"], bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2

    def forward(self, idx, targets=None):
        T = idx.size(1)
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return logits, loss


def get_model(config):
    return GPT(config)
