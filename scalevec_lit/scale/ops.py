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
  normalized input by undoing the rotation (orthogonal) and dividing by ``u``. RoPE, ``u`` and their
  inverses are folded into small per-position tables (``_Tables``; their part without ``u`` is built once
  per RoPE buffer, ``_RopeTables``), so that each pass over the activations is one multiply and one
  in-place multiply-add (about a third of the passes of the plain composition's autograd; see
  benchmarks/RESULTS.md). Dividing by ``u`` cannot recover a channel whose ``u_j`` is exactly 0 (its output
  is 0 whatever the input), and that channel's normalized input enters the gradients of ``u_j``, of the
  whole group's input (through the RMS) and so of the rows of W_q/W_k and everything upstream. So when
  some ``u_j`` is exactly 0 (checked once per call on the small ``u``, only when a gradient is wanted: a
  host read of one flag, a synchronization on a GPU) the function also saves the normalized input and its
  backward uses it instead of dividing: exact for every ``u``, at one activation-sized tensor more in that
  case only. Under ``torch.compile`` the check would break the graph, so it is made before the compiled
  block runs and handed in as ``u_has_zero`` (``NormSite.check_u_``, called by ``Transformer.forward`` for
  compiled blocks on CPU, where reading the flag costs nothing); without it (on an accelerator, where the
  read would be a host sync each step) the normalized input is always offered to the backward and the
  compiler's partitioner decides what to keep.

Both stay autograd functions under ``torch.compile`` too: the plain torch composition in their place under
compile was measured (benchmarks/compiled.py, 2026-12-04: inductor, dense and MoE smoke shapes) no faster
within the noise, and ``group_norm_rope``'s made compiled unified save 2 MiB more (1.08× baseline instead
of 1.06×; ``scaled_linear``'s changed nothing).

Second derivatives: ``group_norm_rope`` is twice differentiable inside ``higher_order()`` (its plain
composition) and refuses ``create_graph=True`` outside it; ``scaled_linear`` always is (``higher_order.py``).

Also the rotate-half RoPE (``apply_rope``) that both this module and the model use.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch
import torch.nn.functional as F

from .higher_order import ON as _HIGHER_ORDER
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


