"""Rewrite a model's weights into another scale strategy, exactly where the math allows.

``transfer_(source, target)`` fills ``target`` (a freshly built model of the same shape with another
``ScaleStrategy``) from ``source`` so that both compute the same function wherever that is possible, and
returns a ``Transfer`` listing what could not be kept (``changes``; empty = the same function up to float
rounding) and what was done to keep it (``notes``). It pairs the scale sites by module name and reads and
writes only through them (``NormSite``: ``weight``, ``gamma``, ``output_scale``, ``normalizes``, ``key``,
its scale vectors), so the site stays the one place that knows placements. Per site, in the source:

- ``C_b``: the input-side factor on the columns of branch b's weight (γ of its scale group, times a
  per-expert γ_e for stacked expert weights), ``R_b``: an un-normalized output-side u on its rows,
  ``N_b``: the u after a normalization (DNP / QK-norm), which no linear map absorbs for q, k.
- In the target each scale group takes ``C_b`` when all its branches share the same one and the
  parameterization can hold it (``set_scale_``), else it is set to 1 and ``C_b`` is folded into the
  weights, ``W (γ ⊙ x̂) = (W diag γ) x̂``: branch-specific → shared, anything → ``no_scale``. An
  un-normalized u is kept the same way or folded into the rows. A normalized u is copied (head ↔ channel
  shape when the heads agree). Adding or removing a normalization (DNP on q/k of a model without
  QK-norm, a sublayer output norm) or changing ``eps`` changes the function: listed in ``changes``.

``set_scale_(vector, γ)`` inverts each shipped parameterization: PlainScale ``w = γ``; UnitOffsetScale
``w = γ − 1``; MagnitudeDirectionScale ``α = γ / RMS(γ)``, ``β = RMS(γ)·√(1 + ε)`` (the ε inside
``RMS(α) = √(mean α² + ε)``, 1e-12, is undone exactly; α carries the signs, β > 0); ExpMagnitude-
DirectionScale the same with ``b = ln β`` (refused for γ ≡ 0, where β = 0); DirectionScale ``α = γ`` for a γ
of unit RMS only (γ ≡ 1 included; any other is folded); NoScale only γ ≡ 1. Any other parameterization
is accepted when it reproduces γ after ``reset_parameters`` (γ ≡ 1), else folded.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from .sites import NormSite, OutputNorm, ScaleSite
from .strategy import has_input_side
from .vector import (DirectionScale, ExpMagnitudeDirectionScale, MagnitudeDirectionScale, PlainScale, ScaleVector,
                     UnitOffsetScale)

__all__ = ["Transfer", "set_scale_", "transfer_"]


@dataclass
class Transfer:
    changes: list[str] = field(default_factory=list)  # what changes the function (empty: exact)
    notes: list[str] = field(default_factory=list)  # what was folded or untied to keep it


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tol = 64 * torch.finfo(b.dtype).eps * max(1.0, float(b.abs().max()))
    return a.shape == b.shape and float((a.to(b) - b).abs().max()) <= tol


@torch.no_grad()
def set_scale_(vector: ScaleVector, gamma: torch.Tensor) -> bool:
    """Set ``vector``'s parameters so that ``vector() == gamma``; False (nothing changed) when it cannot."""
    gamma = gamma.detach()
    ones = torch.ones_like(gamma)
    if vector.is_identity:
        return torch.equal(gamma, ones)
    if isinstance(vector, (PlainScale, UnitOffsetScale)):
        vector.scale.copy_(gamma - (1.0 if isinstance(vector, UnitOffsetScale) else 0.0))
    elif isinstance(vector, (MagnitudeDirectionScale, ExpMagnitudeDirectionScale)):
        rms = float(gamma.double().pow(2).mean().sqrt())
        exp = isinstance(vector, ExpMagnitudeDirectionScale)
        if rms == 0.0 or not math.isfinite(rms):
            if exp or not math.isfinite(rms):
                return False  # exp(b) > 0: a zero γ has no magnitude b
            vector.magnitude.fill_(0.0)
            vector.direction.fill_(1.0)
            return True
        beta = rms * math.sqrt(1.0 + vector.eps)  # γ = β α / √(mean α² + ε) with mean α² = 1
        vector.direction.copy_(gamma / rms)
        vector.magnitude.fill_(math.log(beta) if exp else beta)
    elif isinstance(vector, DirectionScale):  # γ = α / RMS(α): only a γ of unit RMS
        before = vector.direction.detach().clone()
        vector.direction.copy_(gamma)
        if not _close(vector(), gamma):
            vector.direction.copy_(before)
            return False
        return True
    elif hasattr(vector, "reset_parameters"):
        before = [p.detach().clone() for p in vector.parameters()]
        vector.reset_parameters()
        if _close(vector(), ones) and torch.equal(gamma, ones):
            return True
        for p, old in zip(vector.parameters(), before):
            p.copy_(old)
        return False
    else:
        return False
    return _close(vector(), gamma)


