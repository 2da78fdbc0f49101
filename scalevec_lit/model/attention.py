"""Grouped-query causal self-attention: its input scale site, W_o, RoPE and SDPA.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

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
    their norm, scale and RoPE. This module owns W_o and the attention itself (``attend``).

    ``with_input=False``: no site of its own (``self.input`` is None); the block computes q, k and v with a site
    it shares with other sublayers and calls ``attend(q, k, v)`` (``model/parallel.py``, the one-norm parallel
    block). The key/value cache works either way.
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy, *, with_input: bool = True) -> None:
        super().__init__()
        d, hd = config.n_embd, config.head_dim
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, hd
        self.init_std, self.out_std = config.init_std, config.residual_init_std
        o = nn.Linear(self.n_head * hd, d, bias=False)  # registered after the site (the state dict's order)
        self.input = None if not with_input else NormSite(
            d,
            (
                Branch("q", self.n_head * hd, group=hd, rotary=True),
                Branch("k", self.n_kv_head * hd, group=hd, rotary=True),
                Branch("v", self.n_kv_head * hd, group=hd, absorbed_downstream=True),
            ),
            strategy, layer=layer, site="attn_input", init_std=config.init_std, absorbed_by={"v": o},
        )
        self.o = o
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
        q, k, v = self.input(x, rope=(cos, sin))
        return self.attend(q, k, v)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of ``q``, ``k``, ``v`` ``[B, T, width]`` (after their output side and RoPE), then W_o
        (and the output norm). With ``self.kv_cache`` set, the new positions also attend to the cached ones
        (``cos``/``sin`` of q and k were those of the new positions) and their keys and values are added."""
        B, T, _ = q.shape
        k = k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        masking = {"is_causal": True}
        if self.kv_cache is not None:
            k, v, masking = self.kv_cache.update(k, v)
        y = F.scaled_dot_product_attention(
            q.view(B, T, self.n_head, self.head_dim).transpose(1, 2), k, v, **masking,
            enable_gqa=self.n_head != self.n_kv_head,
        )
        y = self.o(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))
        return y if self.out_norm is None else self.out_norm(y)
