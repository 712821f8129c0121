"""A small, clean, modern GPT: rotary positions, RMSNorm, no biases, tied embeddings.

Written to the Paris 2026 model contract: get_model(config) returns a module whose
forward(idx, targets=None) returns (logits, loss).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        self._build(max_seq_len, torch.device("cpu"))

    def _build(self, length: int, device: torch.device) -> None:
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
        angles = torch.outer(torch.arange(length, device=device).float(), inv_freq)
        # Not persistent: rebuilt from the config, so the checkpoint holds only learned weights.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, H, T, D]
        T, half = x.size(-2), x.size(-1) // 2
        if T > self.cos.size(0):  # evaluation may use longer windows than training
            self._build(T, x.device)
        cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
        x1, x2 = x[..., :half], x[..., half:]  # rotate-half layout: two contiguous halves
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class Attention(nn.Module):
    def __init__(self, d_model: int, n_head: int, max_seq_len: int):
        super().__init__()
        self.n_head, self.head_dim = n_head, d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.rotary = Rotary(self.head_dim, max_seq_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self.rotary(rms_norm(q)), self.rotary(rms_norm(k))  # QK-norm keeps logits tame
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.up = nn.Linear(d_model, 4 * d_model, bias=False)
        self.down = nn.Linear(4 * d_model, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.relu(self.up(x)).square())  # ReLU^2, as in the NanoGPT speedruns


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, max_seq_len: int):
        super().__init__()
        self.attn = Attention(d_model, n_head, max_seq_len)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(rms_norm(x))
        return x + self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, n_layer: int, n_head: int, d_model: int, max_seq_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head, max_seq_len) for _ in range(n_layer))
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        self.lm_head.weight = self.embed.weight  # tied: fewer parameters for a small model
        self.apply(self._init)
        for block in self.blocks:  # residual projections start small so depth does not blow up
            nn.init.normal_(block.attn.proj.weight, std=0.02 / (2 * n_layer) ** 0.5)
            nn.init.normal_(block.mlp.down.weight, std=0.02 / (2 * n_layer) ** 0.5)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(rms_norm(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


def get_model(config: dict) -> nn.Module:
    """The contract the checkpoint is scored with: the config train.py saved beside the weights."""
    return GPT(config["vocab_size"], config["n_layer"], config["n_head"], config["n_embd"], config["seq_len"])
