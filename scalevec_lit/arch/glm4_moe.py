"""``Glm4MoeForCausalLM``: sigmoid-routed MoE (QK-norm optional, ``use_qk_norm``) with the expert selection
bias (``mlp.gate.e_score_correction_bias``), shared experts (``mlp.shared_experts``) and dense first layers
(``first_k_dense_replace``). Its checkpoints always hold the bias and the shared MLP: a model without
them exports zeros / a zero-width shared MLP. Export only (``import`` does not read it yet)."""
from __future__ import annotations

from typing import Any

import torch

from .names import Ref, native_tensor
from . import register
from .base import HFArchitecture


@register
class Glm4Moe(HFArchitecture):
    architecture, model_type, title, priority = "Glm4MoeForCausalLM", "glm4_moe", "Glm4-MoE", 50
    importable = False
    moe, router, qk_norm = True, "sigmoid", None
    shared_experts = selection_bias = dense_first_layers = unnormalized_routing = True

    def moe_names(self, p: str, i: int, experts: int) -> list[tuple[str, Ref]]:
        router, *routed = super().moe_names(p, i, experts)
        return [router, (p + "mlp.gate.e_score_correction_bias", Ref("expert_bias", i)),
                (p + "mlp.shared_experts.gate_proj.weight", Ref("weight", i, "mlp", "shared_gate")),
                (p + "mlp.shared_experts.up_proj.weight", Ref("weight", i, "mlp", "shared_up")),
                (p + "mlp.shared_experts.down_proj.weight", Ref("shared_down", i))] + routed

    def export_tensor(self, model, ref: Ref) -> torch.Tensor:
        if ref.kind in ("expert_bias", "shared_down", "weight") and native_tensor(model, ref) is None:
            d = model.config.n_embd  # a model without the bias or the shared experts
            return {"expert_bias": torch.zeros(model.blocks[ref.layer].mlp.num_experts),
                    "shared_down": torch.zeros(d, 0), "weight": torch.zeros(0, d)}[ref.kind]
        return super().export_tensor(model, ref)

    def config_extra(self, model, qk_norm: bool) -> dict[str, Any]:
        c, moe = model.config, model.config.moe
        return {"n_routed_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "moe_intermediate_size": moe.expert_intermediate_size, "n_shared_experts": moe.num_shared_experts,
                "first_k_dense_replace": moe.first_dense_layers, "norm_topk_prob": moe.route_norm,
                "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "use_qk_norm": qk_norm,
                "num_mtp_layers": 0, "partial_rotary_factor": 1.0, "output_router_logits": False,
                "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta, "partial_rotary_factor": 1.0}}
