"""The Hugging Face layout of a folded model: the weight names and ``config.json`` of ``LlamaForCausalLM``,
``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``, ``MixtralForCausalLM`` or ``Glm4MoeForCausalLM``
(``hf_layout``); the architecture is chosen, or the model refused, by ``hf_plan.plan_hf``.

Plain torch: must not import Lightning or transformers, nor the write / cli modules of this package.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..model.mlp import SwiGLU
from ..model.transformer import Transformer
from ..scale.fold import fold_scales
from .errors import HFExportError
from .hf_plan import head_norm_weight, plan_hf

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: architecture -> (model_type, MLP prefix of an MoE layer, expert weight names gate/up/down)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", None, None),
    "Qwen3ForCausalLM": ("qwen3", None, None),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "MixtralForCausalLM": ("mixtral", "block_sparse_moe", ("w1", "w3", "w2")),
    "Glm4MoeForCausalLM": ("glm4_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
}


@dataclass
class HFLayout:
    architecture: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(repr=False)


def _own(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor with its own storage (safetensors refuses views sharing memory)."""
    t = t.detach().to(dtype)
    return t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t.contiguous()


def hf_layout(model: Transformer, eos_id: Optional[int] = None, dtype: torch.dtype = torch.float32) -> HFLayout:
    """Fold ``model`` (a copy) and map it to the weight names and config of a transformers architecture."""
    folded = fold_scales(model).eval()
    arch, problems = plan_hf(folded)
    if arch is None:
        raise HFExportError("cannot export to a standard transformers architecture:\n  - " + "\n  - ".join(problems))
    model_type, moe_prefix, expert_names = ARCHITECTURES[arch]
    c, s, d = folded.config, folded.strategy, folded.config.n_embd
    qk_norm = folded.blocks[0].attn.input.normalizes("q")
    ones = lambda: torch.ones(d)  # noqa: E731  (our folded norms are bare RMS: HF norm weight of ones)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": folded.embed.weight}
    for i, block in enumerate(folded.blocks):
        a, m, p = block.attn, block.mlp, f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ones()
        for name in ("q", "k", "v"):
            t[p + f"self_attn.{name}_proj.weight"] = a.input.weight(name)
        t[p + "self_attn.o_proj.weight"] = a.o.weight
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = head_norm_weight(a.input, "q", a.head_dim)[0]
            t[p + "self_attn.k_norm.weight"] = head_norm_weight(a.input, "k", a.head_dim)[0]
        t[p + "post_attention_layernorm.weight"] = ones()
        if type(m) is SwiGLU:
            t[p + "mlp.gate_proj.weight"] = m.input.weight("gate")
            t[p + "mlp.up_proj.weight"] = m.input.weight("up")
            t[p + "mlp.down_proj.weight"] = m.down.weight
        else:  # MoE, in the per-expert layout of the hub checkpoints (transformers 5 fuses it on load)
            t[p + f"{moe_prefix}.gate.weight"] = m.input.weight("router")
            if arch == "Glm4MoeForCausalLM":
                bias = getattr(m, "expert_bias", None)
                t[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(m.num_experts) if bias is None else bias
                sh = m.shared_down is not None  # Glm4-MoE always has a shared MLP: zero width when we have none
                empty = torch.zeros(0, d)
                t[p + "mlp.shared_experts.gate_proj.weight"] = m.input.weight("shared_gate") if sh else empty
                t[p + "mlp.shared_experts.up_proj.weight"] = m.input.weight("shared_up") if sh else empty
                t[p + "mlp.shared_experts.down_proj.weight"] = m.shared_down.weight if sh else empty.T
            for e in range(m.num_experts):
                for name, w in zip(expert_names, (m.input.weight("gate"), m.input.weight("up"), m.expert_down)):
                    t[p + f"{moe_prefix}.experts.{e}.{name}.weight"] = w[e]
    t["model.norm.weight"] = ones()
    tied = folded.tied
    if not tied:
        t["lm_head.weight"] = folded.head_weight
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": d,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.seq_len,
        "rms_norm_eps": s.eps,
        "rope_theta": c.rope_theta,  # transformers < 5 reads this; 5.x reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": c.init_std,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "dtype": next(k for k, v in DTYPES.items() if v == dtype),
    }
    moe = c.moe
    if arch == "LlamaForCausalLM":
        config.update(mlp_bias=False, pretraining_tp=1)
    if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.n_layer,
                      layer_types=["full_attention"] * c.n_layer)
    if arch == "Qwen3MoeForCausalLM":
        config.update(num_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                      moe_intermediate_size=moe.expert_intermediate_size, norm_topk_prob=moe.route_norm,
                      decoder_sparse_step=1, mlp_only_layers=list(range(moe.first_dense_layers)),
                      output_router_logits=False, router_aux_loss_coef=moe.aux_loss_coef)
    if arch == "MixtralForCausalLM":
        config.update(num_local_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                      intermediate_size=moe.expert_intermediate_size, sliding_window=None,
                      output_router_logits=False, router_aux_loss_coef=moe.aux_loss_coef, router_jitter_noise=0.0)
    if arch == "Glm4MoeForCausalLM":
        config.update(n_routed_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                      moe_intermediate_size=moe.expert_intermediate_size, n_shared_experts=moe.num_shared_experts,
                      first_k_dense_replace=moe.first_dense_layers, norm_topk_prob=moe.route_norm,
                      routed_scaling_factor=1.0, n_group=1, topk_group=1, use_qk_norm=qk_norm, num_mtp_layers=0,
                      partial_rotary_factor=1.0, output_router_logits=False)
        config["rope_parameters"]["partial_rotary_factor"] = 1.0
    return HFLayout(arch, config, {k: _own(v, dtype) for k, v in t.items()})
