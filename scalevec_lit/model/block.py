"""The Pre-Norm transformer block. Subclass it (or pass another block class) to try new architectures.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import torch
from torch import nn

from ..scale.strategy import ScaleStrategy
from .attention import CausalSelfAttention
from .config import TransformerConfig
from .mlp import SwiGLU


class Block(nn.Module):
    """Pre-Norm block (each sublayer owns its input norm and scale sites)::

        x ──┬──> attn(x) ──(+)──> h ──┬──> mlp(h) ──(+)──> y
            └────────────────┘        └───────────────┘

    ``h = x + Attn(N1(x))``, ``y = h + MLP(N2(h))``. Subclasses usually override ``forward`` (for
    example ``y = x + Attn(N1(x)) + MLP(N2(x))``, a parallel block) or the ``build_*`` hooks. The
    constructor signature ``(config, layer, strategy)`` is the contract ``Transformer`` calls.
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        super().__init__()
        self.layer = layer
        self.attn = self.build_attention(config, layer, strategy)
        self.mlp = self.build_mlp(config, layer, strategy)

    def build_attention(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> nn.Module:
        return CausalSelfAttention(config, layer, strategy)

    def build_mlp(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> nn.Module:
        if config.moe is not None and layer >= config.moe.first_dense_layers:
            from .moe import MoE  # imported here so that dense users never pay for it

            return MoE(config, layer, strategy)
        return SwiGLU(config, layer, strategy)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(x, cos, sin)
        return h + self.mlp(h)


class ParallelBlock(Block):
    """Two-norm parallel block: ``y = x + Attn(N1(x)) + MLP(N2(x))`` (both sublayers read the block input, each
    through its own norm; GPT-J and PaLM share one norm: ``OneNormParallelBlock``, ``model/parallel.py``).

    Shipped as the worked example of overriding ``forward``; ``recipes/examples/parallel_block.yaml`` trains it.
    """

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x, cos, sin) + self.mlp(x)
