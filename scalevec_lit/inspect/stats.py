"""The numbers ``inspect`` reports for each scale vector, computed as ``ScaleVectorMonitor`` computes them
(``scalevec_lit.callbacks._monitor_stats``): the effective γ (``effective_gamma``), its statistics
(``gamma_summary``: mean, RMS, std, min, max, anisotropy, share near zero), and for input-role vectors whose
consumers the registry names the parameterization's conserved quantity (``conserved_quantity``: for a plain
γ ``c_j = ‖w_j‖² − γ_j²`` per channel over the consuming columns, ``Σ_j ‖w_j‖² − β²`` for a
magnitude-direction γ), all in float64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from scalevec_lit.callbacks._monitor_reduce import consumer_sq_norms
from scalevec_lit.callbacks._monitor_stats import conserved_quantity, effective_gamma, gamma_summary
from scalevec_lit.scale.sites import INPUT

from .sites_view import VectorView, scale_vectors

#: the statistics of γ in the order tables, CSV and JSON show them
STAT_NAMES = ("mean", "rms", "std", "min", "max", "anisotropy", "near_zero")


@dataclass
class Row:
    """One scale vector with its numbers."""

    view: VectorView
    gamma: torch.Tensor  # float64, CPU
    stats: dict[str, float]
    conserved: Optional[torch.Tensor]  # float64: per channel, or one number; None: see ``conserved_note``
    conserved_note: str

    @property
    def conserved_summary(self) -> dict[str, Optional[float]]:
        """``c_mean``, ``c_min`` and ``c_max`` of the conserved quantity (each None when there is none)."""
        c = self.conserved
        if c is None:
            return {"c_mean": None, "c_min": None, "c_max": None}
        return {"c_mean": float(c.mean()), "c_min": float(c.min()), "c_max": float(c.max())}


def _law(view: VectorView, c: Optional[torch.Tensor]) -> str:
    if view.role != INPUT:
        return "output role: no linear map absorbs it, no conservation law with a map"
    if not view.consumers:
        return "the registry names no consumer columns (as in the monitor): not computed"
    if c is None:
        return f"{view.parameterization} conserves nothing that involves its consumers"
    if c.numel() == 1 and view.vector.dim > 1:
        return "one number Σ_j ‖w_j‖² − (magnitude term) over the consuming columns"
    return "‖w_j‖² − γ_j² per channel j over the consuming columns"


@torch.no_grad()
def rows_of(model: nn.Module) -> list[Row]:
    """Every scale vector of ``model`` with its statistics and conserved quantity."""
    views = scale_vectors(model)
    with_consumers = [v for v in views if v.role == INPUT and v.consumers]
    norms = dict(zip(map(id, with_consumers), consumer_sq_norms([v.consumers for v in with_consumers])))
    rows = []
    for view in views:
        gamma = effective_gamma(view.vector).double().cpu().reshape(-1)
        c = None
        if id(view) in norms:
            c = conserved_quantity(view.vector, gamma, view.consumers, norms[id(view)])
            c = None if c is None else c.double().reshape(-1)
        rows.append(Row(view, gamma, gamma_summary(gamma), c, _law(view, c)))
    return rows