def _set_or_ones(vector: ScaleVector, gamma: Optional[torch.Tensor], what: str, out: Transfer) -> bool:
    """Set ``gamma`` (``None``: ones); on failure set ones and return False."""
    ones = torch.ones(vector.dim)
    if gamma is not None and set_scale_(vector, gamma):
        return True
    if not set_scale_(vector, ones.to(gamma) if gamma is not None else ones):
        raise ValueError(f"{what}: {type(vector).__name__} cannot represent γ = 1; choose another model.strategy.vector")
    return gamma is None


def _columns(site: NormSite, b: str) -> Optional[torch.Tensor]:
    """Input-side factor on branch b's columns: ``[in]``, or ``[E, in]`` with per-expert scales."""
    g = site.gamma(b)
    g = None if g is None else g.detach()
    # per-expert γ_e reach an expert branch with an input side (as ``NormSite.expert_weight`` applies them)
    if site.by_name[b].experts and site.expert_scales is not None and has_input_side(site.placement[b]):
        per = torch.stack([v().detach() for v in site.expert_scales])
        g = per if g is None else per * g
    return g


def _full(site: NormSite, b: str, u: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    width = site.by_name[b].out_features
    return None if u is None else (u.detach() if u.numel() == width else u.detach().repeat(width // u.numel()))


def _shape_for(vector: ScaleVector, full: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``full`` u in the target vector's shape (channel, or one value per head dimension): (value, exact)."""
    if vector.dim == full.numel():
        return full, True
    heads = full.view(-1, vector.dim)
    return heads.mean(0), bool((heads == heads[0]).all())


@torch.no_grad()
def _transfer_site(s: NormSite, t: NormSite, name: str, out: Transfer) -> dict[str, torch.Tensor]:
    """New weights of ``t``'s branches; writes every scale vector of ``t``."""
    if [b.name for b in s.branches] != [b.name for b in t.branches]:
        raise ValueError(f"{name}: the sites have different branches ({list(s.by_name)} vs {list(t.by_name)})")
    if s.eps != t.eps:
        out.changes.append(f"{name}: eps {s.eps:g} → {t.eps:g} (model.strategy.eps) changes every normalization")
    cols = {b: _columns(s, b) for b in s.by_name}
    rows: dict[str, Optional[torch.Tensor]] = {}
    # input side: each target scale group keeps the common γ of its branches, or folds
    for key, vec in t.scales.items():
        members = [b for b in t.by_name if t.key[b] == key]
        first = cols[members[0]]
        same = first is not None and first.dim() == 1 and all(
            cols[b] is not None and cols[b].shape == first.shape and torch.equal(cols[b], first) for b in members)
        if same and _set_or_ones(vec, first, f"{name}.scales.{key}", out):
            for b in members:
                cols[b] = None
        elif not same:
            _set_or_ones(vec, None, f"{name}.scales.{key}", out)
    if t.expert_scales is not None:
        members = [b for b in t.by_name if t.by_name[b].experts and has_input_side(t.placement[b])]
        E = len(t.expert_scales)
        per = [cols[b].expand(E, -1) if cols[b] is not None and cols[b].dim() == 1 else cols[b] for b in members]
        same = bool(members) and all(p is not None for p in per) and all(torch.equal(p, per[0]) for p in per)
        ok = same and all(set_scale_(v, per[0][e]) for e, v in enumerate(t.expert_scales))
        if ok:
            for b in members:
                cols[b] = None
        else:
            for v in t.expert_scales:
                _set_or_ones(v, None, f"{name}.expert_scales", out)
    # output side
    for b, br in t.by_name.items():
        u_src, vec = _full(s, b, s.output_scale(b)), t.proj[b].out_scale
        norm_s, norm_t = s.normalizes(b), t.normalizes(b)
        if norm_s != norm_t:
            what = "adds" if norm_t else "removes"
            out.changes.append(f"{name}.{b}: {what} a normalization of the projection's output "
                               f"({t.placement_key(b)}; the source has {s.placement[b]!r})")
        if not norm_s:
            rows[b] = u_src
            if vec is not None and not norm_t:  # an un-normalized u (output / dual placement)
                want, exact = _shape_for(vec, u_src) if u_src is not None else (None, False)
                if _set_or_ones(vec, want if exact else None, f"{name}.{b}.out_scale", out) and exact:
                    rows[b] = None
            elif vec is not None:
                _set_or_ones(vec, None, f"{name}.{b}.out_scale", out)
            continue
        if vec is None or not norm_t:
            if vec is not None:
                _set_or_ones(vec, None, f"{name}.{b}.out_scale", out)
            continue
        want, exact = _shape_for(vec, u_src) if u_src is not None else (None, True)
        if not exact:
            out.changes.append(f"{name}.{b}: the output scale differs between heads and the target's is one value "
                               "per head dimension (model.strategy.output_shape: head); set output_shape: channel")
        if not _set_or_ones(vec, want, f"{name}.{b}.out_scale", out) and want is not None:
            out.changes.append(f"{name}.{b}: {type(vec).__name__} cannot hold the normalized output scale u")
    new = {}
    for b, br in t.by_name.items():
        w = s.weight(b).detach().clone()
        c, r = cols[b], rows.get(b)
        if c is not None:
            w.mul_(c[:, None, :] if c.dim() == 2 else c)
            out.notes.append(f"{name}.{b}: input scale folded into the weight")
        if r is not None:
            w.mul_(r[:, None] if w.dim() == 2 else r[None, :, None])
            out.notes.append(f"{name}.{b}: output scale folded into the weight's rows")
        new[b] = w
    return new


def _sites(model: nn.Module) -> dict[str, ScaleSite]:
    return {n: m for n, m in model.named_modules() if isinstance(m, ScaleSite)}


@torch.no_grad()
def transfer_(source: nn.Module, target: nn.Module) -> Transfer:
    """Fill ``target`` from ``source`` (same shape, any strategy): see the module docstring."""
    out = Transfer()
    s_sites, t_sites = _sites(source), _sites(target)
    prefixes = tuple(n + "." for n in t_sites)
    src = source.state_dict(keep_vars=True)
    outside: dict[int, str] = {}
    for key, tensor in target.state_dict(keep_vars=True).items():
        if key.startswith(prefixes):
            continue
        if key not in src or src[key].shape != tensor.shape:
            raise ValueError(f"{key}: the models differ outside their scale sites (a different shape or block)")
        tensor.copy_(src[key])
        outside[id(tensor)] = key
    for name in sorted(set(s_sites) | set(t_sites)):
        s, t = s_sites.get(name), t_sites.get(name)
        if s is None or t is None or isinstance(s, OutputNorm) != isinstance(t, OutputNorm):
            what = "adds" if s is None else "removes"
            out.changes.append(f"{name}: {what} a sublayer output norm (model.strategy.sublayer_output_norm)")
            if t is not None and isinstance(t, OutputNorm):
                _set_or_ones(t.scale, None, name, out)
            continue
        if isinstance(t, OutputNorm):
            if not set_scale_(t.scale, s.scale().detach()):
                out.changes.append(f"{name}: {type(t.scale).__name__} cannot hold the output norm's γ")
                _set_or_ones(t.scale, None, name, out)
            continue
        if not isinstance(t, NormSite):
            raise ValueError(f"{name}: {type(t).__name__} is a scale site the conversion does not know")
        for b, w in _transfer_site(s, t, name, out).items():
            param = t.proj[b].weight
            if id(param) in outside and not torch.equal(param, w):  # a tied head gets a weight of its own
                t.proj[b].weight = nn.Parameter(w, requires_grad=param.requires_grad)
                out.notes.append(f"{name}.{b}: untied from {outside[id(param)]} (its input scale was folded in)")
            elif id(param) not in outside:
                param.copy_(w)
    return out
