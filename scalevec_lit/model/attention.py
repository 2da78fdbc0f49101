"""Grouped-query causal self-attention with its input norm and scale sites.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..scale.sites import INPUT, BranchScales, DualScaledLinear, OutputNorm, fold_columns_
from ..scale.strategy import ScaleStrategy
from .config import TransformerConfig
from .rope import apply_rope


class CausalSelfAttention(nn.Module):
    """The attention sublayer of a Pre-Norm block, norm included; returns the residual-branch output.

    ::

        x ─> RMS(x) ─┬─ γ_q ⊙ ─> W_q ─> [N_head] ─> [u_q ⊙] ─> RoPE ─┐
                     ├─ γ_k ⊙ ─> W_k ─> [N_head] ─> [u_k ⊙] ─> RoPE ─┼─> SDPA(causal) ─> W_o ─> [OutputNorm]
                     └─ γ_v ⊙ ─> W_v ─> [N_head] ─> [u_v ⊙] ─────────┘

    γ_q, γ_k, γ_v are one shared scale unless the strategy is branch-specific; the bracketed parts exist
    only for the placements (``dual_norm`` adds N_head, any output side adds u) and options that ask.
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        super().__init__()
        d, hd = config.n_embd, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, hd
        pl = strategy.placement
        self.norm = BranchScales(
            d, ("q", "k", "v"), strategy, layer=layer, site="attn_input", placements={b: pl.of(b) for b in "qkv"}
        )
        common = dict(strategy=strategy, layer=layer, site="attn_proj", group_size=hd)
        self.q = DualScaledLinear(d, self.n_head * hd, placement=pl.q, branch="q", **common)
        self.k = DualScaledLinear(d, self.n_kv_head * hd, placement=pl.k, branch="k", **common)
        self.v = DualScaledLinear(d, self.n_kv_head * hd, placement=pl.v, branch="v", absorbed_downstream=True, **common)
        self.o = nn.Linear(self.n_head * hd, d, bias=False)
        self.out_norm = OutputNorm(d, strategy, layer=layer, site="attn_output") if strategy.sublayer_output_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        xq, xk, xv = self.norm(x)
        q = apply_rope(self.q(xq).view(B, T, self.n_head, self.head_dim), cos, sin)
        k = apply_rope(self.k(xk).view(B, T, self.n_kv_head, self.head_dim), cos, sin)
        v = self.v(xv).view(B, T, self.n_kv_head, self.head_dim)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            is_causal=True,
            enable_gqa=self.n_head != self.n_kv_head,
        )
        y = self.o(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))
        return y if self.out_norm is None else self.out_norm(y)

    @torch.no_grad()
    def fold_scales_(self) -> None:
        """Fold every input-role scale into W_q, W_k, W_v (and W_o for a normalized u on v)."""
        for branch, proj in zip("qkv", (self.q, self.k, self.v)):
            gamma = self.norm.gamma(branch)
            if gamma is not None:
                proj.fold_input_(gamma)
        self.norm.drop_scales_()
        for proj in (self.q, self.k):
            if proj.out_scale is not None and proj.out_role == INPUT:
                proj.fold_output_()
        if self.v.out_scale is not None:
            if not self.v.normalize:
                self.v.fold_output_()
            else:  # u ⊙ N(v) averaged over tokens, then W_o: each query head reads its kv head's u
                u = self.v.take_output_scale_()
                if u is not None:
                    group = self.n_head // self.n_kv_head
                    fold_columns_(self.o, u.view(self.n_kv_head, self.head_dim).repeat_interleave(group, 0).flatten())
