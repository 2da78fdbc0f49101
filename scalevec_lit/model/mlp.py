"""SwiGLU MLP: its input scale site and W_down.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..scale.sites import Branch, NormSite, OutputNorm
from ..scale.strategy import ScaleStrategy
from .config import TransformerConfig


def swiglu(gate: torch.Tensor, up: torch.Tensor, down) -> torch.Tensor:
    """``down(silu(gate) ⊙ up)``: the product of the dense MLP, the routed experts (``down`` a grouped
    matmul) and the shared experts of an MoE layer."""
    return down(F.silu(gate) * up)


class SwiGLU(nn.Module):
    """The MLP sublayer of a Pre-Norm block, norm included; returns the residual-branch output.

    ::

        x ─> RMS(x) ─┬─ γ_gate ⊙ ─> W_gate ─> [N] ─> [u_gate ⊙] ─> silu ─┐
                     └─ γ_up   ⊙ ─> W_up   ─> [N] ─> [u_up ⊙] ──────────(×)─> W_down ─> [OutputNorm]

    Up to the product, one ``NormSite`` (``self.input``: gate and up in one matmul). ``with_input=False``: no
    site of its own (``self.input`` is None); the block computes gate and up with a site it shares and calls
    ``combine(gate, up)`` (the one-norm parallel block, ``model/parallel.py``).
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy, *, with_input: bool = True) -> None:
        super().__init__()
        d, f = config.n_embd, config.intermediate_size
        self.out_std = config.residual_init_std
        down = nn.Linear(f, d, bias=False)  # registered after the site (the state dict's order)
        self.input = None if not with_input else NormSite(
            d, (Branch("gate", f), Branch("up", f, absorbed_downstream=True)),
            strategy, layer=layer, site="mlp_input", init_std=config.init_std, absorbed_by={"up": down},
        )
        self.down = down
        self.out_norm = OutputNorm(d, strategy, layer=layer, site="mlp_output") if strategy.sublayer_output_norm else None
        if self.down.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """W_down writes into the residual stream: N(0, init_std² / (2 L))."""
        nn.init.normal_(self.down.weight, 0.0, self.out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.combine(*self.input(x))

    def combine(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """``W_down(silu(gate) ⊙ up)`` (and the output norm) of the gate and up branches' outputs."""
        y = swiglu(gate, up, self.down)
        return y if self.out_norm is None else self.out_norm(y)
