"""The two fused operations behind every scale site, each an exact autograd function that saves no
activation beyond what its neighbours save anyway.

- ``scaled_linear(x, weights, col_scales, row_scales)``: ``x @ cat_b(diag(u_b) W_b diag(γ_b))ᵀ`` — all
  consumer maps of one normalized input in one matmul, the input-side scales γ (and un-normalized
  output-side scales u) applied to the *weights*, never to the ``B×T×d`` activations. The effective weight
  is recomputed in the backward instead of being saved: the function saves ``x`` and the parameters only.
- ``group_norm_rope(a, u, cos, sin, eps)``: ``RoPE(u ⊙ a / RMS_group(a))`` — the per-head (or whole-output)
  RMS normalization of a placement with a normalized output side, its output scale and, for q and k,
  the rotary embedding, over q and k together. It saves only its *output* (which attention or the MLP
  saves anyway, so it costs no memory) and the per-group reciprocal RMS; the backward recovers the
  normalized input by undoing the rotation (orthogonal) and dividing by ``u``. This is exact wherever
  ``u_j ≠ 0``; a channel whose ``u_j`` is exactly 0 passes no gradient to ``u_j`` (documented in
  the README; no shipped parameterization starts there and nothing decays output-role scales).

Also the rotate-half RoPE (``apply_rope``) that both this module and the model use.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, eps: float, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Parameter-free RMS normalization over the last dim (optionally times ``weight``)."""
    return F.rms_norm(x, (x.shape[-1],), weight=weight, eps=eps)


# -- RoPE (rotate-half convention, as Llama/Qwen checkpoints in transformers) --------------------------------
def _rotate(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_t(x: torch.Tensor) -> torch.Tensor:
    """The transpose of ``_rotate`` (its inverse)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor, T: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return cos[:T, None, :].to(dtype), sin[:T, None, :].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[B, T, H, D]`` by position; cos/sin are ``[≥T, D]``."""
    c, s = _rope_tables(cos, sin, x.shape[1], x.dtype)
    return x * c + _rotate(x) * s


def _unrope(y: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The transpose of RoPE (its inverse: each channel pair is rotated by an angle)."""
    return y * c + _rotate_t(y * s)


# -- scaled_linear -------------------------------------------------------------------------------------------
def _effective_weight(ws, gs, us) -> torch.Tensor:
    parts = []
    for w, g, u in zip(ws, gs, us):
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


class _ScaledLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n: int, layout: tuple, *tensors):
        ws, rest = list(tensors[:n]), list(tensors[n:])
        gs = [rest.pop(0) if has_g else None for has_g, _ in layout]
        us = [rest.pop(0) if has_u else None for _, has_u in layout]
        weight = _effective_weight(ws, gs, us)
        dtype = _compute_dtype(x, weight)
        ctx.n, ctx.layout, ctx.dtype, ctx.x_dtype = n, layout, dtype, x.dtype
        ctx.save_for_backward(x, *tensors)
        return F.linear(x.to(dtype), weight.to(dtype))

    @staticmethod
    def backward(ctx, gy):
        x, *tensors = ctx.saved_tensors
        n, layout = ctx.n, ctx.layout
        ws, rest = tensors[:n], list(tensors[n:])
        gs = [rest.pop(0) if has_g else None for has_g, _ in layout]
        us = [rest.pop(0) if has_u else None for _, has_u in layout]
        weight = _effective_weight(ws, gs, us)  # recomputed: O(weight) work, no saved copy
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
        return (gx.to(ctx.x_dtype) if gx is not None else None, None, None, *gw, *gg, *gu)


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
    tensors = [*weights, *(g for g in col_scales if g is not None), *(u for u in row_scales if u is not None)]
    return _ScaledLinear.apply(x, len(weights), layout, *tensors)


# -- group_norm_rope -------------------------------------------------------------------------------------------
class _GroupNormRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, u, cos, sin, eps: float):
        # a: [B, T, G, g]; u: [G, g] or None; cos/sin: [T, g] tables or None
        af = a.float() if a.dtype in (torch.float16, torch.bfloat16) else a
        rstd = torch.rsqrt(af.pow(2).mean(-1, keepdim=True) + eps)
        z = (af * rstd).to(a.dtype)
        if u is not None:
            z = z * u.to(z.dtype)
        rope = cos is not None
        if rope:
            c, s = _rope_tables(cos, sin, a.shape[1], z.dtype)
            z = z * c + _rotate(z) * s
        ctx.eps, ctx.rope, ctx.has_u = eps, rope, u is not None
        ctx.save_for_backward(z, rstd, u, cos if rope else None, sin if rope else None)
        return z

    @staticmethod
    def backward(ctx, gy):
        y, rstd, u, cos, sin = ctx.saved_tensors
        if ctx.rope:
            c, s = _rope_tables(cos, sin, y.shape[1], y.dtype)
            # RᵀR = (cos² + sin²) I per channel pair, 1 up to the tables' rounding: divided out exactly
            gz, z = _unrope(gy, c, s), _unrope(y, c, s) / (c * c + s * s)
        else:
            gz, z = gy, y
        compute = torch.float32 if z.dtype in (torch.float16, torch.bfloat16) else z.dtype
        gz, z = gz.to(compute), z.to(compute)
        gu = None
        if ctx.has_u:
            uc = u.to(compute)
            n = torch.where(uc != 0, z / torch.where(uc != 0, uc, torch.ones_like(uc)), torch.zeros_like(z))
            gu = (gz * n).sum(dim=tuple(range(gz.ndim - 2))).to(u.dtype)
            gn = gz * uc
        else:
            n, gn = z, gz
        ga = rstd * (gn - n * (gn * n).mean(-1, keepdim=True))
        return ga.to(y.dtype), gu, None, None, None


def group_norm_rope(
    a: torch.Tensor,
    u: Optional[torch.Tensor],
    eps: float,
    cos: Optional[torch.Tensor] = None,
    sin: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``RoPE(u ⊙ a / RMS(a))`` over the last dim of ``a`` ``[B, T, G, g]``; ``u`` is ``[G, g]`` or None,
    RoPE only when ``cos``/``sin`` are given."""
    return _GroupNormRope.apply(a, u, cos, sin, eps)
