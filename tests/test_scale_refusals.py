"""The inverse's refusals (issue 36 item 3): a non-finite γ is refused by every shipped ``set_gamma_`` with one
line naming the class, and by ``set_scale_`` before any user class's inverse runs; a refused ``set_gamma_`` leaves
a ``DirectionScale`` bitwise as it was; ``NoScale`` holds exactly γ ≡ 1 and nothing near it; ``convert`` refuses a
model with a non-finite parameter by name.
"""
from __future__ import annotations

import re

import pytest
import torch

from helpers import tiny_config
from scalevec_lit.errors import UserError
from scalevec_lit.hub.convert import convert_model
from scalevec_lit.model import Transformer
from scalevec_lit.scale import (
    DirectionScale, ExpMagnitudeDirectionScale, MagnitudeDirectionScale, NoScale, PlainScale, ScaleStrategy,
    UnitOffsetScale,
)
from scalevec_lit.scale.convert import set_scale_
from extensions.scales import SoftplusScale

SHIPPED = [NoScale, PlainScale, UnitOffsetScale, DirectionScale, MagnitudeDirectionScale, ExpMagnitudeDirectionScale]


def _moved(vec: torch.nn.Module) -> torch.nn.Module:
    """``vec`` in float64 with every parameter away from its initial value (a trained vector)."""
    vec = vec.double()
    with torch.no_grad():
        for p in vec.parameters():
            p.add_(torch.linspace(-0.3, 0.2, p.numel(), dtype=torch.float64).view_as(p))
    return vec


def _unit(n: int = 6) -> torch.Tensor:
    g = torch.tensor([1.2, -0.4, 0.9, 1.3, -1.1, 0.5], dtype=torch.float64)[:n]
    return g / g.pow(2).mean().sqrt()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("cls", SHIPPED, ids=lambda c: c.__name__)
def test_a_non_finite_gamma_is_refused_by_every_shipped_inverse(cls, bad):
    vec = _moved(cls(6))
    before = {k: v.clone() for k, v in vec.state_dict().items()}
    gamma = _unit()
    gamma[2] = bad
    name = f"scalevec_lit.scale.vector.{cls.__qualname__}"
    with pytest.raises(ValueError, match=rf"^{re.escape(name)}\.set_gamma_: γ has 1 non-finite entry \(NaN or Inf; "
                                         r"first at index 2\), which no scale vector holds; nothing was changed: take "
                                         r"γ from a model whose values are finite"):
        vec.set_gamma_(gamma)
    after = vec.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_set_scale_refuses_a_non_finite_gamma_before_a_user_inverse_runs():
    vec = SoftplusScale(4).double()  # its inverse would write log(expm1(nan)) = nan
    with pytest.raises(ValueError, match=r"^extensions\.scales\.SoftplusScale\.set_gamma_: γ has 2 non-finite "
                                         r"entries \(NaN or Inf; first at index 0, 3\)"):
        set_scale_(vec, torch.tensor([float("nan"), 1.0, 1.0, float("-inf")], dtype=torch.float64))
    assert torch.equal(vec.scale, torch.zeros(4, dtype=torch.float64))


def test_a_refused_set_gamma_leaves_a_direction_scale_bitwise_unchanged():
    vec = _moved(DirectionScale(6))
    before = {k: v.clone() for k, v in vec.state_dict().items()}
    gamma_before = vec().detach().clone()
    for wrong in (1.7 * _unit(), 0.999 * _unit(), torch.zeros(6, dtype=torch.float64)):  # RMS ≠ 1: no direction
        with torch.no_grad():  # as convert calls it
            assert vec.set_gamma_(wrong) is False
        after = vec.state_dict()
        assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)
        assert torch.equal(vec().detach(), gamma_before)
    with torch.no_grad():
        assert vec.set_gamma_(_unit()) is True
    assert float((vec() - _unit()).abs().max()) <= 8 * torch.finfo(torch.float64).eps


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_no_scale_holds_exactly_one_and_nothing_near_it(dtype):
    vec = NoScale(6)
    ones = torch.ones(6, dtype=dtype)
    assert vec.set_gamma_(ones) is True
    step = torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(2.0, dtype=dtype))  # one rounding step above
    for near in (ones + 1e-3, ones * (1 - 1e-6), torch.where(torch.arange(6) == 4, step, ones)):
        assert not torch.equal(near, ones)
        assert vec.set_gamma_(near) is False


def test_convert_refuses_a_model_with_a_non_finite_parameter():
    torch.manual_seed(0)
    model = Transformer(tiny_config(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48),
                        ScaleStrategy()).double()
    with torch.no_grad():
        model.blocks[1].mlp.down.weight[0, 0] = float("nan")
    with pytest.raises(UserError, match=r"^--ckpt: the model: has non-finite values \(NaN or Inf\) in 1 parameter\(s\): "
                                        r"blocks\.1\.mlp\.down\.weight; no conversion can keep them; convert a "
                                        r"checkpoint written before the values diverged"):
        convert_model(model, ScaleStrategy(vector=UnitOffsetScale))
