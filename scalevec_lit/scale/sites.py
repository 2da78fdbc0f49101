"""Scale sites: a normalization together with everything that reads it.

- ``NormSite``: one parameter-free RMS normalization ``x̂ = x / RMS(x)``, computed once, and its consumer
  branches (attention: q, k, v; MLP: gate, up; MoE: router, routed experts, shared experts; the final
  norm: the LM head). The site owns each consumer's weight, the input-side scale of each branch (one
  shared γ, or one per branch with HG), the output-side scale ``u`` and intermediate norm that a
  placement adds, and it alone answers: the role of each scale, which weights consume it, the exact
  fold, and what an export needs. The model composes sites and never reads a placement.
- ``OutputNorm``: a norm on a sublayer's output before the residual add (Gemma/OLMo-2 style).

Fast path (``NormSite.forward``): every 2-D consumer of one x̂ in one matmul, γ (and an un-normalized
u) applied to the weights (``scale/ops.py``); a normalized output side and RoPE run once over all
branches that share them (q and k together), saving no activation of their own.

Roles follow the absorbability rule: a scale that a linear map can absorb exactly is ``input`` role,
any other is ``output`` role. Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, NamedTuple, Optional, Sequence

import torch
from torch import nn

from .ops import apply_rope, group_norm_rope, rms_norm, scaled_linear
from .strategy import BRANCHES, ScaleStrategy, has_input_side, has_output_side, normalizes
from .vector import ScaleVector

INPUT, OUTPUT = "input", "output"

__all__ = ["Branch", "Consumer", "INPUT", "NormSite", "OUTPUT", "OutputNorm", "ScaleInfo", "ScaleSite", "ScaleTag", "TAG_PREFIX",
           "layer_label", "parse_scale_tag", "rms_norm", "scale_tag"]


#: every tag of ``ScaleVectorMonitor`` is ``scale/<role>/<site>/<branch>/<layer>/<part>/<stat>`` (``scale_tag``);
#: readers of event files (``scalevec_lit.study``) take it apart with ``parse_scale_tag``, never by position
TAG_PREFIX = "scale"


class ScaleTag(NamedTuple):
    role: str
    site: str
    branch: str
    layer: str  # layer00, ..., final
    part: str  # scale, magnitude, direction; gamma (effective γ), precond (preconditioner figures)
    stat: str  # mean, std, min, max; min_gamma_sq, drift_mean, ...


def scale_tag(info: "ScaleInfo", stat: str) -> str:
    return f"{TAG_PREFIX}/{info.tag}/{stat}"


def parse_scale_tag(tag: str) -> Optional[ScaleTag]:
    """The parts of a monitor tag, or None for any other tag (a histogram or heatmap tag, ``train/loss``)."""
    parts = tag.split("/")
    if len(parts) != 7 or parts[0] != TAG_PREFIX:
        return None
    return ScaleTag(*parts[1:])


def layer_label(layer: int) -> str:
    """The layer's name in tags and figures: ``layer00``, ``layer01``, ... and ``final`` (layer −1)."""
    return "final" if layer < 0 else f"layer{layer:02d}"


