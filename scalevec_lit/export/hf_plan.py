"""Which transformers architecture holds a folded model, and the refusals: every site that Llama, Qwen3,
Qwen3-MoE, Mixtral and Glm4-MoE cannot hold, named with its layers and the fix (``plan_hf``).

Plain torch: must not import Lightning or transformers, nor the hf / write / cli modules of this package.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..model.attention import CausalSelfAttention
from ..model.block import Block
from ..model.mlp import SwiGLU
from ..model.transformer import Transformer
from ..scale.registry import scale_parameters
from ..scale.strategy import NORMALIZED_PLACEMENT as DNP

NATIVE_HINT = "or export the native format (--format native: our state dict + spec, reloadable with build_from_spec)"


def _moe_class() -> Optional[type]:
    try:
        from ..model.moe import MoE
    except ImportError:  # pragma: no cover - a tree without the MoE module
        return None
    return MoE


def head_norm_weight(site, branch: str, head_dim: int) -> tuple[torch.Tensor, float]:
    """The per-head u of a normalized q/k branch (ones when none) and the spread between heads."""
    u = site.output_scale(branch)
    if u is None:
        return torch.ones(head_dim), 0.0
    per_head = u.detach().float().view(-1, head_dim)
    return per_head[0].clone(), float((per_head - per_head[0]).abs().max())


class _Refusals:
    """Problems by site, with the layers where they occur (one line per site in the message)."""

    def __init__(self, n_layer: int) -> None:
        self.n_layer, self.layers, self.amount = n_layer, {}, {}

    def add(self, problem: str, layer: Optional[int], amount: float = 0.0) -> None:
        """``layer`` None: a model-wide problem (no layer list in the message)."""
        self.layers.setdefault(problem, []).append(layer)
        self.amount[problem] = max(self.amount.get(problem, 0.0), amount)

    def lines(self) -> list[str]:
        out = []
        for problem, layers in self.layers.items():
            where = "" if layers == [None] else "every layer, " if len(layers) == self.n_layer else (
                "layer" + "s" * (len(layers) > 1) + " " + ", ".join(map(str, layers)) + ", ")
            if self.amount[problem]:
                problem = problem.replace("{amount}", f"{self.amount[problem]:.3g}")
            out.append(f"{where}{problem}, {NATIVE_HINT}")
        return out


def _check_attention(attn, i: int, r: _Refusals) -> None:
    site = attn.input
    if attn.out_norm is not None:
        r.add("attn_output: a sublayer output norm (model.strategy.sublayer_output_norm: true) has no place in "
              "Llama, Qwen3, Qwen3-MoE, Mixtral or Glm4-MoE; set it to false", i)
    if site.normalizes("v"):
        r.add(f"attn_proj.v: DNP on v ({site.placement_key('v')}) normalizes v per head, which no "
              "standard architecture does; use input, output or dual there", i)
    if site.normalizes("q") != site.normalizes("k"):
        bare = "k" if site.normalizes("q") else "q"
        r.add(f"attn_proj.{bare}: Qwen3's QK-norm normalizes both q and k, but {site.placement_key(bare)}; "
              f"set placement.q and placement.k both to {DNP}, or neither", i)
    elif site.normalizes("q"):
        for branch in ("q", "k"):
            amount = head_norm_weight(site, branch, attn.head_dim)[1]
            if amount > 0:
                r.add(f"attn_proj.{branch}: its output scale u (model.strategy.output_shape: 'channel') differs "
                      f"between heads (by up to {{amount}}), while Qwen3's {branch}_norm holds one weight of "
                      "size head_dim shared by all heads; train with model.strategy.output_shape: head", i, amount)


def _check_mlp(mlp, i: int, r: _Refusals, moe_cls: Optional[type]) -> None:
    if mlp.out_norm is not None:
        r.add("mlp_output: a sublayer output norm (model.strategy.sublayer_output_norm: true) has no place in "
              "Llama, Qwen3, Qwen3-MoE, Mixtral or Glm4-MoE; set it to false", i)
    dnp = "normalizes its output, which no standard architecture does; use input, output or dual there"
    site = mlp.input
    if type(mlp) is SwiGLU:
        for branch in ("gate", "up"):
            if site.normalizes(branch):
                r.add(f"mlp_proj.{branch}: DNP on {branch} ({site.placement_key(branch)}) {dnp}", i)
        return
    if moe_cls is None or type(mlp) is not moe_cls:
        r.add(f"block.mlp: {type(mlp).__qualname__} is neither SwiGLU nor MoE", i)
        return
    for branch in ("gate", "up"):
        if site.normalizes(branch):
            r.add(f"mlp_proj.expert*_{branch}: DNP on the experts' {branch} ({site.placement_key(branch)}) {dnp}", i)
    if site.normalizes("router"):
        r.add(f"mlp_proj.router: DNP on the router ({site.placement_key('router')}) {dnp}", i)
    if mlp.score == "sigmoid":  # Glm4-MoE: sigmoid router, selection bias, shared experts, dense first layers
        return
    glm = "Glm4-MoE has them, but its router is a sigmoid"
    if mlp.shared_down is not None:
        r.add("the shared experts (model.config.moe.num_shared_experts > 0) have no place in Qwen3-MoE or Mixtral "
              f"(routed experts only; {glm}); set num_shared_experts: 0 or router: sigmoid", i)
    bias = getattr(mlp, "expert_bias", None)
    if bias is not None and bool(bias.abs().max() > 0):
        r.add("the expert selection bias (model.config.moe.bias_balancing: true, max |bias| {amount}) shifts "
              f"which experts are chosen, and Qwen3-MoE and Mixtral routers hold no such bias ({glm}); train with "
              "bias_balancing: false or router: sigmoid", i, float(bias.abs().max()))


def plan_hf(model: nn.Module) -> tuple[Optional[str], list[str]]:
    """``(architecture, problems)`` for a folded model: problems empty when the architecture holds it."""
    if type(model) is not Transformer:
        return None, [f"the model is a {type(model).__name__}, not scalevec_lit's Transformer; {NATIVE_HINT}"]
    r, moe_cls = _Refusals(len(model.blocks)), _moe_class()
    for i, block in enumerate(model.blocks):
        if type(block) is not Block:
            r.add(f"model.block: {type(block).__qualname__} is not the Pre-Norm Block; use Block", i)
        elif type(block.attn) is not CausalSelfAttention:
            r.add(f"block.attn: {type(block.attn).__qualname__} is not CausalSelfAttention", i)
        else:
            _check_attention(block.attn, i, r)
            _check_mlp(block.mlp, i, r, moe_cls)
    attn0 = model.blocks[0].attn if type(model.blocks[0]) is Block else None
    qk_norm = attn0 is not None and attn0.input.normalizes("q") and attn0.input.normalizes("k")
    moe = model.config.moe if moe_cls is not None and any(type(b.mlp) is moe_cls for b in model.blocks) else None
    if moe is None:
        arch = "Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM"
    elif moe.router == "sigmoid":
        arch = "Glm4MoeForCausalLM"
    elif qk_norm:
        arch = "Qwen3MoeForCausalLM"
    elif attn0 is None or attn0.input.normalizes("q") or attn0.input.normalizes("k"):
        arch = None  # refused above: only q or only k normalized
    else:
        arch = "MixtralForCausalLM"
        why = "Mixtral (the softmax-routed MoE architecture without QK-norm)"
        fix = f"or train with placement.q and placement.k: {DNP} and output_shape: head (then Qwen3-MoE holds it)"
        if moe.first_dense_layers:
            r.add(f"the dense MLPs of the first {moe.first_dense_layers} layers (model.config.moe.first_dense_layers)"
                  f" have no place in {why}; set first_dense_layers: 0, {fix}", None)
        if not moe.route_norm:
            r.add(f"model.config.moe.route_norm: false leaves the top-k weights unnormalized, while {why} always "
                  f"normalizes them; set route_norm: true, {fix}", None)
    if r.layers:
        return None, r.lines()
    known = {id(b.attn.input.proj[n].out_scale) for b in model.blocks for n in ("q", "k")}
    left = [sp.name for sp in scale_parameters(model) if id(sp.vector) not in known]
    if left:
        return None, [f"scale parameters without a standard place after folding: {left[:4]}; {NATIVE_HINT}"]
    return arch, []
