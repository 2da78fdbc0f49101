"""Rewrite a model's weights into another scale strategy, exactly where the math allows.

``transfer_(source, target)`` fills ``target`` (a freshly built model of the same shape with another
``ScaleStrategy``) from ``source`` so that both compute the same function wherever that is possible, and
returns a ``Transfer`` listing what could not be kept (``changes``; empty = the same function up to float
rounding) and what was done to keep it (``notes``). It pairs the scale sites by module name and reads and
writes only through the site interface: ``NormSite.factors`` in the source, ``input_scales`` /
``output_vector`` in the target, every vector written through its inverse (``set_scale_``). Per site:

- ``C_b`` (``Factors.columns``): the input-side factor on the columns of branch b's weight (γ of its scale
  group, times a per-expert γ_e for stacked expert weights), ``R_b`` (``rows``): an un-normalized output-side u
  on its rows, ``N_b`` (``after``): the u after a normalization (DNP / QK-norm), which no linear map absorbs
  for q, k.
- In the target each scale group takes ``C_b`` when all its branches share the same one and the
  parameterization can hold it (``set_scale_``), else it is set to 1 and ``C_b`` is folded into the
  weights, ``W (γ ⊙ x̂) = (W diag γ) x̂``: branch-specific → shared, anything → ``no_scale``. An
  un-normalized u is kept the same way or folded into the rows. A normalized u is copied (head ↔ channel
  shape when the heads agree). Adding or removing a normalization (DNP on q/k of a model without
  QK-norm, a sublayer output norm) or changing ``eps`` changes the function: listed in ``changes``.

``set_scale_(vector, γ)`` is the ``ScaleVector`` inverse (``vector.set_gamma_``, see ``scale/vector.py``) with a
check that the vector then produces γ. A target parameterization without an inverse cannot be written:
``transfer_`` raises ``NoInverse`` naming the class (``convert`` refuses it; a same-strategy conversion is a
copy and never gets here).

A scale site of the user's (a ``ScaleSite`` subclass that is neither ``NormSite`` nor ``OutputNorm``) joins by its
method ``convert_from_(source) -> list[str]``: it sets its own parameters from the same site of the source model and
returns what it could not keep; ``copy_scales_`` is that method for a site that only multiplies by its vectors' γ.
A site without it is refused by name, with that fix.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from .sites import NormSite, OutputNorm, ScaleSite
from .vector import NoInverse, ScaleVector, check_finite

__all__ = ["NoInverse", "Transfer", "copy_scales_", "set_scale_", "transfer_"]


@dataclass
class Transfer:
    changes: list[str] = field(default_factory=list)  # what changes the function (empty: exact)
    notes: list[str] = field(default_factory=list)  # what was folded or untied to keep it


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    tol = 64 * torch.finfo(b.dtype).eps * max(1.0, float(b.abs().max()))
    return a.shape == b.shape and float((a.to(b) - b).abs().max()) <= tol


@torch.no_grad()
def set_scale_(vector: ScaleVector, gamma: torch.Tensor) -> bool:
    """Set ``vector``'s parameters so that ``vector() == gamma`` through its inverse (``set_gamma_``); False
    (nothing changed) when it cannot produce that γ. Raises ``NoInverse`` for a class without an inverse, and
    ``ValueError`` when its inverse claims a γ that it then does not produce (a bug in that class), or for a γ with a
    NaN or Inf entry (``check_finite``: refused before any inverse runs)."""
    gamma = gamma.detach()
    check_finite(vector, gamma)
    before = [p.detach().clone() for p in vector.parameters()]
    ok = vector.set_gamma_(gamma)

    def restore() -> None:
        for p, old in zip(vector.parameters(), before):
            p.copy_(old)

    if not ok:
        restore()
        return False
    got = vector().detach()
    if not _close(got, gamma):
        restore()
        cls = type(vector)
        raise ValueError(f"{cls.__module__}.{cls.__qualname__}.set_gamma_ returned True but the vector then produces "
                         f"a γ off by {float((got.to(gamma) - gamma).abs().max()):.3g}; fix its inverse")
    return True


def _set_or_ones(vector: ScaleVector, gamma: Optional[torch.Tensor], what: str, out: Transfer) -> bool:
    """Set ``gamma`` (``None``: ones); on failure set ones and return False."""
    ones = torch.ones(vector.dim)
    if gamma is not None and set_scale_(vector, gamma):
        return True
    if not set_scale_(vector, ones.to(gamma) if gamma is not None else ones):
        raise ValueError(f"{what}: {type(vector).__name__} cannot represent γ = 1; choose another model.strategy.vector")
    return gamma is None


def _shape_for(vector: ScaleVector, full: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``full`` u in the target vector's shape (channel, or one value per head dimension): (value, exact)."""
    if vector.dim == full.numel():
        return full, True
    heads = full.view(-1, vector.dim)
    return heads.mean(0), bool((heads == heads[0]).all())


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.detach()


