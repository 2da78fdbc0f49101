"""Fold input-role scales into their linear maps: same function, no input-role scale parameters left.

``fold_scales(model)`` returns a folded copy. Folding is the sites' own work (``ScaleSite.fold_``): this
module only loops over them. A site whose normalized output side is absorbed by the next map (W_o after
v, W_down after up) was told that map when the model was built (``NormSite.absorbed_by``). A tied LM
head becomes untied (the embedding keeps its values).

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .registry import scale_parameters, scale_sites
from .sites import INPUT


@torch.no_grad()
def fold_scales_(model: nn.Module) -> nn.Module:
    """Fold in place (see ``fold_scales``)."""
    for site in list(scale_sites(model)):
        site.fold_()
    left = [sp.name for sp in scale_parameters(model) if sp.info.role == INPUT]
    if left:
        raise RuntimeError(f"input-role scales left after folding (a site without fold_?): {left}")
    return model


def fold_scales(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every input-role scale folded into its linear map.

    Output-role scales (QK-norm-like ``u`` on q/k, ``u`` on a normalized gate, sublayer output norms)
    stay as norm weights. The copy computes the same function up to float rounding.
    """
    return fold_scales_(copy.deepcopy(model))
