"""Rotary position embedding (rotate-half convention, as Llama/Qwen checkpoints in transformers).

Plain torch only.
"""
from __future__ import annotations

import torch

from ..scale.ops import apply_rope  # noqa: F401  (one RoPE for the model and the fused q/k path)


def rope_tables(seq_len: int, head_dim: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, each ``[seq_len, head_dim]`` in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    t = torch.arange(seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