@torch.no_grad()
def _transfer_site(s: NormSite, t: NormSite, name: str, out: Transfer) -> dict[str, torch.Tensor]:
    """New weights of ``t``'s branches; writes every scale vector of ``t``."""
    if [b.name for b in s.branches] != [b.name for b in t.branches]:
        raise ValueError(f"{name}: the sites have different branches ({list(s.by_name)} vs {list(t.by_name)})")
    if s.eps != t.eps:
        out.changes.append(f"{name}: eps {s.eps:g} → {t.eps:g} (model.strategy.eps) changes every normalization")
    src = {b: s.factors(b) for b in s.by_name}
    tgt = {b: t.factors(b) for b in t.by_name}
    cols = {b: _detached(f.columns) for b, f in src.items()}
    rows: dict[str, Optional[torch.Tensor]] = {}
    # input side: each target scale group keeps the common γ of its branches, or folds; per-expert γ_i each
    # keep slice i of the common [E, in] factor of the expert branches, or fold
    shared = [g for g in t.input_scales() if g.expert is None]
    experts = [g for g in t.input_scales() if g.expert is not None]
    for g in shared:
        first = cols[g.branches[0]]
        same = first is not None and first.dim() == 1 and all(
            cols[b] is not None and cols[b].shape == first.shape and torch.equal(cols[b], first) for b in g.branches)
        if same and _set_or_ones(g.vector, first, f"{name}.scales.{g.key}", out):
            for b in g.branches:
                cols[b] = None
        elif not same:
            _set_or_ones(g.vector, None, f"{name}.scales.{g.key}", out)
    if experts:
        members, E = experts[0].branches, len(experts)
        per = [cols[b].expand(E, -1) if cols[b] is not None and cols[b].dim() == 1 else cols[b] for b in members]
        same = bool(members) and all(p is not None for p in per) and all(torch.equal(p, per[0]) for p in per)
        ok = same and all(set_scale_(g.vector, per[0][g.expert]) for g in experts)
        if ok:
            for b in members:
                cols[b] = None
        else:
            for g in experts:
                _set_or_ones(g.vector, None, f"{name}.expert_scales", out)
    # output side
    for b in t.by_name:
        fs, ft, vec = src[b], tgt[b], t.output_vector(b)
        if fs.normalized != ft.normalized:
            what = "adds" if ft.normalized else "removes"
            out.changes.append(f"{name}.{b}: {what} a normalization of the projection's output "
                               f"({ft.setting}; the source has {fs.setting.split(': ', 1)[1]})")
        if not fs.normalized:
            u_src = _detached(fs.rows)
            rows[b] = u_src
            if vec is not None and not ft.normalized:  # an un-normalized u (output / dual placement)
                want, exact = _shape_for(vec, u_src) if u_src is not None else (None, False)
                if _set_or_ones(vec, want if exact else None, f"{name}.{b}.out_scale", out) and exact:
                    rows[b] = None
            elif vec is not None:
                _set_or_ones(vec, None, f"{name}.{b}.out_scale", out)
            continue
        if vec is None or not ft.normalized:
            if vec is not None:
                _set_or_ones(vec, None, f"{name}.{b}.out_scale", out)
            continue
        u_src = _detached(fs.after)
        want, exact = _shape_for(vec, u_src) if u_src is not None else (None, True)
        if not exact:
            out.changes.append(f"{name}.{b}: the output scale differs between heads and the target's is one value "
                               "per head dimension (model.strategy.output_shape: head); set output_shape: channel")
        if not _set_or_ones(vec, want, f"{name}.{b}.out_scale", out) and want is not None:
            out.changes.append(f"{name}.{b}: {type(vec).__name__} cannot hold the normalized output scale u")
    new = {}
    for b, f in src.items():
        w = f.weight.detach().clone()
        c, r = cols[b], rows.get(b)
        if c is not None:
            w.mul_(c[:, None, :] if c.dim() == 2 else c)
            out.notes.append(f"{name}.{b}: input scale folded into the weight")
        if r is not None:
            w.mul_(r[:, None] if w.dim() == 2 else r[None, :, None])
            out.notes.append(f"{name}.{b}: output scale folded into the weight's rows")
        new[b] = w
    return new