@dataclass(frozen=True)
class ScaleInfo:
    """Where a scale parameter lives and what it does. ``part`` is '' until the registry fills it."""

    layer: int  # block index; -1 for the final norm
    site: str  # attn_input, mlp_input, attn_proj, mlp_proj, attn_output, mlp_output, final
    branch: str  # q, k, v, gate, up, router, head, shared, out; MoE: experts, expert<i>, ...
    role: str  # input or output
    part: str = ""  # scale, magnitude, direction

    @property
    def tag(self) -> str:
        return f"{self.role}/{self.site}/{self.branch}/{layer_label(self.layer)}/{self.part}"


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
        name: q, k, v, gate, up, router, head, shared_gate, shared_up.
        out_features: output width of the consumer map.
        follows: the strategy branch whose placement (and HG scale) this one takes (``shared_gate`` follows
            ``gate``); default: itself when it is a strategy branch, otherwise plain ``input``.
        group: channels per normalized group when the placement normalizes the output (head_dim for q, k,
            v); ``None``: the whole output.
        rotary: RoPE after the output side (q, k).
        absorbed_downstream: the next map is linear in this branch's output (v → W_o, up → W_down), so a
            normalized output scale is still absorbable (input role).
        experts: >0: a stacked ``[experts, out, in]`` weight that the MoE computes itself; the site gives
            it the scaled x̂ (``forward``) and the effective weight (``expert_weight``).
    """

    name: str
    out_features: int
    follows: Optional[str] = None
    group: Optional[int] = None
    rotary: bool = False
    absorbed_downstream: bool = False
    experts: int = 0

    @property
    def key(self) -> Optional[str]:
        if self.follows is not None:
            return self.follows
        return self.name if self.name in BRANCHES else None


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


class ScaleSite(nn.Module):
    """Base of every module that owns scale vectors: ``scale_vectors()`` and ``consumers(vector)``."""

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def consumers(self, vector: ScaleVector) -> Optional[list[Consumer]]:
        """The weights that read ``vector`` (``None``: none that a law about them could use)."""
        return None

    @torch.no_grad()
    def fold_(self) -> None:
        """Fold every input-role scale into its consumers (default: a site with none)."""


def _expand_u(u: torch.Tensor, out_features: int) -> torch.Tensor:
    """``u`` (channel- or head-shaped) expanded to the full output width."""
    return u if u.numel() == out_features else u.repeat(out_features // u.numel())


class NormSite(ScaleSite):
    """``x̂ = x / RMS(x)`` once; each branch ``b`` computes ``u_b ⊙ [N](W_b (γ_b ⊙ x̂))`` (see module doc).

    ``forward(x, rope)`` returns one tensor per branch, in branch order (for expert branches: the scaled
    x̂ they read). ``branch_specific`` gives each branch its own γ (HG); ``scale_keys`` (branch → scale
    name) overrides the grouping. ``enabled=False``: a norm without learnable scales (final_norm: false).
    """

    def __init__(
        self,
        dim: int,
        branches: Sequence[Branch],
        strategy: ScaleStrategy,
        *,
        layer: int,
        site: str,
        proj_site: Optional[str] = None,
        init_std: float = 0.02,
        enabled: bool = True,
        scale_keys: Optional[dict[str, Optional[str]]] = None,
        per_expert: int = 0,
    ) -> None:
        super().__init__()
        self.dim, self.layer, self.site, self.eps = dim, layer, site, strategy.eps
        self.proj_site = proj_site or site.replace("_input", "_proj")
        self.branches = tuple(branches)
        self.by_name = {b.name: b for b in self.branches}
        self.placement = {b.name: strategy.placement.of(b.key) if b.key else "input" for b in self.branches}
        head_shaped = strategy.output_shape == "head"
        self.proj = nn.ModuleDict()
        self.out_role: dict[str, str] = {}
        for b in self.branches:
            u = None
            if has_output_side(self.placement[b.name]):
                u = strategy.make_vector(b.group if (head_shaped and b.group) else b.out_features)
                norm = normalizes(self.placement[b.name])
                self.out_role[b.name] = INPUT if (not norm or b.absorbed_downstream) else OUTPUT
            self.proj[b.name] = Projection(b, dim, u, init_std)
        scaled = [b.name for b in self.branches if enabled and has_input_side(self.placement[b.name])]
        if scale_keys is not None:
            self.key = {b.name: (scale_keys.get(b.name) if b.name in scaled else None) for b in self.branches}
        elif strategy.branch_specific:
            self.key = {b.name: ((b.key or b.name) if b.name in scaled else None) for b in self.branches}
        else:
            self.key = {b.name: ("shared" if b.name in scaled else None) for b in self.branches}
        names = list(dict.fromkeys(k for k in self.key.values() if k is not None))
        # a scale read only by branches that normalize their output: its size is invisible (no magnitude)
        self.scales = nn.ModuleDict({k: strategy.make_vector(dim, before_norm=all(
            self.normalizes(b) for b, key in self.key.items() if key == k)) for k in names})
        # MoE ``scales: expert``: one more γ_e per routed expert, on the columns of its gate/up weights
        has_experts = any(b.experts and b.name in scaled for b in self.branches)
        self.expert_scales = (
            nn.ModuleList(strategy.make_vector(dim) for _ in range(per_expert)) if per_expert and has_experts else None
        )

    # -- what the rest of the library asks ---------------------------------------------------------------
    def weight(self, name: str) -> torch.Tensor:
        """The consumer weight of branch ``name`` (its parameter, without any scale)."""
        return self.proj[name].weight

    def gamma(self, name: str) -> Optional[torch.Tensor]:
        """Effective input-side γ of branch ``name`` (``None``: the branch reads the bare x̂)."""
        key = self.key[name]
        if key is None or self.scales[key].is_identity:
            return None
        return self.scales[key]()

    def output_scale(self, name: str) -> Optional[torch.Tensor]:
        """The branch's output-side ``u`` as stored (channel- or head-shaped), ``None`` when it has none."""
        vec = self.proj[name].out_scale
        return None if vec is None or vec.is_identity else vec()

    def normalizes(self, name: str) -> bool:
        """True when the branch's placement normalizes its output (per group) before ``u``."""
        return normalizes(self.placement[name])

    def placement_key(self, name: str) -> str:
        """``model.strategy.placement.<b>: '<placement>'``, for messages that name the setting."""
        return f"model.strategy.placement.{self.by_name[name].key or name}: {self.placement[name]!r}"

    # -- forward -------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> list[torch.Tensor]:
        xhat = rms_norm(x, self.eps)
        dense = [b for b in self.branches if not b.experts]
        outs: dict[str, torch.Tensor] = {}
        if dense:
            gammas = [self.gamma(b.name) for b in dense]
            rows = [None if self.normalizes(b.name) else self._u_full(b) for b in dense]
            y = scaled_linear(xhat, [self.weight(b.name) for b in dense], gammas, rows)
            outs.update(self._output_side(y, dense, rope))
        done: dict[str, torch.Tensor] = {}
        for b in self.branches:
            if b.experts:
                key = self.key[b.name]
                if key is None or self.scales[key].is_identity:
                    outs[b.name] = xhat
                else:
                    if key not in done:
                        done[key] = xhat * self.scales[key]().to(xhat.dtype)
                    outs[b.name] = done[key]
        return [outs[b.name] for b in self.branches]

    def _u_full(self, b: Branch) -> Optional[torch.Tensor]:
        u = self.output_scale(b.name)
        return None if u is None else _expand_u(u, b.out_features)

    def _output_side(self, y: torch.Tensor, dense: list[Branch], rope) -> dict[str, torch.Tensor]:
        """Split the fused output; runs of branches with the same (normalized, group, rotary) are handled as
        one tensor (q and k together through their per-head norm, u and RoPE)."""
        runs: list[tuple[tuple, list[Branch]]] = []
        for b in dense:
            norm = self.normalizes(b.name)
            kind = (norm, (b.group or b.out_features) if norm else None, b.rotary and rope is not None,
                    b.group if b.rotary else None)
            if runs and runs[-1][0] == kind:
                runs[-1][1].append(b)
            else:
                runs.append((kind, [b]))
        transformed = any(kind[0] or kind[2] for kind, _ in runs)
        out: dict[str, torch.Tensor] = {}
        # split, never slice: the backward of a split is one concatenation, that of each slice a zero-filled
        # full-width gradient to add up
        widths = [sum(b.out_features for b in members) for _, members in runs]
        pieces = y.split(widths, -1) if len(runs) > 1 else (y,)
        for ((norm, group, rotary, head), members), part in zip(runs, pieces):
            if norm:
                us = [self.output_scale(b.name) for b in members]
                u = None
                if any(t is not None for t in us):
                    u = torch.cat([(_expand_u(t, b.out_features) if t is not None else part.new_ones(b.out_features))
                                   for t, b in zip(us, members)]).view(-1, group)
                cos, sin = rope if rotary else (None, None)
                part = group_norm_rope(part.unflatten(-1, (-1, group)), u, self.eps, cos, sin).flatten(-2)
            elif rotary:
                part = apply_rope(part.unflatten(-1, (-1, head)), *rope).flatten(-2)
            elif transformed and len(runs) > 1:
                part = part.contiguous()  # a view would keep the whole fused output alive for the backward
            if len(members) == 1:
                out[members[0].name] = part
            else:
                out.update(zip((b.name for b in members), part.split([b.out_features for b in members], -1)))
        return out

    # -- experts (MoE) -------------------------------------------------------------------------------------
    def expert_weight(self, name: str) -> torch.Tensor:
        """The stacked ``[E, out, in]`` weight of an expert branch with an un-normalized u on its rows."""
        w = self.weight(name)
        gamma = self._expert_gammas()
        if gamma is not None and has_input_side(self.placement[name]):
            w = w * gamma.to(w.dtype)[:, None, :]
        u = None if self.normalizes(name) else self._u_full(self.by_name[name])
        return w if u is None else w * u.to(w.dtype)[None, :, None]

    def _expert_gammas(self) -> Optional[torch.Tensor]:
        if self.expert_scales is None or all(v.is_identity for v in self.expert_scales):
            return None
        return torch.stack([v() for v in self.expert_scales])

    def expert_output(self, name: str, h: torch.Tensor) -> torch.Tensor:
        """The output side of an expert branch on its projections ``h`` [M, out] (norm, then u)."""
        if not self.normalizes(name):
            return h
        u = self._u_full(self.by_name[name])
        return rms_norm(h, self.eps, None if u is None else u.to(h.dtype))

    # -- registry, consumers, folding ------------------------------------------------------------------------
    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        for key, vec in self.scales.items():
            yield ScaleInfo(self.layer, self.site, key, INPUT), vec
        for b in self.branches:
            vec = self.proj[b.name].out_scale
            if vec is not None:
                yield ScaleInfo(self.layer, self.proj_site, b.name, self.out_role[b.name]), vec
        for i, vec in enumerate(self.expert_scales or ()):
            yield ScaleInfo(self.layer, self.site, f"expert{i}", INPUT), vec

    def consumers(self, vector: ScaleVector) -> Optional[list[Consumer]]:
        for key, vec in self.scales.items():
            if vec is vector:
                return [Consumer(self.weight(b.name), -1, b.name) for b in self.branches if self.key[b.name] == key]
        for b in self.branches:
            if self.proj[b.name].out_scale is vector and not self.normalizes(b.name):
                return [Consumer(self.weight(b.name), -2, b.name)]
        return None

    def absorbed_by(self, **maps) -> None:
        """Name the map that reads each ``absorbed_downstream`` branch (``v=W_o``, ``up=W_down``): a module with
        a ``weight``, or a weight ``[..., in]``. Kept as a plain reference (not a submodule)."""
        self.__dict__["_next_maps"] = {**self.__dict__.get("_next_maps", {}), **maps}

    @torch.no_grad()
    def fold_(self) -> None:
        """Fold every input-role scale: γ into the columns of its consumers, an un-normalized u into their
        rows, a normalized u of an absorbed branch into the columns of the map that reads it
        (``absorbed_by``; repeated per head when that map reads more heads than the branch has: grouped-query
        attention). Folded weights are new parameters (a tied LM head becomes untied)."""
        next_maps = self.__dict__.get("_next_maps", {})
        for b in self.branches:
            proj = self.proj[b.name]
            w = proj.weight.detach().clone()
            changed = False
            gamma = self.gamma(b.name)
            if gamma is not None:
                w.mul_(gamma.detach().to(w))
                changed = True
            per_expert = self._expert_gammas() if b.experts and has_input_side(self.placement[b.name]) else None
            if per_expert is not None:
                w.mul_(per_expert.detach().to(w)[:, None, :])
                changed = True
            u = self._u_full(b)
            if self.out_role.get(b.name) == INPUT and proj.out_scale is not None:
                if u is not None and not self.normalizes(b.name):
                    w.mul_(u.detach().to(w)[:, None])
                    changed = True
                elif u is not None:
                    _fold_columns_(next_maps[b.name], u.detach(), b.group)
                proj.out_scale = None
            if changed:  # a new tensor: a tied head becomes untied only when something folded into it
                proj.weight = nn.Parameter(w, requires_grad=proj.weight.requires_grad)
        self.scales = nn.ModuleDict()
        self.expert_scales = None
        self.key = dict.fromkeys(self.key)

    @torch.no_grad()
    def init_weights(self) -> None:
        for proj in self.proj.values():
            proj.init_weights()
        for vec in [*self.scales.values(), *(self.expert_scales or ())]:
            if hasattr(vec, "reset_parameters"):
                vec.reset_parameters()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, site={self.site}, placement={self.placement}, key={self.key}"


