"""Scale sites: a normalization together with everything that reads it.

- ``NormSite``: one parameter-free RMS normalization ``x̂ = x / RMS(x)``, computed once, and its consumer
  branches (attention: q, k, v; MLP: gate, up; MoE: router, routed experts, shared experts; the final
  norm: the LM head; a one-norm parallel block: q, k, v, gate, up). The site owns each consumer's weight, the
  input-side scale of each branch (one shared γ, or one per branch with HG), the output-side scale ``u`` and
  intermediate norm that a placement adds. Roles, consumers and the maps that absorb a branch's output
  (``absorbed_by``) are fixed when it is built.
- ``OutputNorm`` (``site_base.py``, with ``ScaleSite``, the base every site subclasses): a norm on a
  sublayer's output before the residual add (Gemma/OLMo-2 style).
The interface (what fold, convert, export, import and the MoE layer read; nothing outside ``scale/`` reads a
placement or the site's attributes):

- ``factors(name) -> Factors``: what branch ``name`` computes, as factors around its weight
  (``y = after ⊙ N_group(rows ⊙ W (columns ⊙ x̂))``, per expert where there are experts; ``branch.Factors``);
- ``weight(name)``, ``gamma(name)``, ``branches`` / ``by_name``: the declared branches and their weights;
- writing: ``input_scales()`` (each input-side γ with the branches it reads, per-expert γ_i included) and
  ``output_vector(name)`` (the vector holding a branch's output-side u), written through the ``ScaleVector``
  inverse (``scale.convert.set_scale_``);
- MoE: ``expert_factors(name)``, ``expert_output(name, h)``, ``expert_parameters()``;
- ``fold_()``, and for the registry ``scale_vectors()`` / ``consumers(vector)``.

Fast path (``NormSite.forward``): every 2-D consumer of one x̂ in one matmul, γ (and an un-normalized
u) applied to the weights (``scale/ops.py``); a normalized output side and RoPE (``scale/norm_rope.py``) run once over all
branches that share them (q and k together), saving no activation of their own.

Roles follow the absorbability rule: a scale that a linear map can absorb exactly is ``input`` role,
any other is ``output`` role. Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from typing import Iterator, Optional, Sequence

import torch
from torch import nn

from .branch import (Branch, Consumer, Factors, InputScale, MapRef, Projection, expand_u, fold_columns_,
                     resolve_map)
from .norm_rope import group_norm_rope
from .keeps import divides_size_out
from .ops import apply_rope, rms_norm, scaled_linear
from .strategy import ScaleStrategy, has_input_side, has_output_side, normalizes
from .tags import INPUT, OUTPUT, TAG_PREFIX, ScaleInfo, ScaleTag, layer_label, parse_scale_tag, scale_tag
from .vector import ScaleVector
from .site_base import OutputNorm, ScaleSite  # the base of every site, and the simplest one

__all__ = ["Branch", "Consumer", "Factors", "INPUT", "InputScale", "NormSite", "OUTPUT", "OutputNorm", "ScaleInfo",
           "ScaleSite", "ScaleTag", "TAG_PREFIX", "layer_label", "parse_scale_tag", "rms_norm", "scale_tag"]


class NormSite(ScaleSite):
    """``x̂ = x / RMS(x)`` once; each branch ``b`` computes ``u_b ⊙ [N](W_b (γ_b ⊙ x̂))`` (see module doc).

    ``forward(x, rope)`` returns one tensor per branch, in branch order (for expert branches: x̂ itself; their
    γ is on the weights, ``expert_factors``). ``branch_specific`` gives each branch its own γ (HG); ``scale_keys`` (branch → scale
    name) overrides the grouping. ``enabled=False``: a norm without learnable scales (final_norm: false).
    ``absorbed_by``: for each branch declared ``absorbed_downstream``, the map that reads its output linearly
    (a module with a ``weight``, or ``(owner, attribute)`` of a bare parameter): the fold of a normalized
    output scale goes into its columns. A missing or unexpected one is refused here, when the site is built.

    The library reads a site only through ``factors``, ``input_scales`` / ``output_vector`` (written through
    ``ScaleVector.set_gamma_``), ``divides_size_out``, ``scale_vectors`` / ``consumers`` and ``fold_``: a subclass
    that changes ``forward`` keeps every one of them true to it.
    """

    #: whether a normalized output scale ``u`` holds an exact 0, set before a compiled block runs (zero_check.py)
    u_has_zero: Optional[bool] = None

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
        absorbed_by: Optional[dict[str, MapRef]] = None,
    ) -> None:
        super().__init__()
        self.dim, self.layer, self.site, self.eps = dim, layer, site, strategy.eps
        self.proj_site = proj_site or site.replace("_input", "_proj")
        self.branches = tuple(branches)
        self.by_name = {b.name: b for b in self.branches}
        maps = dict(absorbed_by or {})
        for b in self.branches:
            if b.absorbed_downstream and b.name not in maps:
                raise ValueError(f"NormSite {site!r}: branch {b.name!r} is absorbed_downstream but absorbed_by names "
                                 f"no map for it; pass absorbed_by={{{b.name!r}: <the nn.Linear that reads it>}}")
        for name in maps:
            if name not in self.by_name or not self.by_name[name].absorbed_downstream:
                raise ValueError(f"NormSite {site!r}: absorbed_by names {name!r}, which is not a branch declared "
                                 f"absorbed_downstream=True (branches: {list(self.by_name)})")
        self.__dict__["_absorbed_by"] = maps  # plain references (not submodules): resolved when folding
        self.placement = {b.name: strategy.placement.of(b.key) if b.key else "input" for b in self.branches}
        head_shaped = strategy.output_shape == "head"
        self.proj = nn.ModuleDict()
        self.out_role: dict[str, str] = {}
        for b in self.branches:
            u = None
            if has_output_side(self.placement[b.name]):
                u = strategy.make_vector(b.group if (head_shaped and b.group) else b.out_features)
                self.out_role[b.name] = INPUT if (not self._normalizes(b.name) or b.absorbed_downstream) else OUTPUT
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
            self._normalizes(b) for b, key in self.key.items() if key == k)) for k in names})
        # MoE ``scales: expert``: one more γ_e per routed expert, on the columns of its gate/up weights
        self.expert_branches = tuple(b.name for b in self.branches if b.experts and b.name in scaled)
        self.expert_scales = (
            nn.ModuleList(strategy.make_vector(dim) for _ in range(per_expert))
            if per_expert and self.expert_branches else None
        )

    # -- the interface: what a branch computes --------------------------------------------------------------
    def weight(self, name: str) -> torch.Tensor:
        """The consumer weight of branch ``name`` (its parameter, without any scale)."""
        return self.proj[name].weight

    def gamma(self, name: str) -> Optional[torch.Tensor]:
        """Shared input-side γ of branch ``name`` (``None``: bare x̂); a per-expert γ_e comes on top of it."""
        key = self.key[name]
        if key is None or self.scales[key].is_identity:
            return None
        return self.scales[key]()

    def factors(self, name: str) -> Factors:
        """Branch ``name`` as factors around its weight (``branch.Factors``). Fold, convert, export, inspect and
        the architecture adapters read a branch through this alone, never through the site's attributes, so it
        describes exactly what ``forward`` computes for the branch (live tensors: detach to read values)."""
        b = self.by_name[name]
        norm = self._normalizes(name)
        u = self._u_full(b)
        absorbed = self.__dict__["_absorbed_by"].get(name)
        return Factors(
            name=name, weight=self.weight(name), columns=self._columns(name), rows=None if norm else u,
            norm_group=(b.group or b.out_features) if norm else None, after=u if norm else None,
            absorbed_by=None if absorbed is None else resolve_map(absorbed),
            setting=f"model.strategy.placement.{b.key or name}: {self.placement[name]!r}")

    def _columns(self, name: str) -> Optional[torch.Tensor]:
        """``[in]`` (the shared γ) or ``[E, in]`` (times each expert's γ_e)."""
        g, per = self.gamma(name), self._expert_columns(name)
        if per is None:
            return g
        return per if g is None else per * g.to(per.dtype)

    def _expert_columns(self, name: str) -> Optional[torch.Tensor]:
        """The per-expert γ_e ``[E, in]`` on branch ``name``'s stacked weight: the one place of that rule (every
        expert branch with an input side, when the site has per-expert scales)."""
        if name not in self.expert_branches or self.expert_scales is None or all(
                v.is_identity for v in self.expert_scales):
            return None
        return torch.stack([v() for v in self.expert_scales])

    def _normalizes(self, name: str) -> bool:
        return normalizes(self.placement[name])

    def _u(self, name: str) -> Optional[torch.Tensor]:
        vec = self.proj[name].out_scale
        return None if vec is None or vec.is_identity else vec()

    def _u_full(self, b: Branch) -> Optional[torch.Tensor]:
        u = self._u(b.name)
        return None if u is None else expand_u(u, b.out_features)

    # -- the interface: writing (convert, import) -------------------------------------------------------------
    def input_scales(self) -> list[InputScale]:
        """Every input-side scale vector with the branches whose columns it multiplies: the shared or per-branch
        γ first, then each routed expert's γ_i (``expert`` set: it reads that slice of the stacked weights)."""
        out = [InputScale(k, v, tuple(b for b, key in self.key.items() if key == k)) for k, v in self.scales.items()]
        out += [InputScale(f"expert{i}", v, self.expert_branches, i) for i, v in enumerate(self.expert_scales or ())]
        return out

    def output_vector(self, name: str) -> Optional[ScaleVector]:
        """The vector that holds branch ``name``'s output-side u (``None``: the branch has none); its ``dim`` is the
        branch's width, or one head (``group``) when head-shaped."""
        return self.proj[name].out_scale

    def divides_size_out(self, vector: ScaleVector) -> bool:
        """Every consumer branch of input scale ``vector`` normalizes its output (``scale/keeps.py``)."""
        return divides_size_out(self.input_scales(), self.placement, vector)

    # -- forward -------------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, rope: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> list[torch.Tensor]:
        xhat = rms_norm(x, self.eps)
        dense = [b for b in self.branches if not b.experts]
        outs: dict[str, torch.Tensor] = {}
        if dense:
            gammas = [self.gamma(b.name) for b in dense]
            rows = [None if self._normalizes(b.name) else self._u_full(b) for b in dense]
            y = scaled_linear(xhat, [self.weight(b.name) for b in dense], gammas, rows)
            outs.update(self._output_side(y, dense, rope))
        for b in self.branches:
            if b.experts:  # one tensor for every expert branch: their γ goes with the weights (expert_factors)
                outs[b.name] = xhat
        return [outs[b.name] for b in self.branches]

    def _output_side(self, y: torch.Tensor, dense: list[Branch], rope) -> dict[str, torch.Tensor]:
        """Split the fused output; runs of branches with the same (normalized, group, rotary) are handled as
        one tensor (q and k together through their per-head norm, u and RoPE)."""
        runs: list[tuple[tuple, list[Branch]]] = []
        for b in dense:
            norm = self._normalizes(b.name)
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
                us = [self._u(b.name) for b in members]
                u = None
                if any(t is not None for t in us):
                    u = torch.cat([(expand_u(t, b.out_features) if t is not None else part.new_ones(b.out_features))
                                   for t, b in zip(us, members)]).view(-1, group)
                cos, sin = rope if rotary else (None, None)
                known = self.u_has_zero if torch.compiler.is_compiling() else None  # zero_check.py
                part = group_norm_rope(part.unflatten(-1, (-1, group)), u, self.eps, cos, sin, known).flatten(-2)
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
    def expert_factors(self, name: str) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """``(W, columns, rows)`` of an expert branch, whose effective weight is ``diag(rows) W_e diag(columns_e)``:
        the stacked ``[E, out, in]`` weight, the input-side γ on its columns (``[in]``: the branch's γ;
        ``[E, in]``: times each expert's γ_e; None: none) and an un-normalized u on its rows (``[out]`` or None).
        ``forward`` gives every expert branch x̂ itself; ``model.experts.scaled_expert_matmul`` applies these."""
        u = None if self._normalizes(name) else self._u_full(self.by_name[name])
        return self.weight(name), self._columns(name), u

    def expert_output(self, name: str, h: torch.Tensor) -> torch.Tensor:
        """The output side of an expert branch on its projections ``h`` [M, out] (norm, then u)."""
        if not self._normalizes(name):
            return h
        u = self._u_full(self.by_name[name])
        return rms_norm(h, self.eps, None if u is None else u.to(h.dtype))

    def expert_parameters(self) -> list[nn.Parameter]:
        """The parameters that belong to one routed expert each: the stacked weights of the expert branches and
        the per-expert scale vectors (a token that does not route to an expert does not use its share)."""
        params = [self.weight(b.name) for b in self.branches if b.experts]
        return params + list(self.expert_scales.parameters() if self.expert_scales is not None else ())

    # -- registry, consumers, folding ------------------------------------------------------------------------
    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        """Each input-side γ (branch ``shared``, or the branch's key with HG; role ``input``, site ``site``), then
        each branch's output-side u (site ``proj_site`` or the branch's own; role ``input`` when a linear map
        absorbs it, else ``output``), then each routed expert's γ_i (branch ``expert<i>``, role ``input``)."""
        for key, vec in self.scales.items():
            yield ScaleInfo(self.layer, self.site, key, INPUT), vec
        for b in self.branches:
            vec = self.proj[b.name].out_scale
            if vec is not None:
                yield ScaleInfo(self.layer, b.proj_site or self.proj_site, b.name, self.out_role[b.name]), vec
        for i, vec in enumerate(self.expert_scales or ()):
            yield ScaleInfo(self.layer, self.site, f"expert{i}", INPUT), vec

    def consumers(self, vector: ScaleVector) -> Optional[list[Consumer]]:
        for key, vec in self.scales.items():
            if vec is vector:
                return [Consumer(self.weight(b.name), -1, b.name) for b in self.branches if self.key[b.name] == key]
        for b in self.branches:
            if self.proj[b.name].out_scale is vector and not self._normalizes(b.name):
                return [Consumer(self.weight(b.name), -2, b.name)]
        return None

    @torch.no_grad()
    def fold_(self) -> None:
        """Fold every input-role scale (from ``factors``): the columns and an un-normalized u into the branch's
        weight, a normalized u of an absorbed branch into the columns of the map that reads it (repeated per head
        when that map reads more heads than the branch has: grouped-query attention). Folded weights are new
        parameters (a tied LM head becomes untied)."""
        for b in self.branches:
            proj, f = self.proj[b.name], self.factors(b.name)
            if f.columns is not None or f.rows is not None:  # a new tensor: a tied head unties only when needed
                w = f.effective_weight().detach().to(proj.weight.dtype)
                proj.weight = nn.Parameter(w, requires_grad=proj.weight.requires_grad)
            if self.out_role.get(b.name) == INPUT and proj.out_scale is not None:
                if f.after is not None:
                    fold_columns_(f.absorbed_by, f.after.detach(), b.group)
                proj.out_scale = None
        self.scales = nn.ModuleDict()
        self.expert_scales = None
        self.key = dict.fromkeys(self.key)

    @torch.no_grad()
    def init_weights(self) -> None:
        """Re-initialize in place (``Transformer.reset_parameters`` calls it, also after a build on the meta
        device): every consumer weight N(0, ``init_std``²), and every scale vector of the site, input side, output
        side and per expert, through its own ``reset_parameters`` (a class without one is left as built)."""
        for proj in self.proj.values():
            proj.init_weights()
        for vec in [*self.scales.values(), *(self.expert_scales or ())]:
            if hasattr(vec, "reset_parameters"):
                vec.reset_parameters()

    def extra_repr(self) -> str:
        return f"dim={self.dim}, site={self.site}, placement={self.placement}, key={self.key}"
