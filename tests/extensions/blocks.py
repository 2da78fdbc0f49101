"""A block with a constructor argument: each sublayer's output is scaled by ``residual_scale`` before it is added
to the residual stream (chosen with ``model.block: {class_path: extensions.blocks.ResidualScaleBlock,
init_args: {residual_scale: 0.5}}``)."""
from __future__ import annotations

import torch

from scalevec_lit.model import Block


class ResidualScaleBlock(Block):
    def __init__(self, config, layer, strategy, residual_scale: float = 1.0) -> None:
        super().__init__(config, layer, strategy)
        self.residual_scale = residual_scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.residual_scale * self.attn(x, cos, sin)
        return h + self.residual_scale * self.mlp(h)


class PlainCausalAttention(torch.nn.Module):
    """Multi-head causal attention of its own (no scale site, no RoPE, no key/value cache)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = torch.nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.out = torch.nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class PlainAttentionBlock(Block):
    """A block whose attention is its own module: it cannot read the key/value cache."""

    def build_attention(self, config, layer, strategy) -> torch.nn.Module:
        return PlainCausalAttention(config)
