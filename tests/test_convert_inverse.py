"""``convert`` runs a target vector's inverse on a vector as its class constructs it (issue 32 item 3): an inverse
may read the parameters it keeps. A low-rank γ = 1 + U v that keeps its basis U and solves for v (``lstsq``), and a
γ = w ⊙ (1 + t) whose inverse writes only w, both convert exactly; the parameters they keep are at their initial
values, and the caller's random state is left as it was.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from helpers import max_rel, probe_logits, tiny_config
from scalevec_lit.hub.convert import convert_model, tolerance
from scalevec_lit.model import Transformer
from scalevec_lit.scale import ScaleStrategy, ScaleVector, scale_parameters

CFG = dict(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)
RANK = 4


def _basis(dim: int) -> torch.Tensor:
    """A fixed orthonormal basis of ``RANK`` cosines (the initial U: the same in every vector of a size)."""
    j = torch.arange(dim, dtype=torch.float64)
    u = torch.stack([torch.cos(math.pi * (j + 0.5) * k / dim) for k in range(RANK)], 1)
    return torch.linalg.qr(u).Q.float()  # float32 values: the same basis in a float32 and a float64 vector


class LowRankScale(ScaleVector):
    """γ = 1 + U v: a basis U [dim, r] (trainable, initialised to ``_basis``) and coefficients v [r] (init 0). Its
    inverse keeps U and solves U v = γ − 1 by least squares; a γ outside 1 + span(U) is refused (False)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.basis = nn.Parameter(_basis(dim))
        self.coef = nn.Parameter(torch.zeros(RANK))

    def forward(self) -> torch.Tensor:
        return 1.0 + self.basis @ self.coef

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.basis.copy_(_basis(self.dim))
            self.coef.zero_()

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        want = (gamma - 1.0).to(self.basis)
        coef = torch.linalg.lstsq(self.basis, want[:, None]).solution[:, 0]
        if float((self.basis @ coef - want).abs().max()) > 64 * torch.finfo(want.dtype).eps * float(gamma.abs().max()):
            return False
        self.coef.copy_(coef)
        return True


class TrimScale(ScaleVector):
    """γ = w ⊙ (1 + t): its inverse writes w = γ / (1 + t) only and keeps the trim t (initialised to 0.25)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.scale = nn.Parameter(torch.full((dim,), 0.8))
        self.trim = nn.Parameter(torch.full((dim,), 0.25))

    def forward(self) -> torch.Tensor:
        return self.scale * (1.0 + self.trim)

    def reset_parameters(self) -> None:
        nn.init.constant_(self.scale, 0.8)
        nn.init.constant_(self.trim, 0.25)

    def set_gamma_(self, gamma: torch.Tensor) -> bool:
        self.scale.copy_(gamma / (1.0 + self.trim))
        return True


def _model(strategy: ScaleStrategy) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(tiny_config(**CFG), strategy).double()
    with torch.no_grad():
        for sp in scale_parameters(model):  # every γ away from 1, as after training (a low-rank basis kept)
            if sp.info.part != "basis":
                sp.param.add_(0.1 * torch.randn_like(sp.param))
    return model.eval()


def test_an_inverse_that_keeps_its_basis_converts_exactly():
    """Shared low-rank γ → one per branch (HG): every γ lies in 1 + span(U_init), so the target holds each one
    through ``lstsq`` on its initial basis (nothing folded)."""
    model = _model(ScaleStrategy(vector=LowRankScale))
    state = torch.random.get_rng_state()
    converted, report, moved = convert_model(model, ScaleStrategy(vector=LowRankScale, branch_specific=True))
    assert torch.equal(torch.random.get_rng_state(), state)  # the target's construction left the caller's RNG alone
    assert report.changes == [] and moved <= tolerance(model.config)
    assert [n for n in report.notes if "folded" in n] == []
    assert max_rel(probe_logits(converted), probe_logits(model)) <= tolerance(model.config)
    for sp in scale_parameters(converted):
        if sp.info.part == "basis":
            assert torch.equal(sp.param, _basis(sp.param.shape[0]).double())  # the initial basis, kept


def test_a_gamma_outside_the_span_is_folded_and_the_function_kept():
    """A plain γ → low-rank: no v holds it (refused: False), so it is folded into the weights and γ = 1 (v = 0)."""
    model = _model(ScaleStrategy())
    converted, report, moved = convert_model(model, ScaleStrategy(vector=LowRankScale))
    assert report.changes == [] and moved <= tolerance(model.config)
    assert "final.head: input scale folded into the weight" in report.notes
    assert max_rel(probe_logits(converted), probe_logits(model)) <= tolerance(model.config)


def test_an_inverse_that_writes_some_of_its_tensors_converts_exactly():
    model = _model(ScaleStrategy())
    converted, report, moved = convert_model(model, ScaleStrategy(vector=TrimScale, branch_specific=True))
    assert report.changes == [] and moved <= tolerance(model.config)
    assert [n for n in report.notes if "folded" in n] == []
    trims = [sp.param for sp in scale_parameters(converted) if sp.info.part == "trim"]
    assert trims and all(torch.equal(t, torch.full_like(t, 0.25)) for t in trims)  # kept at its initial value
    assert max_rel(probe_logits(converted), probe_logits(model)) <= tolerance(model.config)


class TrimNoResetScale(ScaleVector):
    """``TrimScale`` without ``reset_parameters``: its initial state is what ``__init__`` builds."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim)
        self.scale = nn.Parameter(torch.full((dim,), 0.8))
        self.trim = nn.Parameter(torch.full((dim,), 0.25))

    forward = TrimScale.forward
    set_gamma_ = TrimScale.set_gamma_


def test_a_vector_without_reset_parameters_starts_as_its_class_constructs_it():
    model = _model(ScaleStrategy())
    converted, report, moved = convert_model(model, ScaleStrategy(vector=TrimNoResetScale))
    assert report.changes == [] and moved <= tolerance(model.config)
    trims = [sp.param for sp in scale_parameters(converted) if sp.info.part == "trim"]
    assert trims and all(torch.equal(t, torch.full_like(t, 0.25)) for t in trims)
