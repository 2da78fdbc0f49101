"""The fit-start report of norm gains that are not scale vectors (``scalevec_lit/lit/norm_report.py``): each 1-D
parameter of a norm module the scale registry does not hold is named, once per layer pattern, with the class to
declare it with; scale sites and vectors, and non-norm modules, are never named. (The report printed by ``fit`` is
checked in ``tests/test_extension_suite.py``.)"""
from __future__ import annotations

import torch
from torch import nn

from helpers import tiny_config


class _Block(nn.Module):
    """A user block (not a Block subclass) with a LayerNorm (weight and bias), a norm class of its own, and a
    bias vector outside any norm."""

    def __init__(self, config, layer, strategy) -> None:
        super().__init__()
        from scalevec_lit.model.attention import CausalSelfAttention

        self.attn = CausalSelfAttention(config, layer, strategy)
        self.post = nn.LayerNorm(config.n_embd)
        self.gate_norm = MyNorm(config.n_embd)
        self.bias = nn.Parameter(torch.zeros(config.n_embd))

    def forward(self, x, cos, sin):
        return x + self.gate_norm(self.post(self.attn(x, cos, sin))) + self.bias


class MyNorm(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(dim))
        self.table = nn.Parameter(torch.ones(dim, 2))  # not 1-D: not a gain

    def forward(self, x):
        return x * self.gain


def test_unregistered_norm_gains_are_named_once_per_layer_pattern(capsys):
    from scalevec_lit.lit.norm_report import HOW, report_unregistered_norm_gains
    from scalevec_lit.model import Transformer

    model = Transformer(tiny_config(n_layer=3), block=_Block)
    found = report_unregistered_norm_gains(model)
    assert found == [(f"blocks.{i}.{name}", cls) for i in range(3) for name, cls in
                     (("post.weight", "LayerNorm"), ("post.bias", "LayerNorm"), ("gate_norm.gain", "MyNorm"))]
    err = capsys.readouterr().err
    assert err == ("warning: norm gains that are not scale vectors: blocks.*.post.weight (LayerNorm, ×3), "
                   "blocks.*.post.bias (LayerNorm, ×3), blocks.*.gate_norm.gain (MyNorm, ×3); they train as plain "
                   f"vector parameters (no role, no scale/ monitor tags, no role decay, never folded); {HOW}\n")
    assert "scalevec_lit.scale.OutputNorm(dim, strategy" in HOW


def test_the_stock_model_and_output_norms_are_not_reported(capsys):
    from scalevec_lit.lit.norm_report import report_unregistered_norm_gains
    from scalevec_lit.model import Transformer
    from scalevec_lit.scale import ScaleStrategy

    sandwich = ScaleStrategy(sublayer_output_norm=True)  # OutputNorm sites: their γ are scale vectors
    for strategy in (None, sandwich):
        assert report_unregistered_norm_gains(Transformer(tiny_config(), strategy)) == []
    assert capsys.readouterr().err == ""
