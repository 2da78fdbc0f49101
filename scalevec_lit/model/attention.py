"""Grouped-query causal self-attention: its input scale site, W_o, RoPE and SDPA.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..scale.sites import Branch, NormSite, OutputNorm
from ..scale.strategy import ScaleStrategy
from .cache import LayerCache
from .config import TransformerConfig


class CausalSelfAttention(nn.Module):
    """The attention sublayer of a Pre-Norm block, norm included; returns the residual-branch output.

    ::

        x ─> RMS(x) ─┬─ γ_q ⊙ ─> W_q ─> [N_head] ─> [u_q ⊙] ─> RoPE ─┐
                     ├─ γ_k ⊙ ─> W_k ─> [N_head] ─> [u_k ⊙] ─> RoPE ─┼─> SDPA(causal) ─> W_o ─> [OutputNorm]
                     └─ γ_v ⊙ ─> W_v ─> [N_head] ─> [u_v ⊙] ─────────┘

    Everything up to SDPA is one ``NormSite`` (``self.input``): it decides which bracketed parts exist
    (the strategy's placement), computes q, k and v with one matmul, and runs q and k together through
    their norm, scale and RoPE. This module owns W_o and the attention itself.
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        super().__init__()
        d, hd = config.n_embd, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, hd
        self.init_std, self.out_std = config.init_std, config.init_std / math.sqrt(2 * config.n_layer)
        self.input = NormSite(
            d,
            (
                Branch("q", self.n_head * hd, group=hd, rotary=True),
                Branch("k", self.n_kv_head * hd, group=hd, rotary=True),
                Branch("v", self.n_kv_head * hd, group=hd, absorbed_downstream=True),
            ),
            strategy, layer=layer, site="attn_input", init_std=config.init_std,
        )
        self.o = nn.Linear(self.n_head * hd, d, bias=False)
        self.input.absorbed_by(v=self.o)
        self.out_norm = OutputNorm(d, strategy, layer=layer, site="attn_output") if strategy.sublayer_output_norm else None
        if self.o.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """W_o writes into the residual stream: N(0, init_std² / (2 L)) (GPT-2's depth scaling)."""
        nn.init.normal_(self.o.weight, 0.0, self.out_std)

    #: set by ``Transformer.forward_cached`` for the duration of one call (``model/cache.py``); never in training
    kv_cache: Optional[LayerCache] = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.kv_cache is not None:
            return self._forward_cached(x, cos, sin)
        B, T, _ = x.shape
        q, k, v = self.input(x, rope=(cos, sin))
        y = F.scaled_dot_product_attention(
            q.view(B, T, self.n_head, self.head_dim).transpose(1, 2),
            k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2),
            v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2),
            is_causal=True,
            enable_gqa=self.n_head != self.n_kv_head,
        )
        y = self.o(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))
        return y if self.out_norm is None else self.out_norm(y)

    def _forward_cached(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The same function for new positions whose predecessors' keys and values are in ``self.kv_cache``
        (``cos``/``sin`` are the tables of the new positions)."""
        B, T, _ = x.shape
        q, k, v = self.input(x, rope=(cos, sin))
        k, v, masking = self.kv_cache.update(
            k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2),
            v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2),
        )
        y = F.scaled_dot_product_attention(
            q.view(B, T, self.n_head, self.head_dim).transpose(1, 2), k, v, **masking,
            enable_gqa=self.n_head != self.n_kv_head,
        )
        y = self.o(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))
        return y if self.out_norm is None else self.out_norm(y)
