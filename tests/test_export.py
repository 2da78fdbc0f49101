"""Export: folded models loaded with transformers give our logits and our greedy tokens; refusals by site.

Every exportable strategy preset is built tiny, its scale parameters perturbed at random (so that folding
is not the identity), exported, and loaded with ``AutoModelForCausalLM``: logits within 1e-4 relative
(max |ours - theirs| / max |ours|) and the same 20 greedy tokens (``tests/export_models.py``). The formats,
sharding and checkpoint forms: ``tests/test_export_files.py``.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from export_models import assert_same_model, make_model, preset_spec, print_max_rel_diff
from scalevec_lit.export import HFExportError, save_hf
from scalevec_lit.model.spec import build_from_spec

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print_max_rel_diff()


# -- every exportable preset ------------------------------------------------------------------------------
EXPORTABLE = [
    ("baseline", {}, "LlamaForCausalLM"),
    ("no_scale", {}, "LlamaForCausalLM"),
    ("unit_offset", {}, "LlamaForCausalLM"),
    ("hg", {}, "LlamaForCausalLM"),
    ("dp", {}, "LlamaForCausalLM"),
    ("or", {}, "LlamaForCausalLM"),
    ("er", {}, "LlamaForCausalLM"),
    ("qk_norm", {}, "Qwen3ForCausalLM"),
    ("dnp", {"output_shape": "head"}, "Qwen3ForCausalLM"),
    ("unified", {"output_shape": "head"}, "Qwen3ForCausalLM"),
]


@pytest.mark.parametrize("preset,strategy,arch", EXPORTABLE, ids=[e[0] + "-head" * bool(e[1]) for e in EXPORTABLE])
def test_preset_export_matches_transformers(preset, strategy, arch, tmp_path):
    model = make_model(preset, strategy)
    result = save_hf(model, tmp_path)
    assert result.architecture == arch
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [arch]
    hf = assert_same_model(model, tmp_path, f"{preset}{'-head' if strategy else ''}")
    assert type(hf).__name__ == arch
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "model.safetensors")
    norms = [k for k in tensors if k.endswith("layernorm.weight") or k == "model.norm.weight"]
    assert norms and all(torch.equal(tensors[k], torch.ones_like(tensors[k])) for k in norms)  # all folded away
    if preset != "no_scale":  # folding changed the maps: the scales were not the identity
        assert not torch.equal(tensors["model.layers.0.self_attn.q_proj.weight"], model.blocks[0].attn.input.weight("q"))
    if arch == "Qwen3ForCausalLM":
        assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (model.config.head_dim,)
        assert not torch.equal(tensors["model.layers.0.self_attn.k_norm.weight"], torch.ones(model.config.head_dim))


def test_channel_output_scale_equal_across_heads_exports_as_qwen3(tmp_path):
    """A full-width ('channel') u on q/k whose heads agree fits Qwen3's per-head-dim weight."""
    model = make_model("dnp", heads_equal=True)
    assert model.blocks[0].attn.input.proj["q"].out_scale.scale.numel() == model.config.n_head * model.config.head_dim
    assert save_hf(model, tmp_path).architecture == "Qwen3ForCausalLM"
    assert_same_model(model, tmp_path, "dnp-channel-equal-heads")


@pytest.mark.parametrize(
    "preset,strategy,config,tied",
    [
        ("qk_norm", {"eps": 1e-2}, dict(n_kv_head=1, head_dim=24, rope_theta=500.0, n_layer=3), False),
        ("baseline", {"eps": 1e-3, "final_norm": False}, dict(tie_embeddings=True, rope_theta=1e6), True),
        ("hg", {}, dict(tie_embeddings=True, intermediate_size=96), False),  # folding the final γ unties
    ],
    ids=["qwen3-gqa1-headdim24-eps1e-2-theta500", "llama-tied-nofinal-eps1e-3", "llama-tied-untied-by-fold"],
)
def test_shapes_eps_theta_and_tying_reach_the_config(preset, strategy, config, tied, tmp_path):
    model = make_model(preset, strategy, **config)
    save_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    c, s = model.config, model.strategy
    assert cfg["rms_norm_eps"] == s.eps and cfg["rope_theta"] == c.rope_theta
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": c.rope_theta}
    assert (cfg["head_dim"], cfg["num_key_value_heads"], cfg["num_attention_heads"]) == (c.head_dim, c.n_kv_head, c.n_head)
    assert (cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]) == (
        c.intermediate_size, c.vocab_size, c.seq_len)
    assert cfg["tie_word_embeddings"] is tied
    from safetensors.torch import load_file

    assert ("lm_head.weight" in load_file(tmp_path / "model.safetensors")) is not tied
    assert_same_model(model, tmp_path, f"{preset}-{'tied' if tied else 'untied'}-eps{s.eps:g}")


