"""The one place where ``inspect`` reads the scale sites: every scale vector of a model as a ``VectorView``
(where it lives, its role, its parameterization, the weights that consume it) and what folding would do with
it (``folds``, ``targets``, ``reason``).

Everything else in ``scalevec_lit/inspect/`` reads ``VectorView`` only, so a change of the site interface
(``scalevec_lit/scale/``) touches this file alone. The registry (``scale_parameters``) gives the vectors,
their roles and consumers; the fold targets the registry does not carry (the map after an absorbed
normalized branch, the per-expert slices) are read from the site here, exactly as ``NormSite.fold_`` uses
them (``tests/test_inspect.py`` folds the model and checks that exactly the named weights change).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from scalevec_lit.scale.registry import scale_parameters
from scalevec_lit.scale.sites import INPUT, Consumer, NormSite, OutputNorm, layer_label
from scalevec_lit.scale.vector import ScaleVector


@dataclass(frozen=True)
class FoldTarget:
    """One weight a scale folds into: ``axis`` ``columns`` (``W diag γ``) or ``rows`` (``diag u W``);
    ``expert``: only that expert's slice of a stacked ``[E, out, in]`` weight."""

    weight: str  # the parameter's qualified name in the model
    axis: str  # columns, rows
    expert: Optional[int] = None

    def describe(self) -> str:
        """``<axis> of <weight>`` (``[<expert>]`` after the weight for one expert's slice), for reports."""
        where = f"{self.weight}[{self.expert}]" if self.expert is not None else self.weight
        return f"{self.axis} of {where}"


@dataclass
class VectorView:
    """One scale vector of a model, as ``inspect`` reports it."""

    layer: int
    site: str
    branch: str
    role: str
    parameterization: str  # the ScaleVector class name
    names: list[str]  # its parameters' qualified names
    vector: ScaleVector = field(repr=False)
    consumers: Optional[list[Consumer]] = field(default=None, repr=False)  # the registry's (for the conservation law)
    folds: bool = False
    targets: list[FoldTarget] = field(default_factory=list)
    reason: str = ""  # how it folds, or why not

    @property
    def layer_name(self) -> str:
        """The layer as tags and figures name it: ``layer00``, ``layer01``, ... or ``final``."""
        return layer_label(self.layer)

    @property
    def key(self) -> tuple[int, str, str, str]:
        """``(layer, site, branch, role)``: what pairs a vector with its counterpart in ``--compare``'s model."""
        return (self.layer, self.site, self.branch, self.role)


def _names(model: nn.Module) -> dict[int, list[str]]:
    """``id(parameter)`` → its qualified names (several for a tied weight: the embedding and the head)."""
    out: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        out.setdefault(id(p), []).append(name)
    return out


def _name(names: dict[int, list[str]], weight: torch.Tensor, branch: str) -> str:
    """The name of ``weight`` as the consumer ``branch`` holds it (a tied head is ``final.proj.head.weight``,
    not ``embed.weight``: folding unties it and changes the head only)."""
    found = names.get(id(weight), [])
    mine = [n for n in found if f".{branch}." in f".{n}"]
    return (mine or found or [branch])[0]


def scale_vectors(model: nn.Module) -> list[VectorView]:
    """Every scale vector of ``model`` in module order (one row per vector, its parts together)."""
    names = _names(model)
    views: dict[int, VectorView] = {}
    for sp in scale_parameters(model):
        view = views.get(id(sp.vector))
        if view is None:
            info = sp.info
            view = views[id(sp.vector)] = VectorView(
                info.layer, info.site, info.branch, info.role, type(sp.vector).__name__, [], sp.vector,
                list(sp.consumers) if sp.consumers else None)
            _plan_fold(view, sp.site, names)
        view.names.append(sp.name)
    return list(views.values())


def _plan_fold(view: VectorView, site, names: dict[int, list[str]]) -> None:
    """Fill ``folds``, ``targets`` and ``reason``: what ``fold_`` does with this vector, or why it keeps it."""
    if isinstance(site, OutputNorm):
        view.reason = ("a norm on the sublayer's output before the residual add: no linear map reads it, it stays "
                       "as a norm weight")
        return
    if view.role != INPUT and not isinstance(site, NormSite):
        view.reason = f"output role ({type(site).__name__} says no linear map absorbs it): it stays as a norm weight"
        return
    if view.role != INPUT:
        what = {"q": "q per head (QK-norm)", "k": "k per head (QK-norm)"}.get(view.branch, f"the {view.branch} output")
        then = " then RoPE and the attention softmax" if view.branch in ("q", "k") else " then a nonlinearity"
        view.reason = (f"a scale after the normalization of {what},{then}: no linear map absorbs it, it stays as a "
                       "norm weight")
        return
    view.folds = True
    if isinstance(site, NormSite):
        found = _targets(site, view.vector, names)
        if found is not None:
            view.targets, kind = found
            view.reason = f"{kind}: exactly into the {', '.join(t.describe() for t in view.targets)}"
            return
    elif view.consumers:  # another kind of site: the registry's consumers are what its fold_ reads
        view.targets = [FoldTarget(_name(names, c.weight, c.name),
                                   "columns" if c.axis % c.weight.ndim == c.weight.ndim - 1 else "rows")
                        for c in view.consumers]
        view.reason = f"into its consumers (as {type(site).__name__} names them): the " + \
            ", ".join(t.describe() for t in view.targets)
        return
    view.folds = False  # an input-role scale whose fold target this view cannot name: say so, do not guess
    view.reason = f"input role, but {type(site).__name__} names no weight it folds into"


def _targets(site: NormSite, vector: ScaleVector, names) -> Optional[tuple[list[FoldTarget], str]]:
    """The weights ``site.fold_()`` folds ``vector`` into, and what kind of scale it is (``None``: not found)."""
    for scale in site.input_scales():
        if scale.vector is vector:
            targets = [FoldTarget(_name(names, site.weight(b), b), "columns", scale.expert) for b in scale.branches]
            return targets, "per-expert γ" if scale.expert is not None else "input-side γ"
    for b in site.branches:
        if site.output_vector(b.name) is vector:
            f = site.factors(b.name)
            if not f.normalized:
                return [FoldTarget(_name(names, f.weight, b.name), "rows")], "un-normalized output-side u"
            if f.absorbed_by is not None:
                return ([FoldTarget(_name(names, f.absorbed_by, ""), "columns")],
                        f"output-side u after the normalization of {b.name}, read by a linear map")
    return None
