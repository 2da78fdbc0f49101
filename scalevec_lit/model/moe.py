"""Mixture-of-experts MLP: token-choice top-k router, SwiGLU experts computed per expert, balancing.

Lives here: ``MoE`` (the MLP sublayer of a block when ``config.moe`` is set). Its routing and losses
are ``routing.py`` (``route``, ``load_balancing_loss``, ``router_z_loss``), the grouped expert matmul is
``experts.py``, and the SwiGLU product of routed and shared experts is the dense MLP's (``mlp.swiglu``). The
MLP-input norm with every map that reads it (router, routed experts, shared experts) and their scales
is one ``NormSite`` (``scalevec_lit.scale``); this module holds no scale or placement logic. Dropless: every token goes to its top-k experts, whatever
the load. Expert compute sorts the (token, expert) pairs by expert and runs one matmul per expert
(``torch._grouped_mm`` on stacked ``[E, out, in]`` weights, or a loop over the E experts), never a loop
over tokens.

No host read in a training step: the counts and the grouped matmul's offsets stay on the device
(``routing.group_by_expert``), the losses, statistics and the balancing bias update are device ops, and
the forward compiles whole (``torch.compile(fullgraph=True)``, with or without activation checkpointing;
``tests/test_moe_compile.py``). ``MoELoadMonitor`` reads the statistics on logging steps only.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import math
import torch
from torch import nn

from ..scale.sites import Branch, NormSite, OutputNorm
from ..scale.strategy import ScaleStrategy
from .config import TransformerConfig
from .experts import _in_backward, expert_matmul, scaled_expert_matmul
from .mlp import swiglu
from .routing import Grouping, Routing, group_by_expert, load_balancing_loss, route, router_z_loss

__all__ = ["Grouping", "MoE", "Routing", "expert_matmul", "group_by_expert", "load_balancing_loss", "route",
           "router_z_loss"]


def _forward_only_side_effects_in_compiled_checkpoints() -> None:
    """Let a compiled activation checkpoint keep this layer's recording forward-only.

    The layer records its losses and statistics (Python attributes) and queues its load in the forward;
    an eager recompute skips that (``_in_backward``). Dynamo refuses any Python side effect inside a
    checkpoint that it compiles (it could not replay it in the backward) unless this flag says that it
    need not: exactly the eager semantics here. Set once, when an MoE layer is built (a global setting
    of ``torch._dynamo``, as torchtitan sets its own for compiled MoE).
    """
    import torch._dynamo

    torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True


# -- the MoE sublayer ------------------------------------------------------------------------------------
class MoE(nn.Module):
    """The MoE MLP sublayer of a Pre-Norm block, norm included; returns the residual-branch output.

    ::

        x ─> RMS(x) ─┬─ γ_router ⊙ ─> W_router ─> [N] [u ⊙] ─> softmax|sigmoid ─┬─ (+ bias) top-k ─> experts
                     │                                                          └─ gather ─> weights
                     ├─ γ_gate ⊙ ┐  sort (token, expert) pairs by expert; per expert e:
                     └─ γ_up   ⊙ ┴─> W_down,e( silu([u ⊙] W_gate,e x) ⊙ [u ⊙] W_up,e x ) ─> Σ_k weight · ─(+)─> y
                       (shared experts: the same SwiGLU on every token) ─────────────────────────────┘

    Everything left of the expert sort is one ``NormSite`` (``self.input``). Its scales: one γ read by
    router and every expert (the baseline, as Mixtral and Qwen3-MoE); with ``model.strategy.branch_specific``
    one γ each for the router, gate and up (shared experts read gate's and up's); with
    ``model.config.moe.scales: expert`` one γ for the router, one γ_e per routed expert (on W_gate,e and
    W_up,e) and one for the shared experts. An output-side u of the experts is one vector per branch,
    shared by all experts.

    After each forward: ``last_aux_losses`` (weighted, differentiable: ``moe_aux_loss``, ``moe_z_loss``)
    and ``last_load_stats`` (detached, see ``_record``).
    """

    def __init__(self, config: TransformerConfig, layer: int, strategy: ScaleStrategy) -> None:
        super().__init__()
        moe = config.moe
        if moe is None:
            raise ValueError("MoE needs model.config.moe")
        if moe.scales == "expert" and strategy.branch_specific:
            raise ValueError(
                "model.config.moe.scales: 'expert' with model.strategy.branch_specific: true: per-expert scales "
                "are shared by each expert's gate and up, so branch-specific gate/up scales cannot exist; set "
                "moe.scales: shared (router, gate and up then each get their own γ) or branch_specific: false"
            )
        d, f, E = config.n_embd, moe.expert_intermediate_size, moe.num_experts
        self.layer, self.num_experts, self.top_k = layer, E, moe.top_k
        self.score, self.route_norm, self.matmul_mode = moe.router, moe.route_norm, moe.expert_matmul
        self.aux_loss_coef, self.z_loss_coef = moe.aux_loss_coef, moe.z_loss_coef
        self.bias_balancing, self.bias_update_rate = moe.bias_balancing, moe.bias_update_rate
        self.depth_std = config.residual_init_std
        fs = moe.num_shared_experts * f
        branches = [Branch("router", E), Branch("gate", f, experts=E), Branch("up", f, experts=E, absorbed_downstream=True)]
        if fs:
            branches += [Branch("shared_gate", fs, follows="gate"),
                         Branch("shared_up", fs, follows="up", absorbed_downstream=True)]
        per_expert = moe.scales == "expert"
        keys = ({"router": "router", "gate": None, "up": None, "shared_gate": "shared_experts",
                 "shared_up": "shared_experts"} if per_expert else None)
        shared_down = nn.Linear(fs, d, bias=False) if fs else None  # registered after the site (state dict order)
        # the maps that read up's and shared_up's output linearly (the site folds a normalized u into them);
        # expert_down is a bare parameter of this module, named by attribute so the reference never goes stale
        absorbed = {"up": (self, "expert_down"), **({"shared_up": shared_down} if fs else {})}
        self.input = NormSite(d, branches, strategy, layer=layer, site="mlp_input", init_std=config.init_std,
                              scale_keys=keys, per_expert=E if per_expert else 0, absorbed_by=absorbed)
        self.expert_down = nn.Parameter(torch.empty(E, d, f))
        self.shared_down = shared_down
        self.out_norm = OutputNorm(d, strategy, layer=layer, site="mlp_output") if strategy.sublayer_output_norm else None
        if self.bias_balancing:
            self.register_buffer("expert_bias", torch.zeros(E))
            # tokens per expert since the last update, summed over ranks (the same on every rank, so DDP's
            # broadcast of buffers changes nothing); not saved
            self.register_buffer("pending_load", torch.zeros(E), persistent=False)
        self.last_aux_losses: dict[str, torch.Tensor] = {}
        self.last_load_stats: dict[str, torch.Tensor] = {}
        if self.expert_down.device.type != "meta":
            self.init_weights()
        _forward_only_side_effects_in_compiled_checkpoints()

    def __getstate__(self) -> dict:
        """Copies and pickles leave out the last forward's outputs (its losses hold autograd graphs,
        which ``copy.deepcopy``, and so ``fold_scales``, cannot copy)."""
        state = self.__dict__.copy()
        state["last_aux_losses"], state["last_load_stats"] = {}, {}
        return state

    @torch.no_grad()
    def init_weights(self) -> None:
        """The down maps write into the residual stream: N(0, init_std²/(2 L)); the balancing bias restarts
        at 0. Router, experts' gate/up and shared experts' gate/up belong to the site (N(0, init_std²))."""
        nn.init.normal_(self.expert_down, 0.0, self.depth_std)
        if self.shared_down is not None:
            nn.init.normal_(self.shared_down.weight, 0.0, self.depth_std)
        if self.bias_balancing:
            self.expert_bias.zero_()
            self.pending_load.zero_()

    # -- forward -------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        outs = dict(zip((b.name for b in self.input.branches), self.input(x.reshape(-1, shape[-1]))))
        recording = not _in_backward()  # an eager activation-checkpoint recompute records nothing
        if self.training and self.bias_balancing and recording:
            self._update_bias_()
        r = route(outs["router"], self.top_k, self.score,
                  self.expert_bias if self.bias_balancing else None, self.route_norm)
        n, k = r.experts.shape
        g = group_by_expert(r.experts, self.num_experts)
        y_sorted = self._experts(outs["gate"], g.token, g.offsets)
        y_pairs = y_sorted[g.inverse].view(n, k, -1)  # back to (token, slot) order: a gather, no atomics
        y = torch.einsum("nkd,nk->nd", y_pairs, r.weights.to(y_pairs.dtype))
        if self.shared_down is not None:
            y = y + swiglu(outs["shared_gate"], outs["shared_up"], self.shared_down).to(y.dtype)
        if self.out_norm is not None:
            y = self.out_norm(y)
        self._record(r, g, recording)
        return y.view(*shape[:-1], y.shape[-1])

    def _experts(self, xhat: torch.Tensor, token: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The routed experts on the (token, slot) rows sorted by expert: x̂ gathered once for gate and up,
        each branch's γ (and an un-normalized u) applied to its weights, which are never saved
        (``scaled_expert_matmul``)."""
        wd = self.expert_down
        dtype = torch.get_autocast_dtype(xhat.device.type) if torch.is_autocast_enabled(xhat.device.type) else wd.dtype
        xs = xhat[token].to(dtype)
        mode = self.matmul_mode
        hg, hu = [self.input.expert_output(name, scaled_expert_matmul(xs, *self.input.expert_factors(name), offsets, mode))
                  for name in ("gate", "up")]
        return swiglu(hg, hu, lambda h: expert_matmul(h, wd.to(dtype), offsets, mode))

    # -- balancing and statistics -----------------------------------------------------------------------
    @torch.no_grad()
    def _update_bias_(self) -> None:
        """Aux-loss-free balancing: ``b_i += rate · sign(mean load − load_i)``, the step centred (Σ b = 0).

        Applied at the start of the next training forward from the load the previous ones saw (so an
        activation-checkpoint recompute selects exactly as its forward did); the load was summed over
        ranks when it was queued, so every rank keeps the same bias. Nothing queued: a zero step. Device
        ops only (no test of the queue on the host).

        Both buffers are rebound to new tensors, never changed in place: a compiled activation checkpoint
        recomputes the routing in the backward from the tensors the forward read, which must still hold
        the values it read (an in-place update would change the recomputed selection).
        """
        load = self.pending_load
        step = self.bias_update_rate * torch.sign(load.mean() - load)
        self.expert_bias = self.expert_bias + (step - step.mean())
        self.pending_load = torch.zeros_like(load)

    def _record(self, r: Routing, g: Grouping, recording: bool) -> None:
        counts = g.counts
        losses: dict[str, torch.Tensor] = {}
        balance = z = None
        if self.aux_loss_coef > 0:
            balance = load_balancing_loss(r.probs, counts)
            losses["moe_aux_loss"] = self.aux_loss_coef * balance
        if self.z_loss_coef > 0:
            z = router_z_loss(r.logits)
            losses["moe_z_loss"] = self.z_loss_coef * z
        if not recording:  # activation-checkpoint recompute: same ops as the forward, nothing recorded
            return
        self.last_aux_losses = losses
        with torch.no_grad():
            c = counts.float()
            frac = c / counts.sum().clamp_min(1)
            p = r.probs.detach()
            entropy = -(p * p.clamp_min(1e-20).log()).sum(-1).mean()
            stats = {
                "tokens_per_expert": c,
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
                    load = c.clone()
                    if torch.distributed.is_available() and torch.distributed.is_initialized():
                        torch.distributed.all_reduce(load)
                    self.pending_load = self.pending_load + load  # rebound, as in _update_bias_
            self.last_load_stats = stats

    # -- counting -------------------------------------------------------------------------------------------
    def inactive_parameters_per_token(self) -> int:
        """Parameters of the E − k routed experts a token does not use (weights and per-expert scales)."""
        per_expert = [*self.input.expert_parameters(), self.expert_down]
        total = sum(p.numel() for p in per_expert)
        return total // self.num_experts * (self.num_experts - self.top_k)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, top_k={self.top_k}, router={self.score}, "
            f"bias_balancing={self.bias_balancing}, matmul={self.matmul_mode}"
        )
