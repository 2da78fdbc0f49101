"""``LlamaForCausalLM``: dense, no QK-norm; every scale folds into the maps (the Llama layout of ``base``)."""
from __future__ import annotations

from typing import Any

from . import register
from .base import HFArchitecture


@register
class Llama(HFArchitecture):
    architecture, model_type, title, priority = "LlamaForCausalLM", "llama", "Llama", 10

    def config_extra(self, model, qk_norm: bool) -> dict[str, Any]:
        return {"mlp_bias": False, "pretraining_tp": 1}
