"""Transformer: embedding, blocks, final norm, LM head; initialization; parameter counts.

Plain torch only: must not import Lightning.

Initialization (``reset_parameters``), documented because results depend on it:
- embedding and every linear map: N(0, init_std²) (0.02, as GPT-2/Llama pre-training);
- the maps that write into the residual stream (W_o, W_down, expert down maps): N(0, init_std²/(2 L)),
  GPT-2's depth scaling, so the residual stream's variance does not grow with depth;
- scale vectors: their parameterization's own init (γ = 1 for every shipped one);
- a tied head shares the embedding's tensor (initialized once, as the embedding).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..scale.sites import BranchScales
from ..scale.strategy import ScaleStrategy
from .block import Block
from .config import TransformerConfig
from .rope import rope_tables

BlockFactory = Callable[[TransformerConfig, int, ScaleStrategy], Block]


class Transformer(nn.Module):
    """A decoder-only language model whose every norm is built through a ``ScaleStrategy``.

    Args:
        config: the shape.
        strategy: the scale-vector strategy (default: the standard one γ per norm).
        block: the block class (or any callable ``(config, layer, strategy) -> nn.Module``).
    """

    def __init__(
        self,
        config: TransformerConfig,
        strategy: Optional[ScaleStrategy] = None,
        block: BlockFactory = Block,
    ) -> None:
        super().__init__()
        self.config = config
        self.strategy = strategy = strategy or ScaleStrategy()
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(block(config, i, strategy) for i in range(config.n_layer))
        self.norm = BranchScales(
            config.n_embd, ("head",), strategy, layer=-1, site="final", enabled=strategy.final_norm
        )
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rope_tables(config.seq_len, config.head_dim, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if self.embed.weight.device.type != "meta":
            self.reset_parameters()

    def residual_out_projections(self) -> list[nn.Linear]:
        """Maps that write into the residual stream (depth-scaled init)."""
        out = []
        for module in self.modules():
            for name in ("o", "down"):
                child = getattr(module, name, None)
                if isinstance(child, nn.Linear):
                    out.append(child)
            if hasattr(module, "expert_down"):
                out.append(module.expert_down)
        return out

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """(Re-)initialize every parameter and buffer; also what runs after meta-device construction."""
        std = self.config.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, 0.0, std)
            elif module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        depth_std = std / math.sqrt(2 * self.config.n_layer)
        for lin in self.residual_out_projections():
            weight = lin.weight if isinstance(lin, nn.Linear) else lin
            nn.init.normal_(weight, 0.0, depth_std)
        cos, sin = rope_tables(self.config.seq_len, self.config.head_dim, self.config.rope_theta, self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` → logits ``[B, T, vocab]``."""
        if idx.shape[1] > self.config.seq_len:
            raise ValueError(
                f"input length {idx.shape[1]} exceeds model.config.seq_len={self.config.seq_len}"
            )
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        (x,) = self.norm(x)
        return self.head(x)

    def aux_losses(self) -> dict[str, torch.Tensor]:
        """Auxiliary losses collected during the last forward (MoE balancing); empty for dense models."""
        total: dict[str, torch.Tensor] = {}
        for module in self.modules():
            losses = getattr(module, "last_aux_losses", None)
            if losses:
                for k, v in losses.items():
                    total[k] = total[k] + v if k in total else v
        return total


@dataclass(frozen=True)
class ParameterCount:
    total: int
    embedding: int
    scale: int  # scale-vector parameters
    active: int  # parameters used per token (MoE: top-k of the routed experts)

    @property
    def active_non_embedding(self) -> int:
        return self.active - self.embedding

    @property
    def scale_share(self) -> float:
        return self.scale / max(1, self.total)

    def summary(self) -> str:
        line = f"parameters: {self.total:,} total"
        if self.active != self.total:
            line += f", {self.active:,} active per token"
        return line + f", {self.scale:,} in scale vectors ({100 * self.scale_share:.4f}%)"


def count_parameters(
    config_or_model, strategy: Optional[ScaleStrategy] = None, block: BlockFactory = Block
) -> ParameterCount:
    """Count parameters; from a config the model is built on the meta device (nothing allocated)."""
    from ..scale.registry import scale_parameters

    if isinstance(config_or_model, nn.Module):
        model = config_or_model
    else:
        with torch.device("meta"):
            model = Transformer(config_or_model, strategy, block)
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() already skips a tied head's second reference
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    embedding = model.embed.weight.numel()
    scale = sum(sp.param.numel() for sp in scale_parameters(model))
    inactive = 0
    for module in model.modules():
        inactive += getattr(module, "inactive_parameters_per_token", lambda: 0)()
    return ParameterCount(total=total, embedding=embedding, scale=scale, active=total - inactive)
