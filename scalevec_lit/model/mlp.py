"""SwiGLU MLP with its input norm and scale sites.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..scale.sites import INPUT, BranchScales, DualScaledLinear, OutputNorm, fold_columns_
from ..scale.strategy import ScaleStrategy
from .config import TransformerConfig


class SwiGLU(nn.Module):
    """The MLP sublayer of a Pre-Norm block, norm included; returns the residual-branch output.

    ::

        x ─> RMS(x) ─┬─ γ_gate ⊙ ─> W_gate ─> [N] ─> [u_gate ⊙] ─> silu ─┐
                     └─ γ_up   ⊙ ─> W_up   ─> [N] ─> [u_up ⊙] ──────────(×)─> W_down ─> [OutputNorm]
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        super().__init__()
        d, f = config.n_embd, config.intermediate_size
        pl = strategy.placement
        self.norm = BranchScales(
            d, ("gate", "up"), strategy, layer=layer, site="mlp_input", placements={"gate": pl.gate, "up": pl.up}
        )
        common = dict(strategy=strategy, layer=layer, site="mlp_proj")
        self.gate = DualScaledLinear(d, f, placement=pl.gate, branch="gate", **common)
        self.up = DualScaledLinear(d, f, placement=pl.up, branch="up", absorbed_downstream=True, **common)
        self.down = nn.Linear(f, d, bias=False)
        self.out_norm = OutputNorm(d, strategy, layer=layer, site="mlp_output") if strategy.sublayer_output_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xg, xu = self.norm(x)
        y = self.down(F.silu(self.gate(xg)) * self.up(xu))
        return y if self.out_norm is None else self.out_norm(y)

    @torch.no_grad()
    def fold_scales_(self) -> None:
        """Fold every input-role scale into W_gate, W_up (and W_down for a normalized u on up)."""
        for branch, proj in (("gate", self.gate), ("up", self.up)):
            gamma = self.norm.gamma(branch)
            if gamma is not None:
                proj.fold_input_(gamma)
        self.norm.drop_scales_()
        if self.gate.out_scale is not None and self.gate.out_role == INPUT:
            self.gate.fold_output_()
        if self.up.out_scale is not None:
            if self.up.normalize:
                fold_columns_(self.down, self.up.take_output_scale_())
            else:
                self.up.fold_output_()
