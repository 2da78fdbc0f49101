"""The parts of a ``NormSite`` that are plain data: ``Branch`` (a consumer as the model declares it),
``Factors`` (what a branch computes, as factors around its weight: the interface every reader of a site uses),
``InputScale`` (an input-side γ and the branches that read it), ``Consumer`` (a weight that reads a scale, for
the registry) and ``Projection`` (a consumer weight with its output-side scale).

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import torch
from torch import nn

from .strategy import BRANCHES
from .vector import ScaleVector

#: the map that reads a branch's output linearly, as given to ``NormSite(absorbed_by=...)``: a module with a
#: ``weight`` (``nn.Linear``), or ``(owner module, attribute name)`` of a bare parameter (MoE's stacked
#: ``expert_down``). Resolved when used, so it stays right after ``to_empty``, ``.to(dtype)`` and deep copies.
MapRef = Union[nn.Module, tuple[nn.Module, str]]


@dataclass(frozen=True)
class Consumer:
    """A weight that reads a scale: ``axis`` is the weight dimension the scale multiplies (the last one,
    ``-1``, for an input-side γ: ``W diag γ``; the output one, ``-2``, for an un-normalized ``u``)."""

    weight: torch.Tensor
    axis: int
    name: str


@dataclass(frozen=True)
class Branch:
    """One consumer of a ``NormSite``, as the model declares it (no placement here: the strategy decides).

    Args:
        name: q, k, v, gate, up, router, head, shared_gate, shared_up (or any name of a user's map).
        out_features: output width of the consumer map.
        follows: the strategy branch whose placement (and HG scale) this one takes (``shared_gate`` follows
            ``gate``); default: itself when it is a strategy branch, otherwise plain ``input``.
        group: channels per normalized group when the placement normalizes the output (head_dim for q, k,
            v); ``None``: the whole output.
        rotary: RoPE after the output side (q, k).
        absorbed_downstream: the next map is linear in this branch's output (v → W_o, up → W_down), so a
            normalized output scale is still absorbable (input role). The map itself is given to the site when
            it is built (``NormSite(absorbed_by={name: map})``); a site refuses to be built without it.
        experts: >0: a stacked ``[experts, out, in]`` weight that the MoE computes itself; the site gives
            it x̂ (``forward``) and the weight with the scales on its columns and rows (``expert_factors``).
        proj_site: the ``site`` of this branch's output-side scale in tags (default: the site's ``proj_site``);
            a site read by attention and MLP alike (one-norm parallel block) names each branch's own.
    """

    name: str
    out_features: int
    follows: Optional[str] = None
    group: Optional[int] = None
    rotary: bool = False
    absorbed_downstream: bool = False
    experts: int = 0
    proj_site: Optional[str] = None

    @property
    def key(self) -> Optional[str]:
        """The strategy branch whose placement this one takes (``model.strategy.placement.<key>``), also the name of
        its γ with HG: ``follows`` when set, else its own name when it is one of ``BRANCHES``; ``None``: no
        placement names it (plain ``input``, and its own name with HG)."""
        if self.follows is not None:
            return self.follows
        return self.name if self.name in BRANCHES else None


@dataclass(frozen=True)
class Factors:
    """What branch ``name`` of a ``NormSite`` computes from the site's input ``x``, as factors of its weight::

        y = after ⊙ N_group( rows ⊙ (W · (columns ⊙ x̂)) ),   x̂ = x / RMS(x)

    ``N_group`` is an RMS normalization over groups of ``norm_group`` channels (per head for q, k, v), present
    only when ``norm_group`` is set. Every factor is ``None`` when it is 1. Tensors are the live values (they
    carry gradients; detach to read them).

    Attributes:
        name: the branch.
        weight: the consumer weight ``[(E,) out, in]`` as stored (without any scale).
        columns: the input-side factor on the weight's columns: ``[in]``, or ``[E, in]`` for a stacked expert
            weight with per-expert scales (each expert's own γ_e times the shared γ).
        rows: an output-side factor before any normalization, on the weight's rows ``[out]`` (shared by every
            expert).
        norm_group: channels per normalized group of the output; ``None``: the output is not normalized.
        after: the output-side factor after the normalization, ``[out]`` (per head it repeats for a head-shaped
            scale); only with ``norm_group``.
        absorbed_by: the weight of the map that reads this branch's output linearly (W_o after v, W_down after
            up), whose columns can absorb ``after``; ``None`` when none was declared.
        setting: the configuration key and value that chose this branch's placement, for messages
            (``model.strategy.placement.q: 'dual_norm'``).
    """

    name: str
    weight: torch.Tensor
    columns: Optional[torch.Tensor]
    rows: Optional[torch.Tensor]
    norm_group: Optional[int]
    after: Optional[torch.Tensor]
    absorbed_by: Optional[torch.Tensor]
    setting: str

    @property
    def normalized(self) -> bool:
        """True when the output is normalized (per group) before ``after``: no linear map absorbs ``after``
        unless ``absorbed_by`` reads it."""
        return self.norm_group is not None

    def effective_weight(self) -> torch.Tensor:
        """``diag(rows) W diag(columns)`` (per expert for a stacked weight): the weight with every factor that
        sits around it folded in (not ``after``)."""
        w = self.weight
        if self.columns is not None:
            w = w * (self.columns.to(w.dtype)[:, None, :] if self.columns.dim() == 2 else self.columns.to(w.dtype))
        if self.rows is not None:
            w = w * self.rows.to(w.dtype)[..., :, None]
        return w


class InputScale(NamedTuple):
    """An input-side scale vector of a site and the branches whose columns it multiplies: ``key`` is its name
    (``shared``, a branch name with HG, ``expert<i>`` for routed expert ``i``'s γ_i, which reads slice ``expert``
    of the stacked weights)."""

    key: str
    vector: ScaleVector
    branches: tuple[str, ...]
    expert: Optional[int] = None


def expand_u(u: torch.Tensor, out_features: int) -> torch.Tensor:
    """``u`` (channel- or head-shaped) expanded to the full output width."""
    return u if u.numel() == out_features else u.repeat(out_features // u.numel())


def resolve_map(ref: MapRef) -> torch.Tensor:
    """The weight of an ``absorbed_by`` map (see ``MapRef``)."""
    if isinstance(ref, tuple):
        owner, attr = ref
        ref = getattr(owner, attr)
    return ref.weight if isinstance(ref, nn.Module) else ref


class Projection(nn.Module):
    """A consumer weight ``[(experts,) out, in]`` with its optional output-side scale ``u`` (``out_scale``)."""

    def __init__(self, branch: Branch, in_features: int, out_scale: Optional[ScaleVector], init_std: float) -> None:
        super().__init__()
        shape = ((branch.experts,) if branch.experts else ()) + (branch.out_features, in_features)
        self.weight = nn.Parameter(torch.empty(shape))
        self.out_scale = out_scale
        self.init_std = init_std
        if self.weight.device.type != "meta":
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        nn.init.normal_(self.weight, 0.0, self.init_std)
        if self.out_scale is not None and hasattr(self.out_scale, "reset_parameters"):
            self.out_scale.reset_parameters()


def fold_columns_(w: torch.Tensor, u: torch.Tensor, group: Optional[int]) -> None:
    """``W (u ⊙ x)`` → ``(W diag u) x`` in place for the map after an absorbed branch; with per-head groups and a
    map that reads more heads (GQA), query head ``h`` reads kv head ``h // (H/K)``: u repeats per head."""
    cols = w.shape[-1]
    if cols != u.numel():
        g = group or u.numel()
        u = u.view(-1, g).repeat_interleave(cols // u.numel(), 0).flatten()
    w.mul_(u.to(w).view(*([1] * (w.ndim - 1)), -1))
