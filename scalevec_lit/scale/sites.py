"""Scale sites: the places where a scale vector meets activations or a weight.

- ``BranchScales``: one parameter-free RMS normalization, computed once, feeding several consumer
  branches, each with its own scale (HG) or all with one shared scale (the standard norm).
- ``DualScaledLinear``: a projection with its output-side placement: optional parameter-free
  normalization of its output (per head or whole, DNP) and an optional output-side scale ``u``.
- ``OutputNorm``: a norm on a sublayer's output before the residual add (Gemma/OLMo-2 style).

Every site yields its scale vectors with ``(layer, site, branch, role)`` through ``scale_vectors()``;
the registry adds the part. Roles follow the absorbability rule of SCALE_VECTORS.md: a scale that a
linear map can absorb exactly is ``input`` role, any other is ``output`` role.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .strategy import ScaleStrategy, has_input_side, has_output_side
from .vector import ScaleVector

INPUT, OUTPUT = "input", "output"


@dataclass(frozen=True)
class ScaleInfo:
    """Where a scale parameter lives and what it does. ``part`` is '' until the registry fills it."""

    layer: int  # block index; -1 for the final norm
    site: str  # attn_input, mlp_input, attn_proj, mlp_proj, attn_output, mlp_output, final
    branch: str  # q, k, v, gate, up, router, head, shared, out; MoE: experts, expert<i>, expert<i>_gate, ...
    role: str  # input or output
    part: str = ""  # scale, magnitude, direction

    @property
    def tag(self) -> str:
        layer = "final" if self.layer < 0 else f"layer{self.layer:02d}"
        return f"{self.role}/{self.site}/{self.branch}/{layer}/{self.part}"


def rms_norm(x: torch.Tensor, eps: float, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Parameter-free RMS normalization over the last dim (optionally times ``weight``)."""
    return F.rms_norm(x, (x.shape[-1],), weight=weight, eps=eps)


class ScaleSite(nn.Module):
    """Base of every module that owns scale vectors. Subclasses implement ``scale_vectors``."""

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:  # pragma: no cover - abstract
        raise NotImplementedError


class BranchScales(ScaleSite):
    """``x̂ = x / RMS(x)`` once, then ``γ_b ⊙ x̂`` for each consumer branch ``b``.

    With ``branch_specific`` each branch whose placement has an input side owns a scale (HG);
    otherwise those branches share one scale (branch name ``shared``): the standard RMSNorm.
    Branches whose placement is ``output`` read the bare ``x̂``. ``keys`` (branch -> scale name, ``None``
    for the bare x̂) overrides that grouping: branches given the same name share one scale (the MoE
    uses it for router-vs-experts scales).
    """

    def __init__(
        self,
        dim: int,
        branches: Sequence[str],
        strategy: ScaleStrategy,
        *,
        layer: int,
        site: str,
        placements: Optional[dict[str, str]] = None,
        enabled: bool = True,
        keys: Optional[dict[str, Optional[str]]] = None,
    ) -> None:
        super().__init__()
        self.dim, self.layer, self.site, self.eps = dim, layer, site, strategy.eps
        self.branches = tuple(branches)
        placements = placements or {}
        scaled = [b for b in self.branches if enabled and has_input_side(placements.get(b, "input"))]
        if keys is not None:
            self.key = {b: (keys.get(b) if b in scaled else None) for b in self.branches}
        elif strategy.branch_specific:
            self.key = {b: (b if b in scaled else None) for b in self.branches}
        else:
            self.key = {b: ("shared" if b in scaled else None) for b in self.branches}
        names = sorted({k for k in self.key.values() if k is not None}, key=list(self.key.values()).index)
        self.scales = nn.ModuleDict({k: strategy.make_vector(dim) for k in names})

    def gamma(self, branch: str) -> Optional[torch.Tensor]:
        """Effective γ of ``branch`` (``None`` when the branch reads the bare x̂)."""
        key = self.key[branch]
        if key is None or self.scales[key].is_identity:
            return None
        return self.scales[key]()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if len(self.scales) == 1 and all(k is not None for k in self.key.values()):
            # one shared scale: a single fused rms_norm with weight
            (vec,) = self.scales.values()
            y = rms_norm(x, self.eps) if vec.is_identity else rms_norm(x, self.eps, vec())
            return [y] * len(self.branches)
        xhat = rms_norm(x, self.eps)
        done: dict[str, torch.Tensor] = {}
        out = []
        for b in self.branches:
            key = self.key[b]
            if key is None or self.scales[key].is_identity:
                out.append(xhat)
                continue
            if key not in done:
                done[key] = xhat * self.scales[key]()
            out.append(done[key])
        return out

    def drop_scales_(self) -> None:
        """Forget every scale (after they were folded into the consumers): x̂ goes to every branch."""
        self.scales = nn.ModuleDict()
        self.key = {b: None for b in self.branches}

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        for key, vec in self.scales.items():
            yield ScaleInfo(self.layer, self.site, key, INPUT), vec

    def extra_repr(self) -> str:
        return f"dim={self.dim}, branches={self.branches}, key={self.key}"


