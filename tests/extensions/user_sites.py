"""User classes that compute from their arguments, and a scale site of the user's own:

- ``LogScale``: ``γ = exp(w)``, ``w`` starting at ``log(init)`` computed in ``__init__`` from a tensor made of its
  argument (``float(torch.log(torch.tensor(init)))``): the model is first built on the meta device, where this
  must still work; ``PeekScale`` reads the value of its own parameter there, which cannot work: refused naming it;
- ``ResidualScale``: a ``ScaleSite`` that multiplies a sublayer's output by a scale vector (output role) before
  the residual add, with ``convert_from_`` (it joins ``convert``); ``ResidualScaleNoConvert``: the same without;
- ``ResidualGainBlock`` / ``ResidualGainNoConvertBlock``: blocks with one ``ResidualScale`` per sublayer.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

from scalevec_lit.model import Block
from scalevec_lit.scale import OUTPUT, ScaleInfo, ScaleSite, ScaleVector
from scalevec_lit.scale.convert import copy_scales_


class LogScale(ScaleVector):
    def __init__(self, dim: int, init: float = 1.0) -> None:
        super().__init__(dim)
        self.log_init = float(torch.log(torch.tensor(init)))
        self.scale = nn.Parameter(torch.full((dim,), self.log_init))

    def forward(self) -> torch.Tensor:
        return self.scale.exp()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.scale, self.log_init)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        if not bool((gamma > 0).all()):
            return False
        self.scale.copy_(gamma.log().to(self.scale))
        return True


class PeekScale(LogScale):
    def __init__(self, dim: int, init: float = 1.0) -> None:
        super().__init__(dim, init)
        self.first = float(self.scale[0])  # the value of a parameter: none on the meta device


class ResidualScaleNoConvert(ScaleSite):
    """``γ ⊙ y`` on a sublayer's output ``y``: a scale vector of output role, the strategy's parameterization."""

    def __init__(self, dim: int, strategy, *, layer: int, site: str) -> None:
        super().__init__()
        self.layer, self.site = layer, site
        self.scale = strategy.make_vector(dim)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.scale.is_identity else y * self.scale()

    @torch.no_grad()
    def init_weights(self) -> None:
        if hasattr(self.scale, "reset_parameters"):
            self.scale.reset_parameters()

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        yield ScaleInfo(self.layer, self.site, "out", OUTPUT), self.scale


class ResidualScale(ResidualScaleNoConvert):
    def convert_from_(self, source: "ResidualScale") -> list[str]:
        return copy_scales_(self, source)  # it only multiplies by γ: γ written through the target's inverse


class ResidualGainBlock(Block):
    site_class = ResidualScale

    def __init__(self, config, layer, strategy) -> None:
        super().__init__(config, layer, strategy)
        self.attn_gain = self.site_class(config.n_embd, strategy, layer=layer, site="attn_gain")
        self.mlp_gain = self.site_class(config.n_embd, strategy, layer=layer, site="mlp_gain")

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attn_gain(self.attn(x, cos, sin))
        return h + self.mlp_gain(self.mlp(h))


class ResidualGainNoConvertBlock(ResidualGainBlock):
    site_class = ResidualScaleNoConvert