# -- MoE ---------------------------------------------------------------------------------------------------
EXPERT_PLACEMENTS = {"q": "dual", "k": "dual", "v": "dual", "gate": "dual", "up": "dual", "router": "dual"}
MOE_EXPORTABLE = [  # (id, preset, strategy, moe, config, architecture)
    ("qk_norm-softmax", "qk_norm", {}, {}, {}, "Qwen3MoeForCausalLM"),
    ("unified-head-expert-scales-dense-first", "unified", {"output_shape": "head", "branch_specific": False},
     {"scales": "expert", "first_dense_layers": 1, "route_norm": False}, {"n_layer": 3}, "Qwen3MoeForCausalLM"),
    ("baseline-softmax", "baseline", {}, {}, {}, "MixtralForCausalLM"),
    ("dp-router-dual-shared-scale", "dp", {"placement": EXPERT_PLACEMENTS}, {"scales": "shared"}, {},
     "MixtralForCausalLM"),
    ("hg-sigmoid-bias-shared-dense-first", "hg", {},
     {"router": "sigmoid", "bias_balancing": True, "num_shared_experts": 1, "first_dense_layers": 1,
      "route_norm": False}, {"n_layer": 3}, "Glm4MoeForCausalLM"),
    ("unified-head-sigmoid-bias-2shared", "unified", {"output_shape": "head"},
     {"router": "sigmoid", "bias_balancing": True, "num_shared_experts": 2}, {}, "Glm4MoeForCausalLM"),
    ("baseline-sigmoid-no-shared", "baseline", {}, {"router": "sigmoid"}, {}, "Glm4MoeForCausalLM"),
]


@pytest.mark.parametrize("name,preset,strategy,moe,config,arch", MOE_EXPORTABLE, ids=[e[0] for e in MOE_EXPORTABLE])
def test_moe_export_matches_transformers(name, preset, strategy, moe, config, arch, tmp_path):
    model = make_model(preset, strategy, moe=moe, **config)
    assert save_hf(model, tmp_path).architecture == arch
    hf = assert_same_model(model, tmp_path, f"moe-{name}")
    assert type(hf).__name__ == arch
    cfg = json.loads((tmp_path / "config.json").read_text())
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    assert (experts, cfg["num_experts_per_tok"]) == (model.config.moe.num_experts, model.config.moe.top_k)


MOE_REFUSED = [
    ("softmax-shared-bias-dense-route_norm", "baseline", {},
     {"num_shared_experts": 1, "bias_balancing": True, "first_dense_layers": 1, "route_norm": False},
     ["shared experts (model.config.moe.num_shared_experts > 0)", "bias_balancing: true", "router: sigmoid",
      "first_dense_layers: 0", "route_norm: false", "Qwen3-MoE holds it", "--format native"]),
    ("router-dnp", "baseline", {"placement": {"router": "dual_norm"}}, {},
     ["mlp_proj.router", "placement.router: 'dual_norm'"]),
    ("expert-gate-dnp", "baseline", {"placement": {"gate": "dual_norm"}}, {},
     ["mlp_proj.expert*_gate", "placement.gate: 'dual_norm'"]),
]


@pytest.mark.parametrize("name,preset,strategy,moe,words", MOE_REFUSED, ids=[e[0] for e in MOE_REFUSED])
def test_moe_without_a_standard_equivalent_is_refused_by_site(name, preset, strategy, moe, words, tmp_path):
    model = make_model(preset, strategy, moe=moe, n_layer=3)
    with pytest.raises(HFExportError) as info:
        save_hf(model, tmp_path / "out")
    for word in words:
        assert word in str(info.value), f"{word!r} not in: {info.value}"


# -- refusals ---------------------------------------------------------------------------------------------
REFUSED = [
    ("dnp", {}, ["attn_proj.q", "attn_proj.k", "output_shape: 'channel'", "differs between heads",
                 "output_shape: head", "--format native"]),
    ("unified", {}, ["attn_proj.q", "output_shape: head", "--format native"]),
    ("sandwich", {}, ["attn_output", "mlp_output", "sublayer_output_norm: true", "--format native"]),
    ("baseline", {"placement": {"v": "dual_norm"}}, ["attn_proj.v", "placement.v: 'dual_norm'", "--format native"]),
    ("baseline", {"placement": {"gate": "dual_norm"}}, ["mlp_proj.gate", "placement.gate: 'dual_norm'"]),
    ("baseline", {"placement": {"up": "dual_norm"}}, ["mlp_proj.up", "placement.up: 'dual_norm'"]),
    ("baseline", {"placement": {"q": "dual_norm"}}, ["attn_proj.k", "placement.k: 'input'", "both to dual_norm"]),
]


@pytest.mark.parametrize("preset,strategy,words", REFUSED, ids=lambda v: v if isinstance(v, str) else None)
def test_strategies_without_a_standard_equivalent_are_refused_by_site(preset, strategy, words, tmp_path):
    model = make_model(preset, strategy)
    out = tmp_path / "out"
    with pytest.raises(HFExportError) as info:
        save_hf(model, out)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in: {message}"
    assert "every layer" in message
    assert not out.exists()  # refused before writing anything


def test_custom_block_is_refused_by_name(tmp_path):
    spec = preset_spec("baseline")
    spec["block"] = {"class_path": "scalevec_lit.model.block.ParallelBlock"}
    with pytest.raises(HFExportError, match=r"ParallelBlock is not the Pre-Norm Block.*--format native"):
        save_hf(build_from_spec(spec), tmp_path / "out")
