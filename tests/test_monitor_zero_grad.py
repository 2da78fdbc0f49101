"""ScaleVectorMonitor's note on scale parameters without gradient (issue 32, item 4): a parameter that has no
gradient at the first optimizer step only (γ = 1 + U·v with v = 0 at initialisation: U moves from the second
step) is not reported; one without gradient at every step looked at is, and it is called an invariance (with
the ``magnitude_before_norm`` advice) only where the strategy has one (a magnitude in front of a per-head norm).

The hook runs as Lightning runs it: before each optimizer step, on the gradients of that step's backward.
"""
from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from helpers import ROOT, tiny_config
from scalevec_lit.callbacks import ScaleVectorMonitor
from scalevec_lit.callbacks._monitor_stats import RECHECK_STEPS
from scalevec_lit.scale import ScaleStrategy, ScaleVector

pytestmark = pytest.mark.usefixtures("one_thread")
TRAINER = SimpleNamespace(is_global_zero=True)


class LowRankOffset(ScaleVector):
    """γ = 1 + U·v: a basis U (random) and coefficients v (0 at start, so γ starts at 1 and U has no gradient
    until v moves)."""

    def __init__(self, dim: int, rank: int = 2, basis_std: float = 0.5) -> None:
        super().__init__(dim)
        self.rank, self.basis_std = rank, basis_std
        self.basis = nn.Parameter(torch.empty(dim, rank))
        self.coeff = nn.Parameter(torch.empty(rank))
        self.reset_parameters()

    def forward(self) -> torch.Tensor:
        return 1.0 + self.basis @ self.coeff

    def reset_parameters(self) -> None:
        nn.init.normal_(self.basis, std=self.basis_std)
        nn.init.zeros_(self.coeff)


class DeadOffset(LowRankOffset):
    """γ = (1 + U·v) ⊙ s with U = 0, v = 0 and s = 1: U and v never get a gradient (and no invariance of the
    strategy says why); s does."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, basis_std=0.0)
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self) -> torch.Tensor:
        return (1.0 + self.basis @ self.coeff) * self.scale


def model_of(strategy: ScaleStrategy):
    from scalevec_lit.model import Transformer

    torch.manual_seed(7)
    return Transformer(tiny_config(vocab_size=64, n_layer=1, n_embd=32, n_head=2, n_kv_head=1, seq_len=16),
                       strategy)


def preset(name: str, **over) -> ScaleStrategy:
    from scalevec_lit.model.spec import strategy_from_dict

    strat = yaml.safe_load((ROOT / "recipes" / "strategy" / f"{name}.yaml").read_text())["model"]["strategy"]
    return dataclasses.replace(strategy_from_dict(strat), **over)


def train(model, steps: int) -> list[str]:
    """``steps`` AdamW steps with the monitor's hook before each; the monitor's warnings."""
    monitor = ScaleVectorMonitor()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    idx = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(3))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
            monitor.on_before_optimizer_step(TRAINER, model, opt)
            opt.step()
    return [str(w.message) for w in record if "ScaleVectorMonitor" in str(w.message)]


def test_a_parameter_without_gradient_at_the_first_step_only_is_not_reported():
    model = model_of(ScaleStrategy(vector=LowRankOffset))
    basis = [n for n, p in model.named_parameters() if n.endswith("basis")]
    assert basis and all(p.grad is None for p in model.parameters())
    assert train(model, RECHECK_STEPS + 2) == []
    # the premise: at the first step U had no gradient, and it moved later (from the second step on)
    fresh = model_of(ScaleStrategy(vector=LowRankOffset))
    start = {n: p.detach().clone() for n, p in fresh.named_parameters() if n.endswith("basis")}
    train(fresh, 1)
    assert all(torch.equal(p, start[n]) for n, p in fresh.named_parameters() if n in start)  # Adam: no grad, no move
    train(fresh, 1)
    assert all(not torch.equal(p, start[n]) for n, p in fresh.named_parameters() if n in start)


def test_a_real_invariance_is_still_reported_after_the_recheck_with_its_fix():
    said = train(model_of(preset("unified", magnitude_before_norm=True)), RECHECK_STEPS + 2)
    names = [f"blocks.0.attn.input.scales.{b}.magnitude" for b in "qk"]
    assert said == [f"ScaleVectorMonitor: 2 scale parameter(s) got no gradient at the first {RECHECK_STEPS + 1} "
                    f"optimizer steps (below 1e-4 of the largest scale gradient): {', '.join(names)}; every branch "
                    "that reads their vector normalizes its output, which divides γ's size out (an invariance of "
                    "the strategy), so only weight decay moves them; set model.strategy.magnitude_before_norm: false "
                    "or do not decay them"]
    assert train(model_of(preset("unified")), RECHECK_STEPS + 2) == []  # the preset as shipped: nothing


def test_a_parameter_that_never_gets_a_gradient_is_named_without_an_invariance():
    said = train(model_of(ScaleStrategy(vector=DeadOffset)), RECHECK_STEPS + 2)
    assert len(said) == 1 and "magnitude_before_norm" not in said[0] and "invariance of the strategy" not in said[0]
    assert said[0].startswith(f"ScaleVectorMonitor: 6 scale parameter(s) got no gradient at the first "
                              f"{RECHECK_STEPS + 1} optimizer steps (below 1e-4 of the largest scale gradient): ")
    assert said[0].endswith("the loss did not depend on them at those steps and the strategy has no invariance that "
                            "explains it: check the parameterization (a factor that stays 0 keeps the other factors' "
                            "gradients at 0)")
    names = [f"{site}.scales.shared.{part}" for site in ("blocks.0.attn.input", "blocks.0.mlp.input", "final")
             for part in ("basis", "coeff")]
    assert f"optimizer steps (below 1e-4 of the largest scale gradient): {', '.join(names)}; " in said[0]
