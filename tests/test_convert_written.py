"""``convert``'s checks that can fail (issue 47 item 3).

- The model as written in its checkpoint's dtype is held to what the dtype can hold at the model's size: the
  change of the model with every parameter moved by ε of itself (``written_tolerance``). A bfloat16 model whose
  γ are 0.01–0.02, converted to ``unit_offset`` (γ stored as γ − 1 ≈ −0.99, whose bfloat16 spacing is 2⁻⁸: each
  γ off by up to a fifth of itself), is refused; so is float32 with γ ≈ 1e-3; honest bfloat16 and float16
  conversions (γ folded into weights, each product rounded once) are kept.
- The every-expert probe weighs every expert equally: an expert that the router scores exactly 0 (float32
  softmax) on every probe token is seen, and a conversion that gets its γ wrong is refused.
"""
from __future__ import annotations

import copy

import pytest
import torch

from helpers import tiny_config
from scalevec_lit.errors import UserError
from scalevec_lit.hub import convert as hub_convert
from scalevec_lit.hub.convert import convert_model, read_strategy
from scalevec_lit.hub.convert_check import Probe, probe_batch, tolerance
from scalevec_lit.model import Transformer
from scalevec_lit.model.config import MoEConfig
from scalevec_lit.model.moe import MoE
from scalevec_lit.scale import ScaleStrategy, UnitOffsetScale, scale_parameters

CFG = dict(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)


def _preset(name: str) -> ScaleStrategy:
    return read_strategy(hub_convert.presets_folder() / f"{name}.yaml", 1e-6)


def _model(dtype: torch.dtype, low: float, high: float) -> Transformer:
    """The tiny dense model, every γ drawn uniformly in [low, high], written in ``dtype``."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(**CFG), ScaleStrategy()).eval()
    with torch.no_grad():
        for sp in scale_parameters(model):
            sp.param.copy_(low + (high - low) * torch.rand_like(sp.param))
    return model.to(dtype)


def _gamma_error(model: Transformer, converted: Transformer) -> float:
    """The largest relative error of a γ of ``converted`` (as written, evaluated in float64) against the model's,
    site by site (the two strategies have the same sites)."""
    def gammas(m: Transformer) -> dict:
        return {(sp.info.layer, sp.info.site, sp.info.branch, sp.info.role): sp.vector().detach()
                for sp in scale_parameters(copy.deepcopy(m).double())}

    ga, gb = gammas(model), gammas(converted)
    assert ga.keys() == gb.keys()
    return max(float(((gb[k] - ga[k]).abs() / ga[k].abs()).max()) for k in ga)


def test_a_bfloat16_gamma_that_unit_offset_cannot_hold_is_refused():
    model = _model(torch.bfloat16, 0.01, 0.02)
    with pytest.raises(UserError) as err:
        convert_model(model, _preset("unit_offset"), value="unit_offset.yaml")
    text = str(err.value)
    assert text.startswith("--strategy: unit_offset.yaml: the model as written in bfloat16 moves the logits by ")
    assert ("although the float64 transfer kept the function: this parameterization cannot hold the model's values "
            "in bfloat16; choose a strategy that the conversion keeps exactly for this model") in text
    lost = float(text.split("moves the logits by ")[1].split(" ")[0])
    wtol = float(text.split("against a tolerance of ")[1].split(" ")[0])
    assert lost > wtol >= tolerance(model.config)
    # what was refused: γ − 1 ≈ −0.99 has a bfloat16 spacing of 2⁻⁸, so γ ≈ 0.01 is off by up to 2⁻⁹ / 0.01
    converted, report, moved = convert_model(model, _preset("unit_offset"), allow_function_change=True)
    assert report.changes == [] and moved <= tolerance(model.config)  # the float64 transfer itself is exact
    assert _gamma_error(model, converted) > 0.1
    # the same model, converted where each written value is rounded once relative to itself: kept
    for name in ("no_scale", "hg"):
        converted, report, _ = convert_model(model, _preset(name), value=f"{name}.yaml")
        assert report.changes == [] and next(converted.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_honest_16_bit_conversions_are_kept(dtype):
    """γ of order 1: unit_offset holds them (γ − 1 is small) and no_scale folds them into weights (one rounding of
    each product); both are within the written tolerance, which is far below the old ε·(2L+1)·√w."""
    model = _model(dtype, 0.5, 1.5)
    source = model.double().eval()
    probe = Probe(source, probe_batch(source))
    model = model.to(dtype)
    eps, L, w = torch.finfo(dtype).eps, model.config.n_layer, max(CFG["n_embd"], CFG["intermediate_size"])
    assert probe.written_tolerance(dtype) < eps * (2 * L + 1) * w ** 0.5 / 4
    for name in ("unit_offset", "no_scale", "hg"):
        converted, report, _ = convert_model(model, _preset(name), value=f"{name}.yaml")
        assert report.changes == [] and next(converted.parameters()).dtype == dtype
        assert probe.change(converted.double().eval()) <= probe.written_tolerance(dtype)


def test_a_float32_gamma_of_1e_3_in_unit_offset_is_refused():
    """float32: γ − 1 ≈ −0.999 is held to 2⁻²⁵, a relative error of 3e-5 on γ ≈ 1e-3, far above float32's ε."""
    model = _model(torch.float32, 1e-3, 2e-3)
    with pytest.raises(UserError, match=r"^--strategy: unit_offset\.yaml: the model as written in float32 moves the "
                                        r"logits by .* \(the change of this model with every parameter moved by ε of "
                                        r"itself in float32: more than any rounding a write in float32 must "
                                        r"introduce\), although the float64 transfer kept the function"):
        convert_model(model, _preset("unit_offset"), value="unit_offset.yaml")
    converted, _, _ = convert_model(model, _preset("no_scale"), value="no_scale.yaml")  # folded: kept
    assert next(converted.parameters()).dtype == torch.float32


