"""A plain-PyTorch Llama (the reference that ``overhead.py`` times the library's baseline against).

Written the way a careful user would write it without this library: RMSNorm with a learned weight
(``F.rms_norm``), one fused q/k/v matrix, rotate-half RoPE, ``F.scaled_dot_product_attention`` with
grouped-query heads, a fused gate/up matrix for SwiGLU, untied head, the same initialization as the
library. Not imported by the library; benchmarks only.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    T = x.shape[1]
    c, s = cos[:T, None, :], sin[:T, None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return x * c + torch.cat((-x2, x1), dim=-1) * s


class PlainBlock(nn.Module):
    def __init__(self, d: int, n_head: int, n_kv_head: int, ffn: int, eps: float) -> None:
        super().__init__()
        self.h, self.kv, self.hd, self.eps, self.ffn = n_head, n_kv_head, d // n_head, eps, ffn
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.qkv = nn.Linear(d, (n_head + 2 * n_kv_head) * self.hd, bias=False)
        self.o = nn.Linear(n_head * self.hd, d, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        h = F.rms_norm(x, (d,), self.attn_norm, self.eps)
        q, k, v = self.qkv(h).split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], -1)
        q = _rope(q.view(B, T, self.h, self.hd), cos, sin).transpose(1, 2)
        k = _rope(k.view(B, T, self.kv, self.hd), cos, sin).transpose(1, 2)
        v = v.view(B, T, self.kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.h != self.kv)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, -1))
        g, u = self.gate_up(F.rms_norm(x, (d,), self.mlp_norm, self.eps)).split([self.ffn, self.ffn], -1)
        return x + self.down(F.silu(g) * u)


class PlainLlama(nn.Module):
    def __init__(self, vocab: int, d: int, n_layer: int, n_head: int, n_kv_head: int, ffn: int, seq_len: int,
                 theta: float = 10000.0, eps: float = 1e-6, init_std: float = 0.02) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(PlainBlock(d, n_head, n_kv_head, ffn, eps) for _ in range(n_layer))
        self.norm = nn.Parameter(torch.ones(d))
        self.head = nn.Linear(d, vocab, bias=False)
        self.eps = eps
        hd = d // n_head
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        f = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
        emb = torch.cat((f, f), -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, init_std)
            for b in self.blocks:
                nn.init.normal_(b.o.weight, 0.0, init_std / math.sqrt(2 * n_layer))
                nn.init.normal_(b.down.weight, 0.0, init_std / math.sqrt(2 * n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        return self.head(F.rms_norm(x, (x.shape[-1],), self.norm, self.eps))


def plain_optimizer(model: PlainLlama, lr: float = 3e-3, weight_decay: float = 0.1) -> torch.optim.Optimizer:
    """AdamW: decay on the hidden matrices and the head, none on the embedding and the norm weights."""
    decay = [p for n, p in model.named_parameters() if p.ndim == 2 and not n.startswith("embed")]
    rest = [p for n, p in model.named_parameters() if not (p.ndim == 2 and not n.startswith("embed"))]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95))
