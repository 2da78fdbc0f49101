"""``Qwen3ForCausalLM``: dense with QK-norm (DNP on q and k, one u of size head_dim shared by the heads)."""
from __future__ import annotations

from typing import Any

from . import register
from .base import HFArchitecture


@register
class Qwen3(HFArchitecture):
    architecture, model_type, title, priority = "Qwen3ForCausalLM", "qwen3", "Qwen3", 20
    qk_norm = True

    def config_extra(self, model, qk_norm: bool) -> dict[str, Any]:
        n = model.config.n_layer
        return {"use_sliding_window": False, "sliding_window": None, "max_window_layers": n,
                "layer_types": ["full_attention"] * n}
