"""MoE routing: token-choice top-k (softmax or sigmoid scores, an optional balancing bias on the selection),
the grouping of the (token, expert) pairs by expert, and the balancing losses. Pure functions of the
router's logits, every shape fixed by N, k and E: no host read, nothing that depends on the data's values.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Routing:
    logits: torch.Tensor  # [N, E] router logits, fp32
    probs: torch.Tensor  # [N, E] routing distribution: softmax, or sigmoid scores normalized to sum 1
    experts: torch.Tensor  # [N, k] selected experts (chosen on scores + bias)
    weights: torch.Tensor  # [N, k] combine weights (scores of the selected experts, never the bias), fp32


def route(
    logits: torch.Tensor, top_k: int, score: str = "softmax", bias: Optional[torch.Tensor] = None,
    normalize: bool = True,
) -> Routing:
    """Token-choice top-k. ``bias`` (aux-loss-free balancing) shifts the selection only."""
    logits = logits.float()
    scores = logits.softmax(-1) if score == "softmax" else torch.sigmoid(logits)
    select = scores if bias is None else scores + bias.to(scores)
    experts = select.topk(top_k, dim=-1).indices
    weights = scores.gather(-1, experts)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-20)
    probs = scores if score == "softmax" else scores / scores.sum(-1, keepdim=True).clamp_min(1e-20)
    return Routing(logits, probs, experts, weights)


@dataclass
class Grouping:
    """The N·k (token, slot) pairs sorted by expert (stable: token order within an expert)."""

    order: torch.Tensor  # [N k] pair index (token · k + slot) of each sorted row
    token: torch.Tensor  # [N k] token of each sorted row
    inverse: torch.Tensor  # [N k] sorted row of each pair: rows[inverse] is back in (token, slot) order
    offsets: torch.Tensor  # [E] int32, where each expert's rows end (the grouped matmul's offs)
    counts: torch.Tensor  # [E] int64, rows per expert (its tokens: dropless, every pair is kept)


def group_by_expert(experts: torch.Tensor, num_experts: int) -> Grouping:
    """Group the pairs of ``experts`` [N, k] by expert, on the device.

    The counts come from the sorted expert ids (a binary search for each expert's end), not from
    ``torch.bincount``, whose output size depends on the values (a host sync on a GPU, a graph break
    under ``torch.compile``); equal to ``bincount(experts.flatten(), minlength=E)`` for ids in [0, E).
    """
    k = experts.shape[-1]
    flat = experts.flatten()
    sorted_ids, order = flat.sort(stable=True)
    ids = torch.arange(num_experts, device=flat.device, dtype=flat.dtype)
    ends = torch.searchsorted(sorted_ids, ids, right=True)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return Grouping(order, order // k, inverse, ends.to(torch.int32), counts)


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Switch/GShard balance loss ``E Σ_i f_i P_i`` (1 at a uniform load, up to E/k when collapsed).

    ``f_i`` = share of the N·k (token, expert) assignments that went to expert i (no gradient),
    ``P_i`` = mean routing probability of expert i over the N tokens (the gradient path).
    """
    num_experts = probs.shape[-1]
    f = counts.to(probs.dtype) / counts.sum().clamp_min(1)
    return num_experts * (f * probs.mean(0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of ``logsumexp(logits)²``."""
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