@torch.no_grad()
def copy_scales_(target: ScaleSite, source: ScaleSite) -> list[str]:
    """Make ``target`` compute what ``source`` computes when the site multiplies by its vectors' γ and by nothing
    that depends on the parameterization: every parameter outside its scale vectors copied, every vector
    written through the target's inverse (``set_scale_``) from the source's γ, paired by their ``ScaleInfo``
    in ``scale_vectors()``. Returns what could not be kept (a γ the target's class cannot hold: set to 1)."""
    own = {id(p) for _, v in target.scale_vectors() for p in v.parameters()}
    theirs = dict(source.named_parameters())
    for key, param in target.named_parameters():
        if id(param) not in own:
            param.copy_(theirs[key])
    gammas = {(i.layer, i.site, i.branch): v().detach() for i, v in source.scale_vectors()}
    changes = []
    for info, vector in target.scale_vectors():
        if not set_scale_(vector, gammas[(info.layer, info.site, info.branch)]):
            changes.append(f"{info.site}.{info.branch}: {type(vector).__name__} cannot hold its γ (set to 1)")
            _set_or_ones(vector, None, f"{info.site}.{info.branch}", Transfer())
    return changes


def _transfer_user_site(s: ScaleSite, t: ScaleSite, name: str, out: Transfer) -> None:
    """A scale site of the user's (neither ``NormSite`` nor ``OutputNorm``) joins the conversion through its
    method ``convert_from_(source) -> list[str]`` (``docs/subclassing.md``); one without it is refused by name."""
    cls = type(t)
    method = getattr(t, "convert_from_", None)
    if method is None:
        raise ValueError(
            f"{name}: {cls.__module__}.{cls.__qualname__}: a scale site the conversion does not know (it has no "
            "convert_from_ method); give the class the method convert_from_(self, source) -> list[str] that sets its "
            "parameters from the same site of the "
            "source model (another strategy) and returns what it could not keep (`return copy_scales_(self, source)` "
            "from scalevec_lit.scale.convert when the site only multiplies by its vectors' γ; docs/subclassing.md)")
    if type(s) is not cls:
        raise ValueError(f"{name}: the sites are of different classes ({type(s).__name__} vs {cls.__name__})")
    out.changes.extend(f"{name}: {what}" for what in (method(s) or []))


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
            _transfer_user_site(s, t, name, out)
            continue
        for b, w in _transfer_site(s, t, name, out).items():
            param = t.proj[b].weight
            if id(param) in outside and not torch.equal(param, w):  # a tied head gets a weight of its own
                t.proj[b].weight = nn.Parameter(w, requires_grad=param.requires_grad)
                out.notes.append(f"{name}.{b}: untied from {outside[id(param)]} (its input scale was folded in)")
            elif id(param) not in outside:
                param.copy_(w)
    return out