# -- group_norm_rope -------------------------------------------------------------------------------------------
def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] → [x2, x1]`` over the last dim (the channel pairs of rotate-half RoPE); small tables only."""
    h = x.shape[-1] // 2
    return torch.cat((x[..., h:], x[..., :h]), -1)


def _inverse(u: torch.Tensor) -> torch.Tensor:
    """``1 / u``, and 0 where ``u`` is exactly 0."""
    return torch.where(u != 0, u.reciprocal(), 0.0)


class _RopeTables(NamedTuple):
    """The position tables of ``RoPE`` and of its inverse, ``[T, 1, g]``, that do not depend on ``u`` (built
    once per cos/sin buffer, length and dtype: ``_rope_tables_for``). With ``swap`` exchanging the halves of
    each group and ``σ±`` being ``±1`` on the first half and ``∓1`` on the second (``rotate(x) = σ₋ ⊙
    swap(x)``): ``RoPE(z) = z ⊙ c + swap(z) ⊙ s``, its transpose ``z ⊙ c + swap(z) ⊙ s_t``, its inverse
    ``z ⊙ pc + swap(z) ⊙ ps``."""

    c: torch.Tensor  # cos
    s: torch.Tensor  # σ₋ ⊙ sin
    s_t: torch.Tensor  # swap(σ₋ ⊙ sin) = σ₊ ⊙ swap(sin)
    pc: torch.Tensor  # cos ⊙ k, k = 1 / (cos² + sin²): 1 up to the tables' rounding, divided out so that the
    ps: torch.Tensor  # s_t ⊙ k                      recovery is exact


_ROPE_TABLES: dict = {}


def _build_rope_tables(cos, sin, T: int, dtype) -> _RopeTables:
    c, s = _rope_tables(cos, sin, T, dtype)  # [T, 1, g]
    h = c.shape[-1] // 2
    sign = torch.ones_like(c)
    sign[..., :h] = -1.0  # σ₋
    s_signed = sign * s
    s_t = _swap_halves(s_signed)  # = σ₊ ⊙ swap(sin)
    k = 1.0 / (c * c + s * s)
    return _RopeTables(c, s_signed, s_t, c * k, s_t * k)


def _rope_tables_for(cos: torch.Tensor, sin: torch.Tensor, T: int, dtype) -> _RopeTables:
    """``_RopeTables`` of the first ``T`` positions, kept for the next call with the same buffers. The entry
    holds ``cos`` and ``sin`` themselves, so their storage cannot be reused by another tensor while it lives;
    an in-place change of either (its version) makes a new entry."""
    if torch.compiler.is_compiling():
        return _build_rope_tables(cos, sin, T, dtype)
    key = (cos.data_ptr(), sin.data_ptr(), cos._version, sin._version, tuple(cos.shape), T, dtype, cos.device)
    hit = _ROPE_TABLES.get(key)
    if hit is None:
        if len(_ROPE_TABLES) >= 16:
            _ROPE_TABLES.pop(next(iter(_ROPE_TABLES)))
        hit = _ROPE_TABLES[key] = (cos, sin, _build_rope_tables(cos, sin, T, dtype))
    return hit[2]


class _Tables(NamedTuple):
    """Small per-call tables (``[T, G, g]`` at most: no batch dimension) that turn ``RoPE(u ⊙ n)`` and each
    step of its backward into one multiply and one multiply-add over the activations (``_pair_mul``):

    - forward: ``y = n ⊙ A + swap(n) ⊙ B`` with ``A = u ⊙ c``, ``B = swap(u) ⊙ s``;
    - the gradient with respect to ``n`` (the transpose): ``gn = gy ⊙ A + swap(gy) ⊙ Bt``, ``Bt = u ⊙ s_t``;
    - the normalized input recovered from the output: ``n = y ⊙ P + swap(y) ⊙ Q`` with ``P = u⁻¹ ⊙ pc``,
      ``Q = u⁻¹ ⊙ ps`` (``u⁻¹ := 0`` where ``u = 0``).

    ``None`` stands for ones (A, P) or zeros (the others): no u, or no RoPE.
    """

    A: Optional[torch.Tensor]
    B: Optional[torch.Tensor]
    P: Optional[torch.Tensor]
    Q: Optional[torch.Tensor]
    Bt: Optional[torch.Tensor]
    inv_u: Optional[torch.Tensor]


def _norm_rope_tables(u, cos, sin, T: int, dtype, backward: bool) -> _Tables:
    uc = None if u is None else u.to(dtype)
    inv_u = None if (uc is None or not backward) else _inverse(uc)
    if cos is None:
        return _Tables(uc, None, inv_u, None, None, inv_u)
    r = _rope_tables_for(cos, sin, T, dtype)
    if uc is None:
        return _Tables(r.c, r.s, r.pc, r.ps, r.s_t, None)
    if not backward:
        return _Tables(r.c * uc, r.s * _swap_halves(uc), None, None, None, None)
    return _Tables(r.c * uc, None, r.pc * inv_u, r.ps * inv_u, r.s_t * uc, inv_u)


def _pair_mul(x: torch.Tensor, a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> torch.Tensor:
    """``x ⊙ a + swap(x) ⊙ b`` (``a`` None: ones; ``b`` None: zeros): the swapped term is added half by half
    in place, so the activations are never copied to swap them."""
    if b is None:
        return x if a is None else x * a
    out = x.clone() if a is None else x * a
    h = x.shape[-1] // 2
    out[..., :h].addcmul_(x[..., h:], b[..., :h])
    out[..., h:].addcmul_(x[..., :h], b[..., h:])
    return out


def _compute_dtype_of(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


class _GroupNormRope(torch.autograd.Function):
    """Saves the output (attention keeps q and k anyway) and the per-group reciprocal RMS; the backward
    recovers the normalized input from the output with ``_Tables`` (recomputed, never saved). With some
    ``u_j`` exactly 0 it saves the normalized input too and differentiates from it
    (``_backward_from_input``)."""

    @staticmethod
    def forward(ctx, a, u, cos, sin, eps: float, u_has_zero: Optional[bool] = None):
        # a: [B, T, G, g]; u: [G, g] or None; cos/sin: [≥T, g] tables or None
        compute = _compute_dtype_of(a)
        n, rstd = _rms_norm_with_rstd(a, eps)
        t = _norm_rope_tables(u, cos, sin, a.shape[1], compute, backward=False)
        y = _pair_mul(n.to(compute), t.A, t.B).to(a.dtype)
        ctx.dtype = a.dtype
        # a channel with u_j = 0 cannot be recovered from y: keep the normalized input itself then. The check
        # reads a value on the host, so it is made only for CPU tensors (free there); on an accelerator (a host
        # sync per layer) and under torch.compile (a graph break) the normalized input is kept unless the
        # caller made the check beforehand (``u_has_zero``; under compile the partitioner decides the rest)
        if u_has_zero is None:
            u_has_zero = torch.compiler.is_compiling() or u is None or u.device.type != "cpu" or not bool(u.all())
        keep_n = u is not None and any(ctx.needs_input_grad[:2]) and u_has_zero
        ctx.save_for_backward(y, rstd, u, cos, sin, n if keep_n else None)
        return y

    @staticmethod
    def backward(ctx, gy):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():  # create_graph=True: not ours to give
            raise RuntimeError(
                "group_norm_rope: a second derivative (create_graph=True) was requested through a forward made "
                "outside scalevec_lit.scale.ops.higher_order(); its fused backward is not twice differentiable. "
                "Run the forward inside `with higher_order():` (the plain torch composition), as "
                "scalevec_lit.callbacks.SharpnessMonitor does")
        y, rstd, u, cos, sin, n = ctx.saved_tensors
        if n is not None:
            return (*_backward_from_input(ctx, gy, n, rstd, u, cos, sin), None)
        compute = _compute_dtype_of(y)
        t = _norm_rope_tables(u, cos, sin, y.shape[1], compute, backward=True)
        y, gy = y.to(compute), gy.to(compute)
        P, Q = (None if v is None else backward_only(v, gy) for v in (t.P, t.Q))
        n = _pair_mul(y, P, Q)  # the normalized input, recovered (exact where u ≠ 0)
        gn = _pair_mul(gy, t.A, t.Bt)
        m = gn * n
        gu = None
        if u is not None:  # ∂L/∂u = Σ_{B,T} ∂L/∂(u ⊙ n) ⊙ n = Σ gn ⊙ n / u (here no u_j is 0)
            gu = (m.sum(dim=tuple(range(m.ndim - 2))) * t.inv_u).to(u.dtype)
        ga = torch.addcmul(gn, n, m.mean(-1, keepdim=True), value=-1.0).mul_(rstd.to(compute))
        return ga.to(ctx.dtype), gu, None, None, None, None


def _backward_from_input(ctx, gy, n, rstd, u, cos, sin):
    """The backward from the saved normalized input ``n`` (some ``u_j`` exactly 0): ``gz = RoPEᵀ(gy)``,
    ``∂L/∂u = Σ gz ⊙ n``, ``gn = gz ⊙ u``, ``∂L/∂a = (gn − n · mean(gn ⊙ n)) / RMS(a)``; nothing divides."""
    compute = _compute_dtype_of(n)
    n, gy = n.to(compute), gy.to(compute)
    if cos is None:
        gz = gy
    else:
        r = _rope_tables_for(cos, sin, n.shape[1], compute)
        gz = _pair_mul(gy, r.c, r.s_t)
    gu = (gz * n).sum(dim=tuple(range(n.ndim - 2))).to(u.dtype)
    gn = gz * u.to(compute)
    ga = torch.addcmul(gn, n, (gn * n).mean(-1, keepdim=True), value=-1.0).mul_(rstd.to(compute))
    return ga.to(ctx.dtype), gu, None, None, None


def _rms_norm_with_rstd(a: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a / RMS(a), 1 / RMS(a))`` over the last dim, in one fused kernel where torch has it (the reciprocal
    RMS in float32 for half inputs)."""
    fused = getattr(torch.ops.aten, "_fused_rms_norm", None)
    if fused is not None:
        n, rstd = fused(a, [a.shape[-1]], None, eps)
        return n, rstd
    af = a.float() if a.dtype in (torch.float16, torch.bfloat16) else a
    rstd = torch.rsqrt(af.pow(2).mean(-1, keepdim=True) + eps)
    return (af * rstd).to(a.dtype), rstd


