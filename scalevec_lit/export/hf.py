"""The Hugging Face layout of a folded model: the weight names and ``config.json`` of ``LlamaForCausalLM``,
``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``, ``MixtralForCausalLM`` or ``Glm4MoeForCausalLM``
(``hf_layout``); the architecture is chosen, or the model refused, by ``hf_plan.plan_hf``. The weight names
come from ``hf_names`` (one table, also read by import, ``scalevec_lit/hub/hf_import.py``).

Plain torch: must not import Lightning or transformers, nor the write / cli modules of this package.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..model.transformer import Transformer
from ..scale.fold import fold_scales
from .errors import HFExportError
from .hf_names import ARCHITECTURES, Ref, hf_names, native_tensor, site_of
from .hf_plan import head_norm_weight, plan_hf

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class HFLayout:
    architecture: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(repr=False)


def _own(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor with its own storage (safetensors refuses views sharing memory)."""
    t = t.detach().to(dtype)
    return t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t.contiguous()


def _export_tensor(model: Transformer, ref: Ref) -> torch.Tensor:
    """What export writes for one row of the name table: our folded norms are bare RMS (HF norm weight of
    ones); a QK-norm weight is the per-head u; Glm4-MoE always has a selection bias and a shared MLP
    (zeros / zero width when we have none)."""
    d = model.config.n_embd
    if ref.kind == "norm":
        return torch.ones(d)
    if ref.kind == "head_norm":
        return head_norm_weight(site_of(model, ref), ref.branch, model.config.head_dim)[0]
    t = native_tensor(model, ref)
    if t is None and ref.kind == "expert_bias":
        return torch.zeros(model.blocks[ref.layer].mlp.num_experts)
    if t is None:
        return torch.zeros(d, 0) if ref.kind == "shared_down" else torch.zeros(0, d)
    return t


def hf_layout(model: Transformer, eos_id: Optional[int] = None, dtype: torch.dtype = torch.float32) -> HFLayout:
    """Fold ``model`` (a copy) and map it to the weight names and config of a transformers architecture."""
    folded = fold_scales(model).eval()
    arch, problems = plan_hf(folded)
    if arch is None:
        raise HFExportError("cannot export to a standard transformers architecture:\n  - " + "\n  - ".join(problems))
    model_type = ARCHITECTURES[arch][0]
    c, s, d = folded.config, folded.strategy, folded.config.n_embd
    qk_norm = folded.blocks[0].attn.input.normalizes("q")
    t = {name: _export_tensor(folded, ref) for name, ref in hf_names(folded, arch, qk_norm)}  # the shared table
    tied = folded.tied
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
