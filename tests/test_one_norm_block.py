"""The one-norm parallel block (GPT-J / PaLM: one RMSNorm read by q, k, v, gate and up), issue 25 item 6.

Against a plain definition written here; under the baseline, HG and unified strategies (roles, fold, the
key/value cache, conversion); chosen from YAML; export refuses it by name. Float64 throughout, compared with
the conversion's own stated tolerance (``hub.convert.tolerance``: float64 rounding for the model's size).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import ROOT, module_from_config, print_config, recipe, tiny_config
from scalevec_lit.errors import UserError
from scalevec_lit.hub.convert import convert_model, read_strategy, tolerance
from scalevec_lit.model import OneNormParallelBlock, Transformer
from scalevec_lit.model.config import MoEConfig
from scalevec_lit.scale import INPUT, OUTPUT, fold_scales, scale_parameters

CFG = dict(vocab_size=128, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _strategy(preset: str):
    return read_strategy(recipe("strategy", f"{preset}.yaml"), 1e-6)


def _model(preset: str) -> Transformer:
    """A float64 one-norm model whose every scale is moved off its init (so that a dropped one shows)."""
    torch.manual_seed(0)
    model = Transformer(tiny_config(**CFG), _strategy(preset), OneNormParallelBlock).double()
    with torch.no_grad():
        for sp in scale_parameters(model):
            sp.param.mul_(1 + 0.3 * torch.rand_like(sp.param))
    return model.eval()


def _rope(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    return t * cos + torch.cat((-t[..., half:], t[..., :half]), -1) * sin


def test_the_block_is_one_norm_read_by_five_maps():
    """Baseline: y = x + W_o Attn(q, k, v) + W_down(silu(W_gate h) ⊙ W_up h) with h = γ ⊙ x / RMS(x), ONE γ."""
    model = _model("baseline")
    block, cfg = model.blocks[0], model.config
    site = block.input
    assert block.attn.input is None and block.mlp.input is None
    assert [sp.info.branch for sp in scale_parameters(block)] == ["shared"]  # the block's single norm weight
    x = torch.randn(2, 10, cfg.n_embd, dtype=torch.float64)
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + site.eps) * site.gamma("q")
    q, k, v, g, u = (h @ site.weight(b).T for b in ("q", "k", "v", "gate", "up"))
    cos, sin = model.rope_cos[:10, None], model.rope_sin[:10, None]
    hd = cfg.head_dim
    q = _rope(q.unflatten(-1, (-1, hd)), cos, sin).transpose(1, 2)
    k = _rope(k.unflatten(-1, (-1, hd)), cos, sin).transpose(1, 2).repeat_interleave(2, 1)
    v = v.unflatten(-1, (-1, hd)).transpose(1, 2).repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    att = (scores.softmax(-1) @ v).transpose(1, 2).flatten(-2)
    want = x + att @ block.attn.o.weight.T + (F.silu(g) * u) @ block.mlp.down.weight.T
    got = block(x, model.rope_cos[:10], model.rope_sin[:10])
    assert _rel(got, want) <= tolerance(cfg)


@pytest.mark.parametrize("preset,inputs,outputs", [
    ("baseline", ["shared"], []),
    ("hg", ["q", "k", "v", "gate", "up"], []),
    ("unified", ["q", "k", "v", "gate", "up"], [("attn_proj", "q", OUTPUT), ("attn_proj", "k", OUTPUT)]),
])
def test_strategies_roles_fold_and_cache(preset, inputs, outputs):
    model = _model(preset)
    layer0 = [sp.info for sp in scale_parameters(model.blocks[0])]
    assert sorted({i.branch for i in layer0 if i.site == "block_input"}) == sorted(inputs)
    assert all(i.role == INPUT for i in layer0 if i.site == "block_input")
    assert sorted({(i.site, i.branch, i.role) for i in layer0 if i.site != "block_input"}) == sorted(outputs)
    idx = torch.randint(0, 128, (2, 24))
    ref = model(idx).detach()
    folded = fold_scales(model)
    assert {(i.site, i.branch) for i in (sp.info for sp in scale_parameters(folded.blocks[0]))} == \
        {(s, b) for s, b, _ in outputs}  # only output-role scales are left
    assert _rel(folded(idx), ref) <= tolerance(model.config)
    cache = model.new_cache()
    with torch.no_grad():
        steps = torch.cat([model.forward_cached(idx[:, :16], cache)] +
                          [model.forward_cached(idx[:, t:t + 1], cache) for t in range(16, 24)], 1)
    assert _rel(steps, ref) <= tolerance(model.config)


def test_convert_between_hg_and_baseline_is_exact_and_adding_qk_norm_is_refused():
    model = _model("baseline")
    idx = torch.randint(0, 128, (2, 24))
    ref = model(idx).detach()
    hg, report, moved = convert_model(model, _strategy("hg"))
    assert not report.changes and moved <= tolerance(model.config)
    assert _rel(hg(idx), ref) <= tolerance(model.config)
    assert sorted({sp.info.branch for sp in scale_parameters(hg.blocks[1])}) == ["gate", "k", "q", "up", "v"]
    back, report, _ = convert_model(_model("hg"), _strategy("baseline"))
    assert not report.changes and any("input scale folded into the weight" in n for n in report.notes)
    with pytest.raises(UserError, match=r"blocks\.\*\.input\.q: adds a normalization of the projection's output "
                                        r"\(model\.strategy\.placement\.q: 'dual_norm'; the source has 'input'\)"):
        convert_model(model, _strategy("qk_norm"))


def test_export_refuses_it_by_name():
    from scalevec_lit.export.hf_plan import plan

    adapter, problems = plan(fold_scales(_model("baseline")))
    assert adapter is None
    assert problems == ["every layer, model.block: OneNormParallelBlock is not the Pre-Norm Block (no Hugging Face "
                        "architecture adapter reads it; one that does is registered with "
                        "scalevec_lit.arch.register); use Block, or export the native format (--format native: "
                        "our state dict + spec, reloadable with build_from_spec)"]


def test_chosen_from_yaml_and_refused_with_moe():
    text = print_config("--config", recipe("smoke.yaml"), "--config", recipe("examples", "parallel_one_norm.yaml"),
                        "--config", recipe("strategy", "hg.yaml"))
    module = module_from_config(text)
    module.configure_model()
    assert all(type(b) is OneNormParallelBlock for b in module.model.blocks)
    assert (ROOT / "recipes" / "examples" / "parallel_one_norm.yaml").is_file()
    with pytest.raises(ValueError, match=r"OneNormParallelBlock has a dense MLP only, but model\.config\.moe is set"):
        Transformer(tiny_config(**CFG, moe=MoEConfig(num_experts=4, top_k=2, expert_intermediate_size=16)),
                    block=OneNormParallelBlock)