def group_norm_rope(
    a: torch.Tensor,
    u: Optional[torch.Tensor],
    eps: float,
    cos: Optional[torch.Tensor] = None,
    sin: Optional[torch.Tensor] = None,
    u_has_zero: Optional[bool] = None,
) -> torch.Tensor:
    """``RoPE(u ⊙ a / RMS(a))`` over the last dim of ``a`` ``[B, T, G, g]``; ``u`` is ``[G, g]`` or None,
    RoPE only when ``cos``/``sin`` are given. ``u_has_zero``: whether some ``u_j`` is exactly 0, when the
    caller knows it (``None``: checked here where that is free, else assumed; see the module doc). A
    ``False`` given for a ``u`` with a zero makes that channel's gradients wrong: only a check of this very
    ``u`` may give it."""
    if _HIGHER_ORDER[0]:
        return _group_norm_rope_plain(a, u, cos, sin, eps)
    return _GroupNormRope.apply(a, u, cos, sin, eps, u_has_zero)


def _group_norm_rope_plain(a, u, cos, sin, eps: float) -> torch.Tensor:
    """The same function as ``_GroupNormRope`` in plain torch ops (twice differentiable; ``higher_order()``)."""
    compute = _compute_dtype_of(a)
    z = rms_norm(a.to(compute), eps)
    if u is not None:
        z = z * u.to(compute)
    if cos is not None:
        z = apply_rope(z, cos, sin)
    return z.to(a.dtype)