class DualScaledLinear(ScaleSite):
    """``y = u ⊙ N(W x)`` where ``N`` is a parameter-free RMS norm (``dual_norm`` only, per group of
    ``group_size`` channels) and ``u`` is the output-side scale (``output``, ``dual``, ``dual_norm``).

    The input side ``v`` of the placement lives in the ``BranchScales`` that feeds this map.

    Role of ``u``: without the norm, ``diag(u) W`` absorbs it (input role). With the norm, it is input
    role only when the next linear map absorbs it (``absorbed_downstream``: v by W_o, up by W_down);
    otherwise (q, k before RoPE and the dot product, gate before the activation) it is output role.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        placement: str,
        strategy: ScaleStrategy,
        layer: int,
        site: str,
        branch: str,
        group_size: Optional[int] = None,
        absorbed_downstream: bool = False,
    ) -> None:
        super().__init__()
        self.layer, self.site, self.branch, self.eps = layer, site, branch, strategy.eps
        self.placement = placement
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.normalize = placement == "dual_norm"
        self.group_size = group_size or out_features
        head_shaped = strategy.output_shape == "head" and group_size is not None
        self.out_scale: Optional[ScaleVector] = (
            strategy.make_vector(self.group_size if head_shaped else out_features)
            if has_output_side(placement)
            else None
        )
        self.out_role = INPUT if (not self.normalize or absorbed_downstream) else OUTPUT

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    def output_scale(self) -> Optional[torch.Tensor]:
        """``u`` expanded to the full output width, or ``None``."""
        if self.out_scale is None or self.out_scale.is_identity:
            return None
        u = self.out_scale()
        return u.repeat(self.linear.out_features // u.numel())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        has_u = self.out_scale is not None and not self.out_scale.is_identity
        if not self.normalize and not has_u:
            return y
        g = self.group_size
        yg = y.unflatten(-1, (-1, g))
        u = self.out_scale() if has_u else None
        if self.normalize:
            if u is not None and u.numel() == g:
                return rms_norm(yg, self.eps, u).flatten(-2)
            yg = rms_norm(yg, self.eps)
        if u is None:
            return yg.flatten(-2)
        return (yg * u.view(-1, g) if u.numel() > g else yg * u).flatten(-2)

    # -- folding -------------------------------------------------------------------------------------
    @torch.no_grad()
    def fold_input_(self, gamma: torch.Tensor) -> None:
        """``W(γ ⊙ x) = (W diag γ) x``."""
        self.linear.weight.mul_(gamma.to(self.linear.weight)[None, :])

    @torch.no_grad()
    def fold_output_(self) -> None:
        """Fold an un-normalized output scale into ``W``: ``u ⊙ W x = (diag u W) x``."""
        if self.normalize:
            raise ValueError(f"{self.site}.{self.branch}: a normalized output scale cannot fold into its own map")
        u = self.output_scale()
        if u is not None:
            self.linear.weight.mul_(u.to(self.linear.weight)[:, None])
        self.out_scale = None

    def take_output_scale_(self) -> Optional[torch.Tensor]:
        """Remove and return ``u`` (full width) so that the next linear map can absorb it."""
        u = self.output_scale()
        if u is not None:
            u = u.detach().clone()
        self.out_scale = None
        return u

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        if self.out_scale is not None:
            yield ScaleInfo(self.layer, self.site, self.branch, self.out_role), self.out_scale

    def extra_repr(self) -> str:
        return f"placement={self.placement}, group_size={self.group_size}, out_role={self.out_role}"


class OutputNorm(ScaleSite):
    """``γ ⊙ x / RMS(x)`` on a sublayer's output, before the residual add: output role."""

    def __init__(self, dim: int, strategy: ScaleStrategy, *, layer: int, site: str) -> None:
        super().__init__()
        self.layer, self.site, self.eps = layer, site, strategy.eps
        self.scale = strategy.make_vector(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps) if self.scale.is_identity else rms_norm(x, self.eps, self.scale())

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        yield ScaleInfo(self.layer, self.site, "out", OUTPUT), self.scale


@torch.no_grad()
def fold_columns_(linear: nn.Linear, u: Optional[torch.Tensor]) -> None:
    """``W (u ⊙ x) = (W diag u) x`` for a map that reads ``u``-scaled input (W_o after v, W_down after up)."""
    if u is not None:
        linear.weight.mul_(u.to(linear.weight)[None, :])
