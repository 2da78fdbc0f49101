"""``convert``'s checks see every expert and the dtype it writes (issue 36 item 3).

The float64 probe of an MoE model also routes every token to every expert (top-k = E), so an error confined to
an expert that the probe's routing never picks is caught; and the model is checked again as written in the
checkpoint's dtype (a value the cast overflows is refused, whatever ``--allow-function-change`` says).
"""
from __future__ import annotations

import pytest
import torch

from helpers import tiny_config
from scalevec_lit.errors import UserError
from scalevec_lit.hub import convert as hub_convert
from scalevec_lit.hub.convert import convert_model, tolerance
from scalevec_lit.hub.convert_check import Probe, written_tolerance
from scalevec_lit.model import Transformer
from scalevec_lit.model.config import MoEConfig
from scalevec_lit.model.moe import MoE
from scalevec_lit.scale import ScaleStrategy, UnitOffsetScale, scale_parameters

CFG = dict(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)
E = 8


def _moe_model() -> Transformer:
    """8 experts, one γ per expert, and a balancing bias that keeps every token away from expert 7."""
    torch.manual_seed(0)
    moe = MoEConfig(num_experts=E, top_k=2, expert_intermediate_size=16, scales="expert", bias_balancing=True)
    model = Transformer(tiny_config(**CFG, moe=moe), ScaleStrategy()).double()
    with torch.no_grad():
        for sp in scale_parameters(model):
            sp.param.mul_(1 + 0.3 * torch.rand_like(sp.param))
        for layer in model.modules():
            if isinstance(layer, MoE):
                layer.expert_bias[E - 1] = -10.0  # scores are in (0, 1): expert 7 is never selected
    return model.eval()


def test_an_error_in_an_expert_that_no_probe_token_reaches_is_refused(monkeypatch):
    model = _moe_model()
    with torch.no_grad():
        model(hub_convert.probe_batch(model))
    loads = [layer.last_load_stats["tokens_per_expert"] for layer in model.modules() if isinstance(layer, MoE)]
    assert loads and all(float(c[E - 1]) == 0.0 and float(c.sum()) == 2 * 32 * 2 for c in loads)
    real = hub_convert.transfer_

    def wrong_expert(source, target):  # a conversion that gets expert 7's γ wrong by 1e-3 and lists nothing
        out = real(source, target)
        with torch.no_grad():
            for name, param in target.named_parameters():  # (the advice's presets are converted through it too)
                if name.startswith("blocks.1.mlp.input.expert_scales.7."):
                    param.add_(1e-3)
        return out

    target = ScaleStrategy(vector=UnitOffsetScale)
    converted, report, moved = convert_model(model, target)  # the true conversion: exact, with every expert seen
    assert report.changes == [] and moved <= tolerance(model.config)
    monkeypatch.setattr(hub_convert, "transfer_", wrong_expert)
    with pytest.raises(UserError) as err:
        convert_model(model, target, value="unit_offset.yaml")
    text = str(err.value)
    assert text.startswith("--strategy: unit_offset.yaml: this strategy changes what the model computes: no site "
                           "reported a cause: check the parameterizations' set_gamma_; the logits moved by ")
    assert ("(max |Δ| / max |logits|, float64, on a probe batch of 2×32 random tokens, also with every token routed "
            "to every expert) against a tolerance of ") in text
    moved = float(text.split("the logits moved by ")[1].split(" ")[0])
    assert moved > 1e3 * tolerance(model.config)


def test_the_written_dtype_is_checked_an_overflow_is_refused():
    """float16: γ = 6e4 folded into a head weight of 2 is 1.2e5, beyond float16's range (65504) once cast, though the
    float64 transfer is exact; refused even with --allow-function-change. A γ that fits converts."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(**CFG), ScaleStrategy()).half().eval()
    final = next(sp.param for sp in scale_parameters(model) if sp.info.site == "final")
    with torch.no_grad():
        final[3] = 6e4
        model.final.proj["head"].weight[:, 3] = 2.0
    for allow in (False, True):
        with pytest.raises(UserError, match=r"^--strategy: no_scale\.yaml: the converted model does not fit in "
                                            r"float16, the checkpoint's dtype: final\.proj\.head\.weight overflow "
                                            r"\(a scale folded into weights beyond its range\); choose a strategy "
                                            r"that the conversion keeps exactly for this model \(checked for every "
                                            r"preset in recipes/strategy/\): baseline, "):
            convert_model(model, ScaleStrategy(vector=hub_convert.read_strategy(
                hub_convert.presets_folder() / "no_scale.yaml", 1e-6).vector), allow_function_change=allow, value="no_scale.yaml")
    with torch.no_grad():
        final[3] = 1e3
    converted, report, moved = convert_model(model, hub_convert.read_strategy(hub_convert.presets_folder() / "no_scale.yaml",
                                                                              1e-6))
    assert next(converted.parameters()).dtype == torch.float16 and report.changes == []
    assert bool(torch.isfinite(converted.final.proj["head"].weight).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_conversion_written_in_a_narrower_dtype_stays_within_its_tolerance(dtype):
    """The written check's tolerance (the model with every parameter moved by ε) holds for an exact conversion
    that rounds folded weights."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(**CFG), ScaleStrategy()).to(dtype).eval()
    with torch.no_grad():
        for sp in scale_parameters(model):
            sp.param.mul_(1 + 0.5 * torch.rand_like(sp.param))
    converted, report, _ = convert_model(model, ScaleStrategy(vector=UnitOffsetScale, final_norm=False))
    assert report.changes == [] and next(converted.parameters()).dtype == dtype
    idx = hub_convert.probe_batch(model)
    with torch.no_grad():
        a, b = model.double()(idx), converted.double()(idx)
    lost = float((a - b).abs().max() / a.abs().max())
    source = model.double().eval()
    assert 0.0 < lost <= written_tolerance(source, Probe(source, idx), dtype)  # the final γ folded into the head
