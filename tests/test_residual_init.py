"""``TransformerConfig.residual_init_std``: the one depth-scaled std, ``init_std / √(2 n_layer)`` (GPT-2), of the
maps that write into the residual stream, read by the attention (W_o), the MLP (W_down), the MoE layer (the
experts' down maps) and a user's own sublayer (``tests/extensions/blocks.py``'s ``GeluMLP``, the example of
docs/subclassing.md), instead of each deriving it again."""
from __future__ import annotations

import torch

from extensions.blocks import GeluMLP
from helpers import tiny_config
from scalevec_lit.model import MoEConfig
from scalevec_lit.model.attention import CausalSelfAttention
from scalevec_lit.model.mlp import SwiGLU
from scalevec_lit.model.moe import MoE
from scalevec_lit.scale import ScaleStrategy


def test_every_map_into_the_residual_stream_starts_at_the_config_std():
    cfg = tiny_config(n_layer=8, init_std=0.04, moe=MoEConfig(num_experts=4, top_k=2, expert_intermediate_size=32,
                                                               num_shared_experts=1))
    assert cfg.residual_init_std == 0.04 / 4
    strategy = ScaleStrategy()
    with torch.device("meta"):  # the stds they will draw from, nothing drawn
        attn, mlp = CausalSelfAttention(cfg, 0, strategy), SwiGLU(cfg, 0, strategy)
        moe, user = MoE(cfg, 0, strategy), GeluMLP(cfg, 0, strategy)
    assert (attn.out_std, mlp.out_std, moe.depth_std, user.out_std) == (0.04 / 4,) * 4