E = 8


def _moe_model() -> Transformer:
    """8 experts, one γ per expert; every token's residual stream carries a large constant in channel 0, and the
    router's row of expert 7 reads it with weight −40: a logit about 200 below the others, whose float32 softmax
    score is exactly 0 on every token."""
    torch.manual_seed(0)
    moe = MoEConfig(num_experts=E, top_k=2, expert_intermediate_size=16, scales="expert")
    model = Transformer(tiny_config(**CFG, moe=moe), ScaleStrategy()).double()
    with torch.no_grad():
        for sp in scale_parameters(model):
            sp.param.mul_(1 + 0.3 * torch.rand_like(sp.param))
        model.embed.weight[:, 0] = 5.0
        for layer in model.modules():
            if isinstance(layer, MoE):
                layer.input.proj["router"].weight[E - 1].zero_()[0] = -40.0
    return model.eval()


def test_an_expert_the_router_scores_zero_is_still_checked(monkeypatch):
    model = _moe_model()
    scores = []
    from scalevec_lit.model import moe as moe_module

    original = moe_module.route

    def spy(logits, *args, **kwargs):
        r = original(logits, *args, **kwargs)
        scores.append(logits.float().softmax(-1)[:, E - 1])
        return r

    monkeypatch.setattr(moe_module, "route", spy)
    with torch.no_grad():
        model(probe_batch(model))
    monkeypatch.setattr(moe_module, "route", original)
    assert len(scores) == sum(isinstance(m, MoE) for m in model.modules()) >= 2
    assert all(float(s.abs().max()) == 0.0 for s in scores)  # expert 7: exactly 0 on every probe token

    target = ScaleStrategy(vector=UnitOffsetScale)
    converted, report, moved = convert_model(model, target)  # the true conversion: exact, every expert seen
    assert report.changes == [] and moved <= tolerance(model.config)
    real = hub_convert.transfer_

    def wrong_expert(source, target):  # expert 7's γ multiplied by 1.5 in every layer, nothing listed
        out = real(source, target)
        with torch.no_grad():
            for name, module in target.named_modules():
                if name.endswith(f"mlp.input.expert_scales.{E - 1}"):
                    assert module.set_gamma_(1.5 * module())
        return out

    monkeypatch.setattr(hub_convert, "transfer_", wrong_expert)
    with pytest.raises(UserError) as err:
        convert_model(model, target, value="unit_offset.yaml")
    text = str(err.value)
    assert text.startswith("--strategy: unit_offset.yaml: this strategy changes what the model computes: no site "
                           "reported a cause: check the parameterizations' set_gamma_; the logits moved by ")
    assert float(text.split("the logits moved by ")[1].split(" ")[0]) > 1e3 * tolerance(model.config)
