"""User blocks, each chosen from YAML with ``model.block`` (``class_path`` + ``init_args``):

- ``ResidualScaleBlock``: a constructor argument (``residual_scale``), ``forward`` overridden;
- ``SandwichBlock``: sandwich norm, each sublayer's output through an ``OutputNorm`` (a scale site, so its γ is
  a scale vector of output role: tags, role decay, folding and conversion see it);
- ``PlainNormSandwichBlock``: the same written with ``nn.RMSNorm``: its gains are not scale vectors (fit
  reports them at start with the class to use instead);
- ``GeluMLPBlock``: ``build_mlp`` overridden by an MLP of its own that composes a ``NormSite``;
- ``PlainAttentionBlock``: ``build_attention`` overridden by an attention of its own (no scale site, no cache);
- ``CacheBlindBlock``: ``build_attention`` overridden by a ``CausalSelfAttention`` subclass whose ``forward``
  bypasses the key/value cache;
- ``AttentionOnlyBlock``: not a ``Block`` subclass, and without ``.mlp`` (from Python only).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from scalevec_lit.model import Block
from scalevec_lit.model.attention import CausalSelfAttention
from scalevec_lit.scale import Branch, NormSite, OutputNorm


class ResidualScaleBlock(Block):
    def __init__(self, config, layer, strategy, residual_scale: float = 1.0) -> None:
        super().__init__(config, layer, strategy)
        self.residual_scale = residual_scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.residual_scale * self.attn(x, cos, sin)
        return h + self.residual_scale * self.mlp(h)


class SandwichBlock(Block):
    """``h = x + N_a(Attn(x))``, ``y = h + N_m(MLP(h))`` with ``N = OutputNorm`` (γ of output role)."""

    def __init__(self, config, layer, strategy) -> None:
        super().__init__(config, layer, strategy)
        self.attn_post = OutputNorm(config.n_embd, strategy, layer=layer, site="attn_post")
        self.mlp_post = OutputNorm(config.n_embd, strategy, layer=layer, site="mlp_post")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attn_post(self.attn(x, cos, sin))
        return h + self.mlp_post(self.mlp(h))


class PlainNormSandwichBlock(Block):
    """The sandwich block with ``nn.RMSNorm`` gains: trained, but not scale vectors (reported at fit start)."""

    def __init__(self, config, layer, strategy) -> None:
        super().__init__(config, layer, strategy)
        self.attn_post = nn.RMSNorm(config.n_embd)
        self.mlp_post = nn.RMSNorm(config.n_embd)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attn_post(self.attn(x, cos, sin))
        return h + self.mlp_post(self.mlp(h))


class GeluMLP(nn.Module):
    """``W_down gelu(W_fc (γ ⊙ x̂))``: one branch ``fc`` read through a ``NormSite`` (the strategy's γ), and
    W_down depth-scaled as the stock MLP's."""

    def __init__(self, config, layer, strategy) -> None:
        super().__init__()
        hidden = 4 * config.n_embd
        self.out_std = config.residual_init_std
        self.input = NormSite(config.n_embd, [Branch("fc", hidden)], strategy, layer=layer, site="mlp_input",
                              init_std=config.init_std)
        self.down = nn.Linear(hidden, config.n_embd, bias=False)
        if self.down.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        nn.init.normal_(self.down.weight, 0.0, self.out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (h,) = self.input(x)
        return self.down(F.gelu(h))


class GeluMLPBlock(Block):
    def build_mlp(self, config, layer, strategy) -> nn.Module:
        return GeluMLP(config, layer, strategy)


class PlainCausalAttention(nn.Module):
    """Multi-head causal attention of its own (no scale site, no RoPE, no key/value cache)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.out = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.qkv(x).split(C, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class PlainAttentionBlock(Block):
    """A block whose attention is its own module: it cannot read the key/value cache."""

    def build_attention(self, config, layer, strategy) -> nn.Module:
        return PlainCausalAttention(config)


class AttentionOnlyBlock(nn.Module):
    """Not a ``Block`` subclass, and without ``.mlp``: ``y = x + Attn(x)`` with the stock attention. Usable from
    Python (``Transformer(config, block=AttentionOnlyBlock)``); a recipe's ``model.block`` must be a ``Block``."""

    def __init__(self, config, layer, strategy) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(config, layer, strategy)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x, cos, sin)


class CacheBlindAttention(CausalSelfAttention):
    """The stock attention with ``forward`` rewritten (the output halved) so that it bypasses the cache: decoding
    with the cache would give other logits, so it is refused (``generate()`` runs without the cache)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        saved, self.kv_cache = self.kv_cache, None
        try:
            return 0.5 * super().forward(x, cos, sin)
        finally:
            self.kv_cache = saved


class CacheBlindBlock(Block):
    def build_attention(self, config, layer, strategy) -> nn.Module:
        return CacheBlindAttention(config, layer, strategy)


class GraphBreakBlock(Block):
    """A block that ``torch.compile`` cannot capture whole (an explicit graph break, as a print or a host read
    in a user's forward would make): ``compile: true`` runs it in pieces and fit says so after the first step."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(x, cos, sin)
        torch._dynamo.graph_break()
        return h + self.mlp(h)
