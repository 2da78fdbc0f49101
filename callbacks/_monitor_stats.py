"""What the monitor computes from the registry's scale vectors, once gathered: effective γ, the
parameterization's conserved quantity (the preconditioner drift), the heatmap panels (layers × sites), and
the scale parameters the loss cannot see (``invisible_scales``)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from scalevec_lit.scale.sites import INPUT, Consumer, layer_label
from scalevec_lit.scale.vector import ScaleVector

from ._monitor_reduce import _is_dtensor, full_tensor, tensor_statistics

STATS = ("mean", "std", "min", "max")

#: a scale parameter whose largest |gradient| is at most this fraction of the largest among all scale
#: parameters is reported as invisible to the loss (a β in front of a per-head norm measures ~3e-6 of it on a
#: tiny model, eps's trace; the smallest real one ~7e-4)
INVISIBLE_GRAD = 1e-4
#: optimizer steps after the first at which a scale parameter without gradient is looked at again before it
#: is reported: a parameter can have none at the start only (γ = 1 + U·v with v = 0 gives U its first gradient
#: at the second step, once v has moved)
RECHECK_STEPS = 2


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


#: a channel is "near zero" when |γ_j| is below this fraction of RMS(γ) (relative, so that the share does not
#: depend on γ's overall size)
NEAR_ZERO = 0.05


@torch.no_grad()
def gamma_summary(gamma: torch.Tensor) -> dict[str, float]:
    """The statistics of one effective γ: the monitor's ``STATS`` (mean, population std, min, max) and its shape:
    ``rms`` = √mean γ², ``anisotropy`` = std(|γ|) / RMS(γ) (0 when every channel has the same size, toward 1
    when a few channels hold all of it), ``near_zero`` = the share of channels with |γ_j| < ``NEAR_ZERO``·RMS(γ)."""
    g = full_tensor(gamma).detach().double().reshape(-1).cpu()
    row = dict(zip(STATS, tensor_statistics([g])[0].tolist()))
    rms = float(g.square().mean().sqrt())
    size = g.abs()
    row["rms"] = rms
    row["anisotropy"] = float(size.std(unbiased=False) / rms) if rms > 0 else 0.0
    row["near_zero"] = float((size < NEAR_ZERO * rms).double().mean()) if rms > 0 else 1.0
    return row


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


@torch.no_grad()
def invisible_scales(params: list) -> list[str]:
    """Names of the scale parameters (``ScaleParam``) whose gradient is zero or within ``INVISIBLE_GRAD`` of
    the largest scale gradient: the function does not depend on them (an invariance), so decay alone moves
    them. Parameters without a gradient are left out; nothing is reported when every gradient is 0.
    Collective under FSDP2 (one gather of the gradients' statistics)."""
    with_grad = [sp for sp in params if sp.param.grad is not None]
    if not with_grad:
        return []
    st = tensor_statistics([sp.param.grad for sp in with_grad])
    peak = torch.maximum(st[:, 2].abs(), st[:, 3].abs())
    top = float(peak.max())
    if not top > 0.0:
        return []
    return [sp.name for sp, g in zip(with_grad, peak.tolist()) if g <= INVISIBLE_GRAD * top]


def size_divided_out(sp) -> bool:
    """True when the strategy itself makes ``sp`` (a ``ScaleParam``) invisible to the loss: it is the magnitude
    part (γ's size, ``ScaleVector.parts``) of a vector that has a separate magnitude (``without_magnitude()``)
    and whose every consumer branch normalizes its output (``dual_norm``: the per-head RMS divides γ's size
    out; ``ScaleStrategy.magnitude_before_norm``). Any other parameter without gradient has no invariance the
    strategy names."""
    if sp.info.part != "magnitude" or sp.vector.without_magnitude() is None:
        return False
    divides = getattr(sp.site, "divides_size_out", None)  # the site answers (scale/keeps.py)
    return bool(divides is not None and divides(sp.vector))


# -- the effective step of the merged columns (issue 27, item 2) --------------------------------------------
def _per_channel(t: torch.Tensor, n: int) -> torch.Tensor:
    """A per-slice quantity of a consumer (``t``, one entry per slice along γ's axis) summed onto γ's ``n``
    channels: equal sizes as they are; a head-shaped γ (one per head dimension, shared by the heads) takes
    the sum over heads (slice i is channel i mod n)."""
    return t if t.numel() == n else t.view(-1, n).sum(0)


def _merged(w: torch.Tensor, axis: int, gamma: torch.Tensor) -> torch.Tensor:
    """``w`` with γ applied along ``axis`` (repeated over heads for a head-shaped γ), float64, whole."""
    w = full_tensor(w).detach().double()
    axis = axis % w.ndim
    g = gamma.to(device=w.device, dtype=torch.float64)
    if w.shape[axis] != g.numel():
        g = g.repeat(w.shape[axis] // g.numel())
    shape = [1] * w.ndim
    shape[axis] = -1
    return w * g.view(shape)


@torch.no_grad()
def snapshot_columns(gamma: torch.Tensor,
                     consumers: list[Consumer]) -> tuple[torch.Tensor, list[tuple[torch.Tensor, int]]]:
    """What ``column_steps`` needs of the step before: γ and a copy of each consumer weight (shards stay
    shards) with its axis."""
    return gamma.detach().clone(), [(c.weight.detach().clone(), c.axis) for c in consumers]


@torch.no_grad()
def column_steps(before: tuple[torch.Tensor, list[tuple[torch.Tensor, int]]], gamma: torch.Tensor,
                 consumers: list[Consumer]) -> Optional[torch.Tensor]:
    """Per channel j of γ: ``‖Δw̃_j‖ / ‖w̃_j‖``, the size of one optimizer step of the merged column
    ``w̃_j = γ_j w_j`` (all consumers' slices along γ's axis together, as folding would merge them) relative
    to its size before the step; float64 on the CPU. None when the consumers changed (shapes differ)."""
    gamma0, weights0 = before
    if len(weights0) != len(consumers) or gamma0.shape != gamma.shape:
        return None
    n = gamma.numel()
    num = torch.zeros(n, dtype=torch.float64)
    den = torch.zeros(n, dtype=torch.float64)
    for (w0, axis), c in zip(weights0, consumers):
        if w0.shape != c.weight.shape or axis != c.axis:
            return None
        old, new = _merged(w0, axis, gamma0), _merged(c.weight, axis, gamma)
        dims = [d for d in range(old.ndim) if d != axis % old.ndim]
        num += _per_channel((new - old).square().sum(dims).cpu(), n)
        den += _per_channel(old.square().sum(dims).cpu(), n)
    return num.sqrt() / den.sqrt().clamp_min(1e-300)
