"""Mixture-of-experts MLP: token-choice top-k router, SwiGLU experts computed per expert, balancing,
and the scale-vector sites of the MLP-input norm.

Lives here: ``MoE`` (the MLP sublayer of a block when ``config.moe`` is set), its routing and loss
functions (``route``, ``load_balancing_loss``, ``router_z_loss``), the grouped expert matmul, and the
per-expert scale sites (``ExpertScales``). Dropless: every token goes to its top-k experts, whatever
the load. Expert compute sorts the (token, expert) pairs by expert and runs one matmul per expert
(``torch._grouped_mm`` on stacked ``[E, out, in]`` weights, or a loop over the E experts), never a loop
over tokens.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..scale.sites import INPUT, OUTPUT, BranchScales, DualScaledLinear, OutputNorm, ScaleInfo, ScaleSite, rms_norm
from ..scale.sites import fold_columns_
from ..scale.strategy import ScaleStrategy, has_input_side, has_output_side
from ..scale.vector import ScaleVector
from .config import TransformerConfig


# -- routing and losses (pure functions) -------------------------------------------------------------
@dataclass
class Routing:
    logits: torch.Tensor  # [N, E] router logits, fp32
    probs: torch.Tensor  # [N, E] routing distribution: softmax, or sigmoid scores normalized to sum 1
    experts: torch.Tensor  # [N, k] selected experts (chosen on scores + bias)
    weights: torch.Tensor  # [N, k] combine weights (scores of the selected experts, never the bias), fp32


def route(
    logits: torch.Tensor, top_k: int, score: str = "softmax", bias: Optional[torch.Tensor] = None,
    normalize: bool = True,
) -> Routing:
    """Token-choice top-k. ``bias`` (aux-loss-free balancing) shifts the selection only."""
    logits = logits.float()
    scores = logits.softmax(-1) if score == "softmax" else torch.sigmoid(logits)
    select = scores if bias is None else scores + bias.to(scores)
    experts = select.topk(top_k, dim=-1).indices
    weights = scores.gather(-1, experts)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-20)
    probs = scores if score == "softmax" else scores / scores.sum(-1, keepdim=True).clamp_min(1e-20)
    return Routing(logits, probs, experts, weights)


def load_balancing_loss(probs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Switch/GShard balance loss ``E Σ_i f_i P_i`` (1 at a uniform load, up to E/k when collapsed).

    ``f_i`` = share of the N·k (token, expert) assignments that went to expert i (no gradient),
    ``P_i`` = mean routing probability of expert i over the N tokens (the gradient path).
    """
    num_experts = probs.shape[-1]
    f = counts.to(probs.dtype) / counts.sum().clamp_min(1)
    return num_experts * (f * probs.mean(0)).sum()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE router z-loss: mean over tokens of ``logsumexp(logits)²``."""
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def _in_backward() -> bool:
    """True while the autograd engine runs (an activation-checkpoint recompute)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


# -- expert matmul --------------------------------------------------------------------------------------
def _grouped_mm_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    # eager runs fp32/bf16/fp16; the compiled (meta) kernel of torch 2.13 accepts bf16 only
    dtypes = (torch.bfloat16,) if torch.compiler.is_compiling() else (torch.float32, torch.bfloat16, torch.float16)
    ok_dtype = x.dtype in dtypes and w.dtype == x.dtype
    align = 16 // x.element_size()
    return hasattr(torch, "_grouped_mm") and ok_dtype and x.shape[-1] % align == 0 and w.shape[1] % align == 0


def expert_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, mode: str = "auto") -> torch.Tensor:
    """Rows of ``x`` [M, in] grouped by expert (``counts`` [E] rows each, in order) times ``w`` [E, out, in]ᵀ.

    ``grouped_mm`` is one kernel without a host sync; ``loop`` is one matmul per expert (reads the
    counts on the host). ``auto`` takes grouped_mm where it runs.
    """
    if mode == "grouped_mm" or (mode == "auto" and _grouped_mm_runs(x, w)):
        offs = counts.cumsum(0).to(torch.int32)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        if y.requires_grad:  # its backward refuses stride-0 (expanded) gradients
            y.register_hook(lambda g: g.contiguous())
        return y
    out, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if n:
            out.append(x[start : start + n] @ w[e].transpose(0, 1))
            start += n
    return torch.cat(out) if out else x.new_zeros(0, w.shape[1])


