"""``Qwen3MoeForCausalLM``: softmax-routed MoE with Qwen3's QK-norm; dense first layers (``mlp_only_layers``)
and unnormalized top-k weights (``norm_topk_prob: false``) are held; no shared experts, no selection bias."""
from __future__ import annotations

from typing import Any, Optional

from ..model.config import MoEConfig
from . import register
from .base import UNSUPPORTED, refuse
from .qwen3 import Qwen3


@register
class Qwen3Moe(Qwen3):
    architecture, model_type, title, priority = "Qwen3MoeForCausalLM", "qwen3_moe", "Qwen3-MoE", 30
    moe, router, dense_first_layers, unnormalized_routing = True, "softmax", True, True

    def config_extra(self, model, qk_norm: bool) -> dict[str, Any]:
        moe = model.config.moe
        return {**super().config_extra(model, qk_norm), "num_experts": moe.num_experts, "num_experts_per_tok": moe.top_k,
                "moe_intermediate_size": moe.expert_intermediate_size, "norm_topk_prob": moe.route_norm,
                "decoder_sparse_step": 1, "mlp_only_layers": list(range(moe.first_dense_layers)),
                "output_router_logits": False, "router_aux_loss_coef": moe.aux_loss_coef}

    def moe_from_hf(self, cfg: dict[str, Any], where: str) -> Optional[MoEConfig]:
        dense = list(cfg.get("mlp_only_layers") or [])
        if int(cfg.get("decoder_sparse_step", 1)) != 1:
            raise refuse(where, "decoder_sparse_step", cfg["decoder_sparse_step"], f"{UNSUPPORTED} (MoE layers are "
                         "every layer after the first dense ones)", "only 1 can be imported")
        if dense != list(range(len(dense))):
            raise refuse(where, "mlp_only_layers", dense, f"{UNSUPPORTED} (dense layers come first: "
                         "model.config.moe.first_dense_layers)", "only the first k layers may be dense")
        return MoEConfig(num_experts=int(cfg.get("num_experts") or cfg["num_local_experts"]),
                         top_k=int(cfg["num_experts_per_tok"]), expert_intermediate_size=int(cfg["moe_intermediate_size"]),
                         route_norm=bool(cfg.get("norm_topk_prob", False)), first_dense_layers=len(dense),
                         aux_loss_coef=float(cfg.get("router_aux_loss_coef", 0.001)), z_loss_coef=0.0)
