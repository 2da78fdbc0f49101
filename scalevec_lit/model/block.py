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

    ``forward(x, cos, sin)`` returns the new residual stream ``[B, T, n_embd]`` (``cos``/``sin``: the RoPE tables
    of the positions of ``x``). Constructor arguments beyond the three are keywords (YAML: ``model.block.init_args``),
    recorded in checkpoints with the class. The model is first built on the meta device: ``__init__`` never reads
    the value of a parameter or of a tensor made with a shape, and a module that owns parameters outside a scale
    site initializes them in its own ``init_weights()``, which ``Transformer.reset_parameters`` calls.
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        super().__init__()
        self.layer = layer
        self.attn = self.build_attention(config, layer, strategy)
        self.mlp = self.build_mlp(config, layer, strategy)

    def build_attention(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> nn.Module:
        """The attention sublayer of layer ``layer``, stored as ``self.attn``: a module called as ``attn(x, cos, sin)``
        that returns the residual branch's output (its norm included). Called from ``Block.__init__``, before the rest
        of a subclass's ``__init__`` runs: it reads only its arguments. Default ``CausalSelfAttention``, the one
        module that reads the key/value cache (a block with another attention decodes without it)."""
        return CausalSelfAttention(config, layer, strategy)

    def build_mlp(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> nn.Module:
        """The MLP sublayer of layer ``layer``, stored as ``self.mlp``: a module called as ``mlp(h)`` that returns the
        residual branch's output (its norm included). Called from ``Block.__init__`` like ``build_attention``.
        Default: an ``MoE`` from layer ``config.moe.first_dense_layers`` on when ``config.moe`` is set, else
        ``SwiGLU``."""
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