# -- per-expert scale sites -------------------------------------------------------------------------------
class ExpertScales(ScaleSite):
    """One scale vector per expert (a list of E parameterizations), stacked to ``[E, dim]`` when used.

    Input side (site ``mlp_input``, branch ``expert<i>``): γ_e multiplies expert e's input, folds into
    its W_gate/W_up. Output side (site ``mlp_proj``, branch ``expert<i>_gate``/``_up``): u_e after that
    expert's projection, role as in ``DualScaledLinear``.
    """

    def __init__(self, dim: int, num: int, strategy: ScaleStrategy, *, layer: int, site: str, branch: str, role: str):
        super().__init__()
        self.layer, self.site, self.branch, self.role = layer, site, branch, role
        self.vectors = nn.ModuleList(strategy.make_vector(dim) for _ in range(num))

    def stacked(self) -> Optional[torch.Tensor]:
        if all(v.is_identity for v in self.vectors):
            return None
        return torch.stack([v() for v in self.vectors])

    def scale_vectors(self) -> Iterator[tuple[ScaleInfo, ScaleVector]]:
        for i, vec in enumerate(self.vectors):
            yield ScaleInfo(self.layer, self.site, self.branch.format(i=i), self.role), vec

    def extra_repr(self) -> str:
        return f"site={self.site}, branch={self.branch}, role={self.role}"


class SharedExperts(nn.Module):
    """Always-on experts (DeepSeek-MoE style): one SwiGLU of width ``num_shared · f``, reading the
    normalized input that the MoE's norm gives branches ``shared_gate`` and ``shared_up``."""

    def __init__(self, d: int, f: int, strategy: ScaleStrategy, layer: int) -> None:
        super().__init__()
        pl = strategy.placement
        common = dict(strategy=strategy, layer=layer, site="mlp_proj")
        self.gate = DualScaledLinear(d, f, placement=pl.gate, branch="shared_gate", **common)
        self.up = DualScaledLinear(d, f, placement=pl.up, branch="shared_up", absorbed_downstream=True, **common)
        self.down = nn.Linear(f, d, bias=False)  # named ``down``: depth-scaled init in Transformer

    def forward(self, xg: torch.Tensor, xu: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(xg)) * self.up(xu))

    @torch.no_grad()
    def fold_(self, gamma_gate: Optional[torch.Tensor], gamma_up: Optional[torch.Tensor]) -> None:
        for gamma, proj in ((gamma_gate, self.gate), (gamma_up, self.up)):
            if gamma is not None:
                proj.fold_input_(gamma)
        if self.gate.out_scale is not None and self.gate.out_role == INPUT:
            self.gate.fold_output_()
        if self.up.out_scale is not None:
            if self.up.normalize:
                fold_columns_(self.down, self.up.take_output_scale_())
            else:
                self.up.fold_output_()


