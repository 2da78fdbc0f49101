"""The two fused operations behind every scale site, each an exact autograd function that saves no
activation beyond what its neighbours save anyway.

- ``scaled_linear(x, weights, col_scales, row_scales)``: ``x @ cat_b(diag(u_b) W_b diag(γ_b))ᵀ`` — all
  consumer maps of one normalized input in one matmul, the input-side scales γ (and un-normalized
  output-side scales u) applied to the *weights*, never to the ``B×T×d`` activations. The effective weight
  is recomputed in the backward instead of being saved: the function saves ``x`` and the parameters only.
- ``group_norm_rope``: the per-head norm, output scale and RoPE of q and k, in ``norm_rope.py`` (which builds on
  this file's ``rms_norm``, ``apply_rope`` and ``backward_only``; this file imports nothing from it).

Both stay autograd functions under ``torch.compile`` too: the plain torch composition in their place under
compile was measured (benchmarks/compiled.py, 2026-12-04, before ``backward_only``: inductor, dense and MoE
smoke shapes) no faster within the noise, and ``group_norm_rope``'s made compiled unified save 2 MiB more
(1.08× baseline instead of 1.06×; ``scaled_linear``'s changed nothing). Under compile their backwards pass
what they recompute through ``backward_only``, so the compiler keeps no copy of it (1.003× now).

Second derivatives: ``group_norm_rope`` is twice differentiable inside ``higher_order()`` (its plain
composition) and refuses ``create_graph=True`` outside it; ``scaled_linear`` always is (``higher_order.py``).

Also the rotate-half RoPE (``apply_rope``) that both this module and the model use.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from .higher_order import higher_order, higher_order_enabled  # noqa: F401  (re-exported: ops.higher_order)


def rms_norm(x: torch.Tensor, eps: float, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Parameter-free RMS normalization over the last dim (optionally times ``weight``)."""
    return F.rms_norm(x, (x.shape[-1],), weight=weight, eps=eps)


