"""New parameterizations (``ScaleVector`` subclasses), chosen with ``model.strategy.vector.class_path``:

- ``SoftplusScale``: ``γ = softplus(w) / softplus(0)`` (positive, starts at 1), with its inverse (``set_gamma_``),
  so ``convert`` to it is exact;
- ``TanhScale``: ``γ = 1 + tanh(w)``, without an inverse: ``convert`` to it is refused by name;
- ``SquareScale``: ``γ = w²``, without an inverse; ``RootScale``: the same with its inverse ``w = √γ``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from scalevec_lit.scale import ScaleVector

_SOFTPLUS_0 = math.log(2.0)


class SoftplusScale(ScaleVector):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.scale = nn.Parameter(torch.zeros(dim))

    def forward(self) -> torch.Tensor:
        return F.softplus(self.scale) / _SOFTPLUS_0

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.scale)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        """``w = softplus⁻¹(γ · softplus(0)) = log(expm1(γ · log 2))``; only a positive γ is reachable."""
        if not bool((gamma > 0).all()):
            return False
        g = gamma.double() * _SOFTPLUS_0
        self.scale.copy_(torch.where(g > 20, g, torch.log(torch.expm1(g))).to(self.scale))
        return True


class TanhScale(ScaleVector):
    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.scale = nn.Parameter(torch.zeros(dim))

    def forward(self) -> torch.Tensor:
        return 1.0 + torch.tanh(self.scale)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.scale)


class SquareScale(ScaleVector):
    """γ = w², w initialised to 1: a user class without an inverse (``set_gamma_`` not written)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self) -> torch.Tensor:
        return self.scale.square()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)


class RootScale(SquareScale):
    """``SquareScale`` with its inverse ``w = √γ``: a γ < 0 is refused (``False``, nothing changed)."""

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        if bool((gamma < 0).any()):
            return False
        self.scale.copy_(gamma.sqrt())
        return True