# -- the MoE sublayer ------------------------------------------------------------------------------------
class MoE(nn.Module):
    """The MoE MLP sublayer of a Pre-Norm block, norm included; returns the residual-branch output.

    ::

        x ─> RMS(x) ─┬─ γ_router ⊙ ─> W_router ─> [N] [u ⊙] ─> softmax|sigmoid ─┬─ (+ bias) top-k ─> experts
                     │                                                          └─ gather ─> weights
                     ├─ γ_gate ⊙ ┐  sort (token, expert) pairs by expert; per expert e:
                     └─ γ_up   ⊙ ┴─> W_down,e( silu([u ⊙] W_gate,e x) ⊙ [u ⊙] W_up,e x ) ─> Σ_k weight · ─(+)─> y
                       (shared experts: the same SwiGLU on every token) ─────────────────────────────┘

    Scale sites of the MLP-input norm (``config.moe.scales``, all input role, all foldable):
    ``shared``: one γ for router and experts; ``branch``: γ_router and γ_experts, or γ_router, γ_gate,
    γ_up when the strategy is branch-specific; ``expert``: γ_router and one γ_e per routed expert (applied
    to W_gate,e and W_up,e) and one for the shared experts.

    After each forward: ``last_aux_losses`` (weighted, differentiable: ``moe_aux_loss``, ``moe_z_loss``)
    and ``last_load_stats`` (detached, see ``_record``).
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        super().__init__()
        moe = config.moe
        if moe is None:
            raise ValueError("MoE needs model.config.moe")
        d, f, E = config.n_embd, moe.expert_intermediate_size, moe.num_experts
        self.layer, self.num_experts, self.top_k = layer, E, moe.top_k
        self.score, self.route_norm, self.matmul_mode = moe.router, moe.route_norm, moe.expert_matmul
        self.aux_loss_coef, self.z_loss_coef = moe.aux_loss_coef, moe.z_loss_coef
        self.bias_balancing, self.bias_update_rate = moe.bias_balancing, moe.bias_update_rate
        self.init_std, self.depth_std = config.init_std, config.init_std / math.sqrt(2 * config.n_layer)
        self.eps = strategy.eps
        pl = strategy.placement
        self.gate_placement, self.up_placement = pl.gate, pl.up

        branches = ["router", "gate", "up"] + (["shared_gate", "shared_up"] if moe.num_shared_experts else [])
        placements = {"router": pl.router, "gate": pl.gate, "up": pl.up, "shared_gate": pl.gate, "shared_up": pl.up}
        self.norm = BranchScales(
            d, branches, strategy, layer=layer, site="mlp_input", placements=placements,
            keys=self._scale_keys(moe.scales, strategy.branch_specific),
        )
        common = dict(strategy=strategy, layer=layer)
        self.expert_scales = (
            ExpertScales(d, E, site="mlp_input", branch="expert{i}", role=INPUT, **common)
            if moe.scales == "expert" and (has_input_side(pl.gate) or has_input_side(pl.up))
            else None
        )
        self.router = DualScaledLinear(d, E, placement=pl.router, site="mlp_proj", branch="router", **common)
        self.expert_gate = nn.Parameter(torch.empty(E, f, d))
        self.expert_up = nn.Parameter(torch.empty(E, f, d))
        self.expert_down = nn.Parameter(torch.empty(E, d, f))  # named ``expert_down``: depth-scaled init
        self.gate_out = (
            ExpertScales(f, E, site="mlp_proj", branch="expert{i}_gate",
                         role=OUTPUT if pl.gate == "dual_norm" else INPUT, **common)
            if has_output_side(pl.gate) else None
        )
        self.up_out = (
            ExpertScales(f, E, site="mlp_proj", branch="expert{i}_up", role=INPUT, **common)
            if has_output_side(pl.up) else None
        )
        self.shared = SharedExperts(d, moe.num_shared_experts * f, strategy, layer) if moe.num_shared_experts else None
        self.out_norm = OutputNorm(d, strategy, layer=layer, site="mlp_output") if strategy.sublayer_output_norm else None
        if self.bias_balancing:
            self.register_buffer("expert_bias", torch.zeros(E))
        self.pending_load: Optional[torch.Tensor] = None  # not a buffer: DDP must not broadcast it
        self.last_aux_losses: dict[str, torch.Tensor] = {}
        self.last_load_stats: dict[str, torch.Tensor] = {}
        if self.expert_gate.device.type != "meta":
            self.reset_parameters()

    def __getstate__(self) -> dict:
        """Copies and pickles leave out the last forward's outputs (its losses hold autograd graphs,
        which ``copy.deepcopy``, and so ``fold_scales``, cannot copy)."""
        state = self.__dict__.copy()
        state["last_aux_losses"], state["last_load_stats"] = {}, {}
        return state

    @staticmethod
    def _scale_keys(scales: str, branch_specific: bool) -> dict[str, Optional[str]]:
        if scales == "shared":
            return dict.fromkeys(("router", "gate", "up", "shared_gate", "shared_up"), "shared")
        if scales == "branch":
            gate, up = ("gate", "up") if branch_specific else ("experts", "experts")
            return {"router": "router", "gate": gate, "up": up, "shared_gate": gate, "shared_up": up}
        return {"router": "router", "gate": None, "up": None, "shared_gate": "shared_experts", "shared_up": "shared_experts"}

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Experts' gate/up: N(0, init_std²); down: depth-scaled. The router and shared experts are
        ``nn.Linear`` (initialized by ``Transformer``); the balancing bias restarts at 0."""
        nn.init.normal_(self.expert_gate, 0.0, self.init_std)
        nn.init.normal_(self.expert_up, 0.0, self.init_std)
        nn.init.normal_(self.expert_down, 0.0, self.depth_std)
        if self.bias_balancing:
            self.expert_bias.zero_()
        self.pending_load = None

    # -- forward -------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        ins = dict(zip(self.norm.branches, self.norm(x.reshape(-1, shape[-1]))))
        if self.training and self.bias_balancing and not _in_backward():
            self._update_bias_()
        r = route(self.router(ins["router"]), self.top_k, self.score,
                  self.expert_bias if self.bias_balancing else None, self.route_norm)
        n, k = r.experts.shape
        flat = r.experts.flatten()
        sorted_experts, order = flat.sort(stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts)
        y_sorted = self._experts(ins["gate"], ins["up"], order // k, sorted_experts, counts)
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
        y_pairs = y_sorted[inverse].view(n, k, -1)  # back to (token, slot) order: a gather, no atomics
        y = torch.einsum("nkd,nk->nd", y_pairs, r.weights.to(y_pairs.dtype))
        if self.shared is not None:
            y = y + self.shared(ins["shared_gate"], ins["shared_up"]).to(y.dtype)
        if self.out_norm is not None:
            y = self.out_norm(y)
        self._record(r, counts)
        return y.view(*shape[:-1], y.shape[-1])

    def _experts(
        self, xg: torch.Tensor, xu: torch.Tensor, token: torch.Tensor, sorted_experts: torch.Tensor,
        counts: torch.Tensor,
    ) -> torch.Tensor:
        wg, wu, wd = self.expert_gate, self.expert_up, self.expert_down
        gamma = self.expert_scales.stacked() if self.expert_scales is not None else None
        if gamma is not None:  # one γ per expert, applied on the weights (its folded form)
            if has_input_side(self.gate_placement):
                wg = wg * gamma[:, None, :].to(wg.dtype)
            if has_input_side(self.up_placement):
                wu = wu * gamma[:, None, :].to(wu.dtype)
        dtype = torch.get_autocast_dtype(xg.device.type) if torch.is_autocast_enabled(xg.device.type) else wg.dtype
        wg, wu, wd = wg.to(dtype), wu.to(dtype), wd.to(dtype)
        xs_g = xg[token].to(dtype)
        xs_u = xs_g if xu is xg else xu[token].to(dtype)
        mm = lambda a, w: expert_matmul(a, w, counts, self.matmul_mode)  # noqa: E731
        hg = self._output_side(mm(xs_g, wg), self.gate_out, self.gate_placement, sorted_experts)
        hu = self._output_side(mm(xs_u, wu), self.up_out, self.up_placement, sorted_experts)
        return mm(F.silu(hg) * hu, wd)

    def _output_side(
        self, h: torch.Tensor, site: Optional[ExpertScales], placement: str, sorted_experts: torch.Tensor
    ) -> torch.Tensor:
        if placement == "dual_norm":
            h = rms_norm(h, self.eps)
        u = site.stacked() if site is not None else None
        return h if u is None else h * u.to(h.dtype)[sorted_experts]

    # -- balancing and statistics -----------------------------------------------------------------------
    @torch.no_grad()
    def _update_bias_(self) -> None:
        """Aux-loss-free balancing: ``b_i += rate · sign(mean load − load_i)``, then centred.

        Applied at the start of the next training forward from the load the previous ones saw (so an
        activation-checkpoint recompute selects exactly as its forward did); the load is summed over
        ranks first so that every rank keeps the same bias.
        """
        load = self.pending_load
        if load is None:
            return
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(load)
        self.expert_bias.add_(self.bias_update_rate * torch.sign(load.mean() - load))
        self.expert_bias.sub_(self.expert_bias.mean())
        self.pending_load = None

    def _record(self, r: Routing, counts: torch.Tensor) -> None:
        losses: dict[str, torch.Tensor] = {}
        balance = z = None
        if self.aux_loss_coef > 0:
            balance = load_balancing_loss(r.probs, counts)
            losses["moe_aux_loss"] = self.aux_loss_coef * balance
        if self.z_loss_coef > 0:
            z = router_z_loss(r.logits)
            losses["moe_z_loss"] = self.z_loss_coef * z
        if _in_backward():  # activation-checkpoint recompute: same ops as the forward, nothing recorded
            return
        self.last_aux_losses = losses
        with torch.no_grad():
            frac = counts.float() / counts.sum().clamp_min(1)
            p = r.probs.detach()
            entropy = -(p * p.clamp_min(1e-20).log()).sum(-1).mean()
            stats = {
                "tokens_per_expert": counts.detach().float(),
                "fraction": frac,  # share of the N·k assignments per expert; uniform = 1/E
                "load_max_over_mean": frac.max() * self.num_experts,
                "load_min_over_mean": frac.min() * self.num_experts,
                "unused_experts": (counts == 0).sum().float(),
                "router_entropy": entropy,  # nats per token; uniform routing = ln E
                "router_entropy_norm": entropy / max(math.log(self.num_experts), 1e-20),
                "aux_loss": (balance if balance is not None else load_balancing_loss(p, counts)).detach(),
                "z_loss": (z if z is not None else router_z_loss(r.logits.detach())).detach(),
            }
            if self.bias_balancing:
                stats["bias_spread"] = self.expert_bias.max() - self.expert_bias.min()
                if self.training:
                    c = counts.detach().float()
                    self.pending_load = c if self.pending_load is None else self.pending_load + c
            self.last_load_stats = stats

    # -- folding and counting ---------------------------------------------------------------------------
    @torch.no_grad()
    def fold_scales_(self) -> None:
        """Fold every input-role scale: γ_router into W_router, γ_gate/γ_up/γ_e into each expert's
        W_gate/W_up, un-normalized u into their own map, normalized u on up into W_down,e."""
        gamma = self.norm.gamma("router")
        if gamma is not None:
            self.router.fold_input_(gamma)
        if self.router.out_scale is not None and self.router.out_role == INPUT:
            self.router.fold_output_()
        for branch, w in (("gate", self.expert_gate), ("up", self.expert_up)):
            gamma = self.norm.gamma(branch)
            if gamma is not None:
                w.mul_(gamma.to(w)[None, None, :])
        if self.expert_scales is not None:
            gamma = self.expert_scales.stacked()
            if gamma is not None:
                for placement, w in ((self.gate_placement, self.expert_gate), (self.up_placement, self.expert_up)):
                    if has_input_side(placement):
                        w.mul_(gamma.to(w)[:, None, :])
            self.expert_scales = None
        if self.shared is not None:
            self.shared.fold_(self.norm.gamma("shared_gate"), self.norm.gamma("shared_up"))
        self.norm.drop_scales_()
        if self.gate_out is not None and self.gate_out.role == INPUT:
            u = self.gate_out.stacked()
            if u is not None:
                self.expert_gate.mul_(u.to(self.expert_gate)[:, :, None])
            self.gate_out = None
        if self.up_out is not None:
            u = self.up_out.stacked()
            if u is not None:
                if self.up_placement == "dual_norm":  # W_down,e reads u_e ⊙ N(h): fold into its columns
                    self.expert_down.mul_(u.to(self.expert_down)[:, None, :])
                else:
                    self.expert_up.mul_(u.to(self.expert_up)[:, :, None])
            self.up_out = None

    def inactive_parameters_per_token(self) -> int:
        """Parameters of the E − k routed experts a token does not use (weights and per-expert scales)."""
        per_expert = [self.expert_gate, self.expert_up, self.expert_down]
        for site in (self.expert_scales, self.gate_out, self.up_out):
            if site is not None:
                per_expert.extend(site.parameters())
        total = sum(p.numel() for p in per_expert)
        return total // self.num_experts * (self.num_experts - self.top_k)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, router={self.score}, "
            f"bias_balancing={self.bias_balancing}, matmul={self.matmul_mode}"
        )