# -- RoPE (rotate-half convention, as Llama/Qwen checkpoints in transformers) --------------------------------
def _rotate(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor, T: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return cos[:T, None, :].to(dtype), sin[:T, None, :].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[B, T, H, D]`` by position; cos/sin are ``[≥T, D]``."""
    c, s = _rope_tables(cos, sin, x.shape[1], x.dtype)
    return x * c + _rotate(x) * s


# -- keeping the compiler's partitioner from saving what a backward recomputes --------------------------------
@torch.library.custom_op("scalevec::one_after", mutates_args=())
def _one_after(g: torch.Tensor) -> torch.Tensor:
    """The scalar 1 in ``g``'s dtype, computed only once ``g`` exists (the compiler cannot look inside)."""
    return torch.ones((), dtype=g.dtype, device=g.device)


@_one_after.register_fake
def _(g):
    return g.new_empty(())


def backward_only(t: torch.Tensor, gy: torch.Tensor) -> torch.Tensor:
    """``t`` itself, made to depend on the incoming gradient ``gy`` under ``torch.compile`` (``t · 1``, exact).

    A backward that recomputes something from forward values alone (an effective weight ``W diag(γ)``, the
    normalized input from a kept output) gives AOTAutograd's partitioner the choice to compute it in the
    forward instead and save it; measured, it did (compiled baseline kept every effective weight, compiled
    unified a q/k-sized tensor beside the output attention keeps anyway). Multiplying the small operand the
    recomputation starts from by a 1 that exists only in the backward leaves it no such choice; inductor
    fuses the multiply. Eager: ``t`` unchanged."""
    if not torch.compiler.is_compiling():
        return t
    return t * _one_after(gy)


# -- scaled_linear -------------------------------------------------------------------------------------------
def _effective_weight(ws, gs, us, after: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``cat_b(diag(u_b) W_b diag(γ_b))``; ``after`` (the backward's incoming gradient): each part's smallest
    factor is passed through ``backward_only`` first, so that no part can be computed in the forward."""
    parts = []
    for w, g, u in zip(ws, gs, us):
        if after is not None:
            if g is not None:
                g = backward_only(g, after)
            elif u is not None:
                u = backward_only(u, after)
            else:
                w = backward_only(w, after)
        if g is not None:
            w = w * g[None, :].to(w.dtype)
        if u is not None:
            w = w * u[:, None].to(w.dtype)
        parts.append(w)
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _compute_dtype(x: torch.Tensor, w: torch.Tensor) -> torch.dtype:
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return w.dtype


def _unpack(n: int, layout: tuple, tensors: Sequence[torch.Tensor]) -> tuple[list, list, list]:
    ws, rest = list(tensors[:n]), list(tensors[n:])
    gs = [rest.pop(0) if has_g else None for has_g, _ in layout]
    us = [rest.pop(0) if has_u else None for _, has_u in layout]
    return ws, gs, us


class _ScaledLinear(torch.autograd.Function):
    """``slots[i]``: which of the distinct ``tensors`` is the i-th of (weights, γs, us) in ``layout`` order. A
    tensor read by several branches (one γ shared by q, k, v) is handed over once: Dynamo refuses an
    autograd.Function whose inputs repeat a tensor (a graph break per call), and the backward adds up its
    partial gradients itself (what autograd did for a repeated input)."""

    @staticmethod
    def forward(ctx, x, n: int, layout: tuple, slots: tuple, *tensors):
        ws, gs, us = _unpack(n, layout, [tensors[i] for i in slots])
        weight = _effective_weight(ws, gs, us)
        dtype = _compute_dtype(x, weight)
        ctx.n, ctx.layout, ctx.slots, ctx.dtype, ctx.x_dtype = n, layout, slots, dtype, x.dtype
        ctx.save_for_backward(x, *tensors)
        return F.linear(x.to(dtype), weight.to(dtype))

    @staticmethod
    def backward(ctx, gy):
        x, *tensors = ctx.saved_tensors
        ws, gs, us = _unpack(ctx.n, ctx.layout, [tensors[i] for i in ctx.slots])
        weight = _effective_weight(ws, gs, us, after=gy)  # recomputed: O(weight) work, no saved copy
        gy = gy.to(ctx.dtype)
        gx = gy @ weight.to(ctx.dtype) if ctx.needs_input_grad[0] else None
        g_eff = (gy.reshape(-1, gy.shape[-1]).transpose(0, 1) @ x.reshape(-1, x.shape[-1]).to(ctx.dtype))
        g_eff = g_eff.to(ws[0].dtype)
        gw, gg, gu = [], [], []
        start = 0
        for w, g, u in zip(ws, gs, us):
            ge = g_eff[start : start + w.shape[0]]
            start += w.shape[0]
            cols = g[None, :].to(w.dtype) if g is not None else None
            rows = u[:, None].to(w.dtype) if u is not None else None
            d_w = ge
            if cols is not None:
                d_w = d_w * cols
            if rows is not None:
                d_w = d_w * rows
            gw.append(d_w)
            if g is not None:  # ∂/∂γ_j = Σ_i G_ij W_ij u_i
                t = ge * w if rows is None else ge * w * rows
                gg.append(t.sum(0).to(g.dtype))
            if u is not None:  # ∂/∂u_i = Σ_j G_ij W_ij γ_j
                t = ge * w if cols is None else ge * w * cols
                gu.append(t.sum(1).to(u.dtype))
        grads: list[Optional[torch.Tensor]] = [None] * len(tensors)
        for i, grad in zip(ctx.slots, (*gw, *gg, *gu)):
            grads[i] = grad if grads[i] is None else grads[i] + grad
        return (gx.to(ctx.x_dtype) if gx is not None else None, None, None, None, *grads)


def scaled_linear(
    x: torch.Tensor,
    weights: Sequence[torch.Tensor],
    col_scales: Sequence[Optional[torch.Tensor]],
    row_scales: Sequence[Optional[torch.Tensor]],
) -> torch.Tensor:
    """``x @ cat_b(diag(row_b) W_b diag(col_b))ᵀ`` in one matmul; ``None`` scales are ones."""
    if len(weights) == 1 and col_scales[0] is None and row_scales[0] is None:
        return F.linear(x, weights[0])  # saves the parameter itself: nothing to recompute
    # several maps without scales still go through the function: a concatenated weight would be saved
    layout = tuple((g is not None, u is not None) for g, u in zip(col_scales, row_scales))
    distinct: list[torch.Tensor] = []
    slots = []
    for t in (*weights, *(g for g in col_scales if g is not None), *(u for u in row_scales if u is not None)):
        i = next((j for j, seen in enumerate(distinct) if seen is t), len(distinct))
        if i == len(distinct):
            distinct.append(t)
        slots.append(i)
    return _ScaledLinear.apply(x, len(weights), layout, tuple(slots), *distinct)
