"""``convert`` (issue 25 item 4): the same strategy is a copy (bitwise, any parameterization); another strategy is
transferred in float64 and its logits on a probe batch are compared in float64 against the stated tolerance, any
change above it refused unless ``--allow-function-change``; a user parameterization is kept exact through its
inverse, or refused by name without one.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from helpers import max_rel, probe_logits, tiny_config
from scalevec_lit.errors import UserError
from scalevec_lit.hub import convert as hub_convert
from scalevec_lit.hub.convert import convert_model, tolerance
from scalevec_lit.model import Transformer
from scalevec_lit.scale import ScaleStrategy, ScaleVector, scale_parameters
from extensions.scales import RootScale, SquareScale

CFG = dict(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)


def _model(strategy: ScaleStrategy, dtype=torch.float64, sign: float = 1.0) -> Transformer:
    torch.manual_seed(0)
    model = Transformer(tiny_config(**CFG), strategy).to(dtype)
    with torch.no_grad():
        for sp in scale_parameters(model):
            sp.param.mul_(1 + 0.3 * torch.rand_like(sp.param))
        if sign < 0:  # one negative γ entry in the final norm
            next(sp.param for sp in scale_parameters(model) if sp.info.site == "final")[0].mul_(-1)
    return model.eval()


def test_the_same_strategy_is_a_bitwise_copy_even_without_an_inverse():
    strategy = ScaleStrategy(vector=SquareScale, branch_specific=True)
    model = _model(strategy, torch.float32)
    copy, report, moved = convert_model(model, ScaleStrategy(vector=SquareScale, branch_specific=True))
    assert report.changes == [] and report.notes == ["the same strategy: a copy"] and moved == 0.0
    mine, theirs = copy.state_dict(), model.state_dict()
    assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert all(type(sp.vector) is SquareScale for sp in scale_parameters(copy))


def test_a_target_without_an_inverse_is_refused_by_name():
    with pytest.raises(UserError, match=r"its model\.strategy\.vector extensions\.scales\.SquareScale has no inverse "
                                        r"\(ScaleVector\.set_gamma_\), so no conversion can set its scales to the "
                                        r"model's γ; implement set_gamma_\(gamma\) -> bool in that class"):
        convert_model(_model(ScaleStrategy()), ScaleStrategy(vector=SquareScale), value="square.yaml")


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_user_class_with_an_inverse_is_kept_exact(sign):
    model = _model(ScaleStrategy(), sign=sign)
    converted, report, moved = convert_model(model, ScaleStrategy(vector=RootScale))
    assert report.changes == [] and moved <= tolerance(model.config)
    assert max_rel(probe_logits(converted), probe_logits(model)) <= tolerance(model.config)
    folded = [n for n in report.notes if "folded" in n]
    if sign > 0:  # every γ held by the user's vector: nothing folded, the same γ
        assert folded == []
        for a, b in zip(scale_parameters(model), scale_parameters(converted)):
            assert max_rel(b.vector(), a.vector()) <= 4 * torch.finfo(torch.float64).eps
    else:  # γ < 0 somewhere: the inverse refuses it, so that γ is folded into the head instead
        assert folded == ["final.head: input scale folded into the weight"]


def test_a_source_without_an_inverse_converts_exactly_to_a_shipped_class():
    """Reading a source needs only its γ: a user class without an inverse converts to PlainScale exactly."""
    model = _model(ScaleStrategy(vector=SquareScale))
    converted, report, moved = convert_model(model, ScaleStrategy())
    assert report.changes == [] and moved <= tolerance(model.config)
    assert [n for n in report.notes if "folded" in n] == []  # every γ held by a PlainScale
    assert max_rel(probe_logits(converted), probe_logits(model)) <= tolerance(model.config)


def test_a_float32_model_is_transferred_in_float64_and_returned_in_float32():
    model = _model(ScaleStrategy(), torch.float32)
    converted, report, moved = convert_model(model, ScaleStrategy(branch_specific=True))
    assert next(converted.parameters()).dtype == torch.float32 and report.changes == []
    assert moved <= tolerance(model.config)
    assert max_rel(probe_logits(converted), probe_logits(model)) <= 16 * torch.finfo(torch.float32).eps  # float32 storage


def test_a_measured_change_without_a_listed_cause_is_refused_unless_allowed(monkeypatch):
    real = hub_convert.transfer_

    def inexact(source, target):  # a conversion that moves one weight by 1e-6 and lists nothing
        out = real(source, target)
        with torch.no_grad():
            target.blocks[0].mlp.down.weight.mul_(1 + 1e-6)
        return out

    monkeypatch.setattr(hub_convert, "transfer_", inexact)
    model = _model(ScaleStrategy())
    tol = tolerance(model.config)
    with pytest.raises(UserError) as err:
        convert_model(model, ScaleStrategy(branch_specific=True), value="hg.yaml")
    text = str(err.value)
    assert text.startswith("--strategy: hg.yaml: this strategy changes what the model computes: no site reported a "
                           "cause: check the parameterizations' set_gamma_; the logits moved by ")
    assert (f"relative (max |Δ| / max |logits|, float64, on a probe batch of 2×32 random tokens) against a tolerance "
            f"of {tol:.3g} (float64 rounding for 2 layers of width up to 48: ε₆₄·(2L+1)·w^1.5); ") in text
    assert text.endswith("or pass --allow-function-change and continue training to recover")
    converted, report, moved = convert_model(model, ScaleStrategy(branch_specific=True), allow_function_change=True)
    assert report.changes == [] and tol < moved < 1e-5
