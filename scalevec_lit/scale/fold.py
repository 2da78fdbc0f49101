"""Fold input-role scales into their linear maps: same function, no input-role scale parameters left.

``fold_scales(model)`` returns a folded copy; every module that consumes scaled inputs implements
``fold_scales_()`` (attention, MLP, MoE), and the final norm folds into the LM head here. A tied head is
untied by folding (the embedding keeps its values, the head gets ``W diag γ``).

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .registry import scale_parameters
from .sites import INPUT


@torch.no_grad()
def fold_scales_(model: nn.Module) -> nn.Module:
    """Fold in place (see ``fold_scales``)."""
    for module in list(model.modules()):
        if module is not model and hasattr(module, "fold_scales_"):
            module.fold_scales_()
    norm, head = getattr(model, "norm", None), getattr(model, "head", None)
    if norm is not None and head is not None:
        gamma = norm.gamma("head")
        if gamma is not None:
            if head.weight is getattr(getattr(model, "embed", None), "weight", None):
                head.weight = nn.Parameter(head.weight.detach().clone())
                if hasattr(model, "config"):
                    model.config.tie_embeddings = False
            head.weight.mul_(gamma.to(head.weight)[None, :])
        norm.drop_scales_()
    left = [sp.name for sp in scale_parameters(model) if sp.info.role == INPUT]
    if left:
        raise RuntimeError(f"input-role scales left after folding (a site without fold_scales_?): {left}")
    return model


def fold_scales(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every input-role scale folded into its linear map.

    Output-role scales (QK-norm-like ``u`` on q/k, ``u`` on a normalized gate, sublayer output norms)
    stay as norm weights. The copy computes the same function up to float rounding.
    """
    return fold_scales_(copy.deepcopy(model))
