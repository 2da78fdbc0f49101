"""``MixtralForCausalLM``: softmax-routed MoE without QK-norm, every layer MoE, top-k weights always
normalized; its MoE MLP is ``block_sparse_moe`` with experts ``w1`` (gate), ``w3`` (up), ``w2`` (down)."""
from __future__ import annotations

from typing import Any, Optional

from ..model.config import MoEConfig
from . import register
from .base import HFArchitecture


@register
class Mixtral(HFArchitecture):
    architecture, model_type, title, priority = "MixtralForCausalLM", "mixtral", "Mixtral", 40
    moe, router = True, "softmax"
    moe_prefix, expert_names = "block_sparse_moe", ("w1", "w3", "w2")

    def config_extra(self, model, qk_norm: bool) -> dict[str, Any]:
        moe = model.config.moe
        return {"num_local_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "intermediate_size": moe.expert_intermediate_size, "sliding_window": None,
                "output_router_logits": False, "router_aux_loss_coef": moe.aux_loss_coef, "router_jitter_noise": 0.0}

    def import_checks(self, cfg: dict[str, Any]) -> list[tuple[str, Any, Any, str]]:
        return super().import_checks(cfg) + [("sliding_window", cfg.get("sliding_window"), None, "attention is full")]

    def moe_from_hf(self, cfg: dict[str, Any], where: str) -> Optional[MoEConfig]:
        return MoEConfig(num_experts=int(cfg["num_local_experts"]), top_k=int(cfg["num_experts_per_tok"]),
                         expert_intermediate_size=int(cfg["intermediate_size"]), route_norm=True,
                         aux_loss_coef=float(cfg.get("router_aux_loss_coef", 0.001)), z_loss_coef=0.0)