def _fold_columns_(linear, u: torch.Tensor, group: Optional[int]) -> None:
    """``W (u ⊙ x)`` → ``(W diag u) x`` for the map after an absorbed branch; with per-head groups and a map
    that reads more heads (GQA), query head ``h`` reads kv head ``h // (H/K)``: u repeats per head."""
    w = linear.weight if isinstance(linear, nn.Module) else linear
    cols = w.shape[-1]
    if cols != u.numel():
        g = group or u.numel()
        u = u.view(-1, g).repeat_interleave(cols // u.numel(), 0).flatten()
    w.mul_(u.to(w).view(*([1] * (w.ndim - 1)), -1))


class OutputNorm(ScaleSite):
    """``γ ⊙ x / RMS(x)`` on a sublayer's output, before the residual add: output role."""

    def __init__(self, dim: int, strategy: ScaleStrategy, *, layer: int, site: str) -> None:
        super().__init__()
        self.layer, self.site, self.eps = layer, site, strategy.eps
        self.scale = strategy.make_vector(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps) if self.scale.is_identity else rms_norm(x, self.eps, self.scale())

    @torch.no_grad()
    def init_weights(self) -> None:
        if hasattr(self.scale, "reset_parameters"):
            self.scale.reset_parameters()

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        yield ScaleInfo(self.layer, self.site, "out", OUTPUT), self.scale
