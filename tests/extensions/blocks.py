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
