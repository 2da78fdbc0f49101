"""The one-norm parallel block (GPT-J, PaLM): one RMSNorm read by q, k, v, gate and up.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import torch
from torch import nn

from ..scale.sites import Branch, NormSite
from ..scale.strategy import ScaleStrategy
from .attention import CausalSelfAttention
from .block import Block
from .config import TransformerConfig
from .mlp import SwiGLU


class OneNormParallelBlock(Block):
    """``y = x + Attn(q, k, v) + MLP(gate, up)`` with q, k, v, gate and up all read from one normalization of ``x``::

        x ─> RMS(x) ─┬─ γ_q ⊙ ─> W_q ─> [N_head] [u_q ⊙] RoPE ─┐
                     ├─ γ_k ⊙ ─> W_k ─> [N_head] [u_k ⊙] RoPE ─┼─> SDPA(causal) ─> W_o ──────┐
                     ├─ γ_v ⊙ ─> W_v ─> [N_head] [u_v ⊙] ──────┘                            │
                     ├─ γ_gate ⊙ ─> W_gate ─> [N] [u ⊙] ─> silu ─┐                          │
                     └─ γ_up ⊙ ─> W_up ─> [N] [u ⊙] ────────────(×)─> W_down ─────────────(+)─(+ x)─> y

    The norm and its five consumers are one ``NormSite`` (``self.input``, site ``block_input``; output-side scales
    are tagged ``attn_proj`` for q/k/v and ``mlp_proj`` for gate/up), computed in one matmul. The baseline
    strategy gives it one γ (the block's single norm weight), HG (``branch_specific``) one γ per branch, and every
    placement (``unified``'s QK-norm included) applies as in the two-norm blocks; fold is exact (v's and up's
    normalized output scales fold into W_o and W_down). ``self.attn`` / ``self.mlp`` hold W_o and W_down (and the
    key/value cache), without norms of their own. Dense MLP only (an MoE layer owns its norm: use ``ParallelBlock``).

    Chosen from YAML with ``model.block: scalevec_lit.model.OneNormParallelBlock``
    (``recipes/examples/parallel_one_norm.yaml``). Export to Hugging Face formats refuses it by name (no adapter
    reads it); ``--format native`` holds it.
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        if config.moe is not None:
            raise ValueError("model.block: OneNormParallelBlock has a dense MLP only, but model.config.moe is set; use "
                             "scalevec_lit.model.ParallelBlock (two norms) for an MoE model, or remove moe")
        super().__init__(config, layer, strategy)  # attn and mlp without norms (build_attention / build_mlp below)
        hd, f = config.head_dim, config.intermediate_size
        attn_proj, mlp_proj = "attn_proj", "mlp_proj"
        self.input = NormSite(
            config.n_embd,
            (
                Branch("q", config.n_head * hd, group=hd, rotary=True, proj_site=attn_proj),
                Branch("k", config.n_kv_head * hd, group=hd, rotary=True, proj_site=attn_proj),
                Branch("v", config.n_kv_head * hd, group=hd, absorbed_downstream=True, proj_site=attn_proj),
                Branch("gate", f, proj_site=mlp_proj),
                Branch("up", f, absorbed_downstream=True, proj_site=mlp_proj),
            ),
            strategy, layer=layer, site="block_input", init_std=config.init_std,
            absorbed_by={"v": self.attn.o, "up": self.mlp.down},
        )

    def build_attention(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> nn.Module:
        """``CausalSelfAttention`` without a site of its own (W_o, the attention, the cache): ``forward`` gives it
        q, k and v from ``self.input`` (``attend``)."""
        return CausalSelfAttention(config, layer, strategy, with_input=False)

    def build_mlp(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> nn.Module:
        """``SwiGLU`` without a site of its own (W_down): ``forward`` gives it gate and up from ``self.input``
        (``combine``)."""
        return SwiGLU(config, layer, strategy, with_input=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v, gate, up = self.input(x, rope=(cos, sin))
        return x + self.attn.attend(q, k, v) + self.mlp.combine(gate, up)
