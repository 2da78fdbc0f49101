"""What the monitor computes from the registry's scale vectors, once gathered: effective γ, the
parameterization's conserved quantity (the preconditioner drift), and the heatmap panels (layers × sites)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from scalevec_lit.scale.sites import INPUT, Consumer, layer_label
from scalevec_lit.scale.vector import ScaleVector

from ._monitor_reduce import _is_dtensor, full_tensor

STATS = ("mean", "std", "min", "max")


@torch.no_grad()
def effective_gamma(vector: ScaleVector) -> torch.Tensor:
    """The full effective γ of a parameterization (gathering sharded parameters first)."""
    named = dict(vector.named_parameters())
    if not any(_is_dtensor(p) for p in named.values()):
        return vector().detach()
    full = {n: full_tensor(p).detach() for n, p in named.items()}
    return torch.func.functional_call(vector, full, ()).detach()


def same_values(vector: ScaleVector, param: torch.Tensor) -> bool:
    """True when γ is the parameter itself (``PlainScale``): its statistics are already logged."""
    try:
        return vector() is param
    except Exception:  # a parameterization that cannot run on sharded parameters: treat γ as derived
        return False


def conserved_quantity(vector: ScaleVector, gamma: torch.Tensor, consumers: list[Consumer],
               norms: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """The parameterization's conserved quantity (``ScaleVector.conserved``) from ``Σ_consumers ‖w_j‖²``;
    rows shared by a head-shaped γ are summed; None on a shape mismatch or without such a quantity."""
    total = torch.zeros_like(gamma)
    for c, n in zip(consumers, norms):
        n = n.cpu()
        if n.numel() != gamma.numel():
            if c.axis % c.weight.ndim == c.weight.ndim - 1 or n.numel() % gamma.numel():
                return None
            n = n.view(-1, gamma.numel()).sum(0)
        total += n
    parts = {name: full_tensor(p).detach().double().cpu() for name, p in vector.parts().items()}
    return vector.conserved(total, gamma, parts)


def heatmap_data(vectors, gstats, precond) -> dict[str, tuple[list[str], list[str], dict[str, np.ndarray]]]:
    out = {}
    for role in sorted({info.role for info, _, _ in vectors.values()}):
        items = [(vid, info) for vid, (info, _, _) in vectors.items() if info.role == role]
        layers = sorted({info.layer for _, info in items}, key=lambda l: (l < 0, l))
        rows = [layer_label(l) for l in layers]
        cols: list[str] = []
        for _, info in items:
            col = f"{info.site}/{info.branch}"
            if col not in cols:
                cols.append(col)
        names = list(STATS) + (["min γ²", "drift of ‖w‖²−γ², relative"] if role == INPUT and precond else [])
        panels = {n: np.full((len(rows), len(cols)), np.nan) for n in names}
        for vid, info in items:
            r, c = layers.index(info.layer), cols.index(f"{info.site}/{info.branch}")
            for n, v in zip(STATS, gstats[vid]):
                panels[n][r, c] = v
            if vid in precond and len(names) > 4:
                panels[names[4]][r, c] = precond[vid]["min_gamma_sq"]
                panels[names[5]][r, c] = precond[vid].get("drift_rel", np.nan)
        out[role] = (rows, cols, panels)
    return out
